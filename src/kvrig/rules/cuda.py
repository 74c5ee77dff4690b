"""CUDA's attention backend per architecture, as vLLM's CudaPlatform picks it.

The backend a CUDA GPU picks decides no block size for these models (FLASH_ATTN's
MultipleOf(16) and FLASHINFER's 16, 32, 64 accept the same sizes and share the smallest),
but it decides the kernel block the worker splits a block into (kvrig.rules.backends.
kernel_block_size): FLASHINFER declares plain sizes, so a 144-token block runs in kernel
blocks of 16 where FLASH_ATTN takes 144 whole. A release diff reads both, so the rules
pick the backend as vLLM does: FLASHINFER first on SM10.x, FLASH_ATTN first elsewhere
unless the KV-cache dtype is one FlashAttention cannot read on that GPU.

Pure: a compute capability and a KV-cache dtype in, a backend out.
"""

from __future__ import annotations

from kvrig.rules import choices
from kvrig.rules.backends import Backend, Kernel

FLASH_ATTN = Backend("FLASH_ATTN", (Kernel(16, True),))
# FlashInferBackend.get_supported_kernel_block_sizes: 16, 32, 64; on SM10.x with
# trtllm-gen serving grouped-query attention it adds 128 to 1024 (not restated: the
# emulated columns see 16, 32, 64, and the block sizes of these models do not depend on it).
FLASHINFER = Backend("FLASHINFER", (Kernel(16), Kernel(32), Kernel(64)))
# FlashAttention reads a quantized KV cache with FA3 on SM9.x only, and never e5m2
# (vllm/v1/attention/backends/fa_utils.py: flash_attn_supports_kv_cache_dtype; FA4 on
# SM10.x too, where FLASHINFER comes first anyway).
FA3_KV_DTYPES = ("fp8", "fp8_e4m3")


def default_backend(gpu_arch: str | None, kv_cache_dtype: str | None = None) -> Backend:
    """The attention backend CudaPlatform.get_valid_backends puts first for a causal
    decoder (vllm/platforms/cuda.py: _get_backend_priorities): FLASHINFER on SM10.x;
    elsewhere FLASH_ATTN, unless the KV cache is quantized in a way FA cannot read there.
    Without an architecture, FLASH_ATTN (the block size does not depend on it)."""
    quantized = kv_cache_dtype not in (None, "auto", "float16", "bfloat16")
    if gpu_arch is None:
        return FLASHINFER if kv_cache_dtype == "fp8_e5m2" else FLASH_ATTN
    major, _ = choices.compute_capability(gpu_arch)
    if major == 10:
        return FLASHINFER
    if quantized and not (major == 9 and kv_cache_dtype in FA3_KV_DTYPES):
        return FLASHINFER
    return FLASH_ATTN
