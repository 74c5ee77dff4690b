"""vLLM's model classes as kvrig restates them, one record per architecture: the family of
layers it builds, where its attention module sits, which config fields its state reads,
and the vLLM module that holds it.

The matrix's loader, the config checks, the shape rules, kvrig's plugin and the emulated
parents each read an architecture; one record keeps a config read the same by all.

Pure: names in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Family(str, Enum):
    """The kind of layers an architecture builds, which decides the rules its cells are
    judged by. A str whose value is the family's name in matrix.yaml, so a family written
    to a record, a results row or JSON stays the same text ("gdn")."""

    HYBRID_MAMBA = "hybrid_mamba"
    GDN = "gdn"
    DSA = "dsa"
    DENSE = "dense"
    # Multi-head latent attention alone (DeepSeek-V3): one latent "head" per token.
    MLA = "mla"
    # A small short-convolution state beside attention (LFM2): its page fits a block.
    SHORT_CONV = "short_conv"
    # MLA beside Kimi delta attention (Kimi-Linear): an MLA page aligned to a state.
    HYBRID_MLA = "hybrid_mla"
    # Mamba2 layers and no attention: nothing for a block size to align.
    MAMBA = "mamba"

    def __str__(self) -> str:
        # Python 3.12 formats a mixed-in enum by its name (Family.GDN); messages name it
        # by its value on every Python.
        return self.value


# Families whose layers keep a Mamba/GDN state beside attention: vLLM aligns their block
# size so one block holds a whole state, and checks that alignment early.
HYBRID_FAMILIES = frozenset((Family.HYBRID_MAMBA, Family.GDN, Family.SHORT_CONV, Family.HYBRID_MLA))
# Families whose attention layers are MLAAttention: one latent vector a token.
MLA_FAMILIES = frozenset((Family.DSA, Family.MLA, Family.HYBRID_MLA))


@dataclass(frozen=True)
class Mamba2Fields:
    """The config fields a Mamba2 mixer's class passes MambaStateShapeCalculator.
    mamba2_state_shape. The inner size is heads x head dimension where `expand` is None
    (NemotronH); else `d_ssm` where the config has it (FalconH1), else expand x hidden_size."""

    heads: str
    head_dim: str
    groups: str
    state: str
    conv: str
    expand: str | None = None
    d_ssm: str | None = None


@dataclass(frozen=True)
class Architecture:
    name: str  # the class name a config's `architectures` gives
    family: Family
    # vllm/model_executor/models/<module>.py in the releases kvrig reads first
    module: str
    # The `prefix` of layer {0}'s attention module (Attention or MLAAttention), which
    # kvrig's plugin matches a sibling's `layers` against; None for an attention-free one.
    attention: str | None = "model.layers.{0}.self_attn.attn"
    mamba2: Mamba2Fields | None = None
    # The field a checkpoint names its SSM state's dtype in, as its vLLM config reads it.
    ssm_dtype_field: str | None = None
    # Why its attention layers take no attn_backend= for a sibling (they ask the selector
    # themselves); None where the plugin can hand one.
    unrouted: str | None = None
    # Which parents import `module` ahead of their cells: "every" (the CPU column's and
    # the emulated ones), "emulated", or None (left to the registry's own import).
    preload: str | None = None

    @property
    def mla(self) -> bool:
        """Whether its attention layers are MLAAttention, which vLLM's selector and kvrig's
        plugin give only MLA backends."""
        return self.family in MLA_FAMILIES


# GraniteMoeHybrid's mixer fields; FalconH1's are the same and its mamba_d_ssm.
_GRANITE_MAMBA2 = Mamba2Fields(
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    expand="mamba_expand",
)
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        # Attention only: no state, the size is phase 1's.
        Architecture("LlamaForCausalLM", Family.DENSE, "llama", preload="every"),
        Architecture("MistralForCausalLM", Family.DENSE, "llama"),
        Architecture("Qwen2ForCausalLM", Family.DENSE, "qwen2"),
        Architecture("Qwen3ForCausalLM", Family.DENSE, "qwen3"),
        # An EAGLE3 drafter (llama_eagle3.py): attention layers of its own KV heads.
        Architecture("LlamaForCausalLMEagle3", Family.DENSE, "llama_eagle3"),
        # Mamba2 beside attention: NemotronH's attention layer is a `mixer`; FalconH1 runs
        # both in every layer (FalconH1ParallelHybrid) and passes the layer's own prefix
        # to its attention.
        Architecture(
            "NemotronHForCausalLM",
            Family.HYBRID_MAMBA,
            "nemotron_h",
            attention="model.layers.{0}.mixer.attn",
            mamba2=Mamba2Fields(
                "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel"
            ),
            ssm_dtype_field="mamba_ssm_cache_dtype",
            preload="every",
        ),
        Architecture(
            "GraniteMoeHybridForCausalLM",
            Family.HYBRID_MAMBA,
            "granitemoehybrid",
            mamba2=_GRANITE_MAMBA2,
            preload="every",
        ),
        Architecture(
            "FalconH1ForCausalLM",
            Family.HYBRID_MAMBA,
            "falcon_h1",
            attention="model.layers.{0}.attn",
            mamba2=replace(_GRANITE_MAMBA2, d_ssm="mamba_d_ssm"),
            preload="every",
        ),
        # Gated delta nets as linear attention; multimodal Qwen3.5 keeps its language
        # model under `language_model`.
        Architecture("Qwen3NextForCausalLM", Family.GDN, "qwen3_next", preload="every"),
        Architecture(
            "Qwen3_5ForConditionalGeneration",
            Family.GDN,
            "qwen3_5",
            attention="language_model.model.layers.{0}.self_attn.attn",
            ssm_dtype_field="mamba_ssm_dtype",
            preload="emulated",
        ),
        Architecture(
            "Qwen3_5ForCausalLM", Family.GDN, "qwen3_5", ssm_dtype_field="mamba_ssm_dtype"
        ),
        Architecture(
            "Qwen3_5MoeForConditionalGeneration",
            Family.GDN,
            "qwen3_5",
            attention="language_model.model.layers.{0}.self_attn.attn",
            ssm_dtype_field="mamba_ssm_dtype",
        ),
        Architecture(
            "Qwen3_5MoeForCausalLM", Family.GDN, "qwen3_5", ssm_dtype_field="mamba_ssm_dtype"
        ),
        # DeepSeek sparse attention: MLA layers beside the sparse indexer's cache. The MLA
        # wrapper names its MLAAttention f"{prefix}.attn" (mla.py).
        Architecture("DeepseekV32ForCausalLM", Family.DSA, "deepseek_v2"),
        # Dense MLA (deepseek_v2.py): MLAAttentionSpec, one latent of kv_lora_rank + rope.
        Architecture("DeepseekV2ForCausalLM", Family.MLA, "deepseek_v2", preload="every"),
        Architecture("DeepseekV3ForCausalLM", Family.MLA, "deepseek_v2"),
        # LFM2: ShortConv layers, MambaStateShapeCalculator.short_conv_state_shape.
        Architecture("Lfm2ForCausalLM", Family.SHORT_CONV, "lfm2", preload="every"),
        # Kimi-Linear: MLA every few layers, KDA elsewhere; its latent layer is a module
        # of its own (vllm/models/kimi_k3/nvidia/mla.py).
        Architecture(
            "KimiLinearForCausalLM",
            Family.HYBRID_MLA,
            "kimi_linear",
            attention="model.layers.{0}.self_attn",
            unrouted="Kimi-Linear's MLA layer asks vLLM's selector for its backend itself"
            " (vllm/models/kimi_k3/nvidia/mla.py), taking no attn_backend= for a sibling",
        ),
        # Mamba2 alone: attention-free.
        Architecture(
            "Mamba2ForCausalLM",
            Family.MAMBA,
            "mamba2",
            attention=None,
            mamba2=Mamba2Fields(
                "num_heads",
                "head_dim",
                "n_groups",
                "state_size",
                "conv_kernel",
                expand="expand",
            ),
            preload="every",
        ),
    )
}


def preloaded(*parents: str) -> tuple[str, ...]:
    """The model modules the `parents` ("every", "emulated") import ahead of their cells."""
    return tuple(
        dict.fromkeys(
            f"vllm.model_executor.models.{a.module}"
            for a in ARCHITECTURES.values()
            if a.preload in parents
        )
    )
