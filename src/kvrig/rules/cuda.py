"""CUDA's attention backend per architecture, as vLLM's CudaPlatform picks it.

The backend decides no block size for these models (FLASH_ATTN's MultipleOf(16) and
FLASHINFER's 16, 32, 64 share the smallest), but it decides the kernel block the worker
splits a block into (kvrig.rules.backends.kernel_block_size): a 144-token block runs in
kernel blocks of 16 on FLASHINFER and whole on FLASH_ATTN. So the rules pick it as vLLM
does.

Pure: a compute capability and a KV-cache dtype in, a backend out.
"""

from __future__ import annotations

from kvrig.facts.backends import Backend, backend
from kvrig.rules import choices

FLASH_ATTN = backend("cuda", "FLASH_ATTN")
FLASHINFER = backend("cuda", "FLASHINFER")
# FlashAttention reads a quantized KV cache with FA3 on SM9.x only, and never e5m2
# (vllm/v1/attention/backends/fa_utils.py: flash_attn_supports_kv_cache_dtype; FA4 on
# SM10.x too, where FLASHINFER comes first anyway).
FA3_KV_DTYPES = ("fp8", "fp8_e4m3")


TURBOQUANT = backend("cuda", "TURBOQUANT")


def default_backend(gpu_arch: str | None, kv_cache_dtype: str | None = None) -> Backend:
    """The attention backend CudaPlatform.get_valid_backends puts first for a causal
    decoder (vllm/platforms/cuda.py: _get_backend_priorities): FLASHINFER on SM10.x;
    elsewhere FLASH_ATTN, unless the KV cache is quantized in a way FA cannot read there;
    TURBOQUANT for its own caches. Without an architecture, FLASH_ATTN unless the cache is
    e5m2, which FA reads on no GPU (the block size does not depend on it)."""
    if (kv_cache_dtype or "").startswith("turboquant_"):
        return TURBOQUANT
    quantized = kv_cache_dtype not in (None, "auto", "float16", "bfloat16")
    if gpu_arch is None:
        return FLASHINFER if kv_cache_dtype == "fp8_e5m2" else FLASH_ATTN
    major, _ = choices.compute_capability(gpu_arch)
    if major == 10:
        return FLASHINFER
    if quantized and not (major == 9 and kv_cache_dtype in FA3_KV_DTYPES):
        return FLASHINFER
    return FLASH_ATTN


# The dense MLA backends CudaPlatform's selector meets for DeepSeek-V3-shaped latent
# layers, and the compute capabilities each declares valid.
FLASHINFER_MLA = backend("cuda", "FLASHINFER_MLA")
CUTLASS_MLA = backend("cuda", "CUTLASS_MLA")
FLASH_ATTN_MLA = backend("cuda", "FLASH_ATTN_MLA")
FLASHMLA = backend("cuda", "FLASHMLA")
TRITON_MLA = backend("cuda", "TRITON_MLA")
_MLA_MAJORS: dict[str, tuple[int, ...] | None] = {
    "FLASHINFER_MLA": (10,),
    "CUTLASS_MLA": (10,),
    "FLASH_ATTN_MLA": (9,),
    "FLASHMLA": (9, 10),
    "TRITON_MLA": None,  # Triton: any GPU kvrig keeps rules for
}


def mla_order(major: int) -> tuple[Backend, ...]:
    """CudaPlatform._get_backend_priorities for MLA layers (vllm/platforms/cuda.py), the
    dense backends only (TOKENSPEED_MLA takes R1 dims with an fp8 cache only)."""
    if major == 10:
        return (FLASHINFER_MLA, CUTLASS_MLA, FLASH_ATTN_MLA, FLASHMLA, TRITON_MLA)
    if major == 12:
        return (TRITON_MLA,)
    return (FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, TRITON_MLA)


def mla_backend(gpu_arch: str | None, user_block_size: int | None = None) -> Backend:
    """The dense MLA backend the selector picks: the first of the list valid on the GPU
    that accepts the user's --block-size (a size a preferred backend rejects swaps in a
    later one: 16 on SM10.x runs TRITON_MLA). Without an architecture, Hopper's."""
    major = choices.compute_capability(gpu_arch)[0] if gpu_arch else 9
    for choice in mla_order(major):
        majors = _MLA_MAJORS[choice.name]
        if majors is not None and major not in majors:
            continue
        if user_block_size is None or choice.supports(user_block_size):
            return choice
    return TRITON_MLA
