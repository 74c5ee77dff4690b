"""The predictor held against what real engines logged on real GPUs.

CUDA, XPU and ROCm engines cannot run on the rig's machines, so the only ground truth for
those platforms is what engines logged in public threads: "Setting attention block size
to N tokens ..." and "Padding mamba page size by X% ...". Each row below is one such log
with the checkpoint's config (copied in tests/unit/checkpoints.py, each value with where
it was read) and the settings the log states; the predictor must give the logged size and
the logged padding, to vLLM's two decimals, or no padding line where the log has none.

Where a row's config or settings were not public in full, the comment says which value
is inferred and from what; no value is chosen to make a row pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvrig.rules import predict

from ..checkpoints import (
    GRANITE_4H_SMALL,
    NEMOTRON3_NANO_4B,
    NEMOTRON3_NANO_30B,
    QWEN3_NEXT_80B,
    QWEN35_4B,
    QWEN35_27B,
    QWEN36_35B,
)


@dataclass(frozen=True)
class Logged:
    """One published engine log: what ran, with which settings, and what vLLM said."""

    name: str
    where: str  # the hardware, backend, and the thread the log is from
    config: dict[str, Any]
    settings: predict.Settings
    size: int
    padding: str | None  # as logged ("1.49%"), None: the log has no padding line
    # False where only the size line was published: the padding is then not checked.
    padding_quoted: bool = True


ROWS = [
    Logged(
        "Qwen3-Next-80B-A3B-Instruct",
        "2x H200, FLASH_ATTN, bf16, TP 2, prefix caching off (public vLLM thread)",
        QWEN3_NEXT_80B,
        predict.Settings("cuda", "0.10.2", "FLASH_ATTN", tp=2, prefix_caching=False),
        544,
        "1.49%",
    ),
    Logged(
        "Qwen3-Next-80B-A3B (WNA16 quantization)",
        "2x L40S, FLASHINFER, bf16 with an fp8 KV cache, TP 2, prefix caching off",
        QWEN3_NEXT_80B,
        predict.Settings(
            "cuda", "0.13.0", "FLASHINFER", tp=2, kv_cache_dtype="fp8", prefix_caching=False
        ),
        1072,
        None,
    ),
    Logged(
        "Qwen/Qwen3.5-4B",
        "A100/H20, bf16, --enable-prefix-caching (vllm-project/vllm#40696)",
        QWEN35_4B,
        predict.Settings("cuda", "0.19.1", dtype="bfloat16", prefix_caching=True),
        528,
        None,
        padding_quoted=False,  # the thread quotes the size line only
    ),
    Logged(
        "Qwen/Qwen3.6-35B-A3B",
        # The log is from Platform._align_hybrid_block_size (interface.py), so a release
        # after the step moved there and, at 528, before 0.33.0's checkpoint term could
        # apply; 0.32.0 is the newest such release kvrig restates.
        "CUDA, TP 4, other settings vLLM's defaults (public thread)",
        QWEN36_35B,
        predict.Settings("cuda", "0.32.0", tp=4),
        528,
        None,
        padding_quoted=False,  # the size line only was published
    ),
    Logged(
        "Qwen3.6-35B-A3B (quantized) with MTP",
        # TP is not stated in the log; one rank is what a single-GPU quantized 35B runs at.
        "CUDA, FLASH_ATTN, num_speculative_tokens 3, prefix caching on (align)",
        QWEN36_35B,
        predict.Settings(
            "cuda", "0.22.0", "FLASH_ATTN", prefix_caching=True, num_speculative_tokens=3
        ),
        1072,
        None,
    ),
    Logged(
        "Qwen3.5-27B (W4A16)",
        "CUDA, FLASH_ATTN, bf16, prefix caching off",
        QWEN35_27B,
        predict.Settings("cuda", "0.19.1", "FLASH_ATTN", dtype="bfloat16", prefix_caching=False),
        784,
        "0.13%",
    ),
    Logged(
        "ibm-granite/granite-4.0-h-small",
        "ROCm, ROCM_ATTN, bf16, prefix caching off (public ROCm thread)",
        GRANITE_4H_SMALL,
        predict.Settings("rocm", "0.11.1rc6", "ROCM_ATTN", prefix_caching=False),
        528,
        "0.69%",
    ),
    Logged(
        "Nemotron-Cascade-2-30B-A3B (NVFP4)",
        "CUDA, FLASHINFER, fp8 KV cache, --mamba-ssm-cache-dtype float32, prefix caching off",
        NEMOTRON3_NANO_30B,
        predict.Settings(
            "cuda",
            "0.19.0",
            "FLASHINFER",
            kv_cache_dtype="fp8",
            mamba_ssm_cache_dtype="float32",
            prefix_caching=False,
        ),
        4176,
        "0.19%",
    ),
    Logged(
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8",
        # vLLM logged "Updating mamba_ssm_cache_dtype to 'float16' for NemotronH model"; the
        # log states no prefix-caching flag, and its size is the one without (inferred: kvrig
        # restates no Mamba2 align mode before 0.32.0, and predict refuses to guess it).
        "GB10 (SM12.1), FLASHINFER, fp8 KV cache, SSM dtype auto",
        NEMOTRON3_NANO_4B,
        predict.Settings(
            "cuda",
            "0.13.0",
            "FLASHINFER",
            kv_cache_dtype="fp8",
            gpu_arch="12.1",
            prefix_caching=False,
        ),
        992,
        "0.35%",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_predictor_reproduces_the_logged_size_and_padding(row: Logged) -> None:
    out = predict.predict(row.config, row.settings)
    assert out.block_size == row.size, out.steps
    size_line = f"Setting attention block size to {row.size} tokens"
    assert any(line.startswith(size_line) for line in out.log), out.log
    padding = [line for line in out.log if line.startswith("Padding mamba page size by")]
    if not row.padding_quoted:
        return
    if row.padding is None:
        assert padding == [], out.log
    else:
        assert padding == [
            f"Padding mamba page size by {row.padding} to ensure that mamba page size and"
            " attention page size are exactly equal."
        ]
        assert f"{out.padding_pct:.2f}%" == row.padding


def test_tensor_parallelism_is_what_moves_qwen36_from_1056_to_528() -> None:
    """The row that per-rank KV heads decide: one rank gives 1056."""
    one = predict.predict(QWEN36_35B, predict.Settings("cuda", "0.32.0"))
    assert one.block_size == 1056
