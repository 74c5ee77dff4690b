"""An attention backend as vLLM's block-size code sees it, and the worker's kernel block.

vLLM decides a block size from four things a backend class declares: its kernel block
sizes (`get_supported_kernel_block_sizes()`), which sizes it accepts
(`supports_block_size()`), the start it prefers (`get_preferred_block_size()`) and its
name in the early check's message (`get_name()`). The verdicts (kvrig.rules.blocksize),
the predictor and each platform's table (kvrig.rules.rocm for ROCm) restate backends as
these values, so this module sits below all of them.

Pure: sizes in, sizes out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Kernel:
    """One entry of get_supported_kernel_block_sizes(): an int, or MultipleOf(size)."""

    size: int
    multiple: bool = False


@dataclass(frozen=True)
class Backend:
    """A backend as the block-size code sees it: its kernel sizes, and whether its
    supports_block_size() is overridden to accept only those exact sizes."""

    name: str
    kernels: tuple[Kernel, ...]
    exact: bool = False
    # A backend whose get_preferred_block_size() returns at least this (XPU's FLASH_ATTN:
    # 64); crafted subclasses inherit it from the backend they extend.
    preferred_floor: int | None = None
    # A backend whose get_preferred_block_size() returns this whatever the start (ROCm's
    # ROCM_AITER_UNIFIED_ATTN: 64; ROCM_ATTN from vLLM 0.34.0: 16); inherited likewise.
    preferred_fixed: int | None = None

    @property
    def smallest(self) -> int:
        """The smallest declared size; 1 for a backend declaring none, as phase 1 counts it."""
        return min((k.size for k in self.kernels), default=1)

    def supports(self, block_size: int) -> bool:
        """AttentionBackend.supports_block_size: an int or MultipleOf accepts multiples, and
        a backend declaring no sizes accepts any."""
        if not self.kernels and not self.exact:
            return True
        if self.exact:
            return block_size in {k.size for k in self.kernels}
        return any(block_size % k.size == 0 for k in self.kernels)

    def kernel_takes(self, size: int) -> bool:
        """Whether a kernel block of `size` runs: a plain size exactly, MultipleOf any
        multiple (the worker's _block_size_is_supported)."""
        return any(size % k.size == 0 if k.multiple else size == k.size for k in self.kernels)

    def preferred(self, default: int) -> int:
        """get_preferred_block_size: the default if supported, else the smallest size."""
        if self.preferred_fixed is not None:
            return self.preferred_fixed
        if self.preferred_floor is not None:
            return max(default, self.preferred_floor)
        return default if self.supports(default) else self.smallest


@dataclass(frozen=True)
class PlatformRules:
    """The per-platform backends the size depends on (vllm-blocksize-facts.md, section 6);
    what changed between releases is in kvrig.rules.versions."""

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
    # release (ROCm); kvrig.rules.blocksize.SELECTABLE holds the fixed ones elsewhere.
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
