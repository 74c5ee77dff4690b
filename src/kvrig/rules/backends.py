"""The backends a platform gives a model's layers, and the worker's kernel block.

vLLM decides a block size from four things a backend class declares (kvrig.facts.backends
keeps them per backend); which backends meet in one model is the platform's choice, and
the kernel block the worker splits a block into is theirs together. The verdicts
(kvrig.rules.blocksize), the predictor and each platform's rules read both here.

Pure: sizes in, sizes out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvrig.facts.backends import Backend, Kernel

__all__ = ["Backend", "Kernel", "NoCommonKernelBlock", "PlatformRules", "kernel_block_size"]


@dataclass(frozen=True)
class PlatformRules:
    """The per-platform backends the size depends on; what changed between releases is in
    kvrig.rules.versions."""

    default: Backend  # the attention backend the platform picks for these models
    # Whether these rules were confirmed by real engines (on CPU by the column itself, on
    # CUDA and ROCm by published engine logs, docs/matrix.md "Where the rules come from"):
    # on an unconfirmed platform a mismatch is reported beside the verdict instead of failing.
    measured: bool = False
    mla: Backend | None = None  # a sparse-MLA (DSA) layer's
    indexer: Backend | None = None
    # A dense MLA layer's (DeepSeek-V3, Kimi-Linear's latent layers).
    dense_mla: Backend | None = None
    # Backends a case may name (--attention-backend) where they depend on the GPU and the
    # release (ROCm); elsewhere kvrig.facts.backends.nameable answers.
    selectable: Mapping[str, Backend] = field(default_factory=dict)


class NoCommonKernelBlock(ValueError):
    """The worker finds no kernel block size for the block (vLLM's late error)."""


def kernel_block_size(block_size: int, backends: Sequence[Backend], *, whole: bool = False) -> int:
    """The kernel block one KV-cache group's backends split a block into, as the worker
    picks it (vllm/v1/worker/utils.py: select_common_block_size): the block itself when
    every backend's kernels take it, else the largest plain size of theirs that divides
    it and every backend's kernels take; none is the late error, raised as vLLM words it.
    The worker reads a plain size as that size exactly (_block_size_is_supported), not as
    supports_block_size() does: FLASHINFER accepts a 144-token block and runs it in
    kernel blocks of 16. Under a block-outermost KV-cache layout (`whole`) other layers'
    pages sit between a layer's blocks, so the worker never splits them."""
    if whole or all(b.kernel_takes(block_size) for b in backends):
        return block_size
    fits = {
        k.size for b in backends for k in b.kernels if not k.multiple and block_size % k.size == 0
    }
    for size in sorted(fits, reverse=True):
        if all(b.kernel_takes(size) for b in backends):
            return size
    raise NoCommonKernelBlock(f"No common block size for {block_size}")
