"""CUDA's backend per architecture and KV-cache dtype, and the worker's kernel block, as
vLLM 0.33.0 and 0.34.0 chose them in the emulated columns (results/cuda-sm*-emulated:
the records' layer_backends and kv_cache_groups)."""

from __future__ import annotations

import pytest

from kvrig.rules import backends, cuda

# (compute capability, KV-cache dtype, the backend vLLM chose)
CHOSEN = [
    ("8.0", None, "FLASH_ATTN"),
    ("8.6", None, "FLASH_ATTN"),
    ("8.9", None, "FLASH_ATTN"),
    ("9.0", None, "FLASH_ATTN"),
    ("12.0", None, "FLASH_ATTN"),
    ("10.0", None, "FLASHINFER"),
    ("8.0", "fp8", "FLASHINFER"),
    ("8.6", "fp8", "FLASHINFER"),
    ("8.9", "fp8", "FLASHINFER"),
    ("12.0", "fp8", "FLASHINFER"),
    ("9.0", "fp8", "FLASH_ATTN"),
    ("10.0", "fp8", "FLASHINFER"),
]


@pytest.mark.parametrize(("arch", "kv_cache_dtype", "chosen"), CHOSEN)
def test_the_default_backend_is_the_one_vllm_chose(
    arch: str, kv_cache_dtype: str | None, chosen: str
) -> None:
    assert cuda.default_backend(arch, kv_cache_dtype).name == chosen


def test_fa3_never_reads_an_e5m2_cache() -> None:
    assert cuda.default_backend("9.0", "fp8_e5m2") is cuda.FLASHINFER
    assert cuda.default_backend(None, "fp8_e5m2") is cuda.FLASHINFER
    assert cuda.default_backend(None, "fp8") is cuda.FLASH_ATTN


# (block, FLASHINFER's kernel block, as the sm100 records show it)
FLASHINFER_SPLITS = [(144, 16), (192, 64), (800, 32), (832, 64), (128, 64), (64, 64), (48, 16)]


@pytest.mark.parametrize(("block", "kernel"), FLASHINFER_SPLITS)
def test_the_worker_reads_flashinfer_s_sizes_exactly(block: int, kernel: int) -> None:
    # supports_block_size() accepts every one of these blocks; the worker does not.
    assert cuda.FLASHINFER.supports(block)
    assert backends.kernel_block_size(block, [cuda.FLASHINFER]) == kernel


def test_flash_attn_takes_any_multiple_of_16_whole() -> None:
    assert backends.kernel_block_size(144, [cuda.FLASH_ATTN]) == 144
    assert backends.kernel_block_size(144, [cuda.FLASH_ATTN, cuda.FLASHINFER]) == 16


def test_a_block_outermost_layout_keeps_every_block_whole() -> None:
    # Other layers' pages sit between a layer's blocks: nothing is split, nothing refused.
    assert backends.kernel_block_size(192, [cuda.FLASHINFER], whole=True) == 192
    odd = backends.Backend("ODD", (backends.Kernel(24),))
    assert backends.kernel_block_size(48, [cuda.FLASH_ATTN, odd], whole=True) == 48


def test_no_common_kernel_block_is_the_late_error() -> None:
    odd = backends.Backend("ODD", (backends.Kernel(24),))
    with pytest.raises(backends.NoCommonKernelBlock, match="No common block size for 48"):
        backends.kernel_block_size(48, [cuda.FLASH_ATTN, odd])


# (compute capability, the user's block size, the dense MLA backend vLLM chose for
# DeepSeek-V3's latent layers: results/cuda-sm*-emulated, deepseek_v3 cells)
MLA_CHOSEN = [
    ("8.0", None, "TRITON_MLA"),
    ("9.0", None, "FLASH_ATTN_MLA"),
    ("9.0", 16, "FLASH_ATTN_MLA"),
    ("10.0", None, "FLASHINFER_MLA"),
    # FLASHINFER_MLA [32, 64], CUTLASS_MLA [128] and FLASHMLA [64] take no 16.
    ("10.0", 16, "TRITON_MLA"),
    ("12.0", None, "TRITON_MLA"),
]


@pytest.mark.parametrize(("arch", "block", "chosen"), MLA_CHOSEN)
def test_the_mla_backend_is_the_one_vllm_chose(arch: str, block: int | None, chosen: str) -> None:
    assert cuda.mla_backend(arch, block).name == chosen


def test_a_turboquant_cache_takes_its_own_backend() -> None:
    assert cuda.default_backend("9.0", "turboquant_4bit_nc") is cuda.TURBOQUANT
    assert cuda.default_backend("10.0", "turboquant_k8v4") is cuda.TURBOQUANT
