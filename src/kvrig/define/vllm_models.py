"""What kvrig knows of vLLM's model classes: each architecture's family, its layers, its
attention modules, and how vLLM reads a checkpoint's config.json.

The matrix's loader (kvrig.define.models, kvrig.define.checks) and the predictor
(kvrig.rules.shapes) both read configs; reading them from one place keeps a config one
of them accepts from being read differently by the other.

Pure: a config dict in, names and indices out.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Family(str, Enum):
    """The kind of layers an architecture builds, which decides the rules its cells are
    judged by. A str whose value is the family's name in matrix.yaml, so a family written
    to a record, a results row or JSON stays the text it always was ("gdn")."""

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

# The family each architecture's layers make it, with the vLLM model class
# (vllm/model_executor/models/) whose shapes kvrig.rules.shapes restates: a config of
# another family's architecture would be judged by rules it does not follow.
FAMILY_OF: dict[str, Family] = {
    # Attention only: no state, the size is phase 1's.
    **dict.fromkeys(
        (
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            # An EAGLE3 drafter (llama_eagle3.py): attention layers of its own KV heads.
            "LlamaForCausalLMEagle3",
        ),
        Family.DENSE,
    ),
    # Mamba2 beside attention (nemotron_h.py, granitemoehybrid.py; falcon_h1.py runs
    # both in every layer, FalconH1ParallelHybrid): MambaStateShapeCalculator.mamba2_state_shape.
    **dict.fromkeys(
        ("NemotronHForCausalLM", "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM"),
        Family.HYBRID_MAMBA,
    ),
    # Gated delta nets as linear attention (qwen3_next.py, qwen3_5.py):
    # MambaStateShapeCalculator.gated_delta_net_state_shape.
    **dict.fromkeys(
        (
            "Qwen3NextForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5MoeForCausalLM",
        ),
        Family.GDN,
    ),
    # DeepSeek sparse attention: MLA layers beside the sparse indexer's cache.
    "DeepseekV32ForCausalLM": Family.DSA,
    # Dense MLA (deepseek_v2.py): MLAAttentionSpec, one latent of kv_lora_rank + rope.
    **dict.fromkeys(("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"), Family.MLA),
    # LFM2 (lfm2.py): ShortConv layers, MambaStateShapeCalculator.short_conv_state_shape.
    "Lfm2ForCausalLM": Family.SHORT_CONV,
    # Kimi-Linear (vllm/models/kimi_k3): MLA every few layers, KDA elsewhere
    # (MambaStateShapeCalculator.kda_state_shape).
    "KimiLinearForCausalLM": Family.HYBRID_MLA,
    # Mamba2 alone (mamba2.py): attention-free.
    "Mamba2ForCausalLM": Family.MAMBA,
}
# Architectures whose attention layers are MLAAttention: kvrig's plugin hands them only a
# sibling built on an MLA backend, and vLLM's selector gives them only MLA backends.
MLA_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiLinearForCausalLM",
)
# The prefix of layer {0}'s attention module in vLLM 0.33.0's model classes
# (vllm/model_executor/models/): the decoder layer's `self_attn` holds an `attn`, the
# MLA wrapper of DeepSeek too (mla.py names its MLAAttention f"{prefix}.attn"); NemotronH's
# attention layer is a `mixer`; FalconH1 passes the layer's own prefix to its attention;
# multimodal Qwen3.5 keeps its language model under `language_model`.
_SELF_ATTN = "model.layers.{0}.self_attn.attn"
ATTENTION_MODULE = {
    **dict.fromkeys(
        (
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            "GraniteMoeHybridForCausalLM",
            "Qwen3NextForCausalLM",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
            "DeepseekV2ForCausalLM",
            "DeepseekV3ForCausalLM",
            "DeepseekV32ForCausalLM",
            "Lfm2ForCausalLM",
            "LlamaForCausalLMEagle3",
        ),
        _SELF_ATTN,
    ),
    # Kimi-Linear's latent layer is a module of its own (vllm/models/kimi_k3/nvidia/mla.py).
    "KimiLinearForCausalLM": "model.layers.{0}.self_attn",
    "NemotronHForCausalLM": "model.layers.{0}.mixer.attn",
    "FalconH1ForCausalLM": "model.layers.{0}.attn",
    "Qwen3_5ForConditionalGeneration": "language_model." + _SELF_ATTN,
    "Qwen3_5MoeForConditionalGeneration": "language_model." + _SELF_ATTN,
}
# Architectures whose attention layers ask the selector themselves, with no attn_backend=
# for kvrig's plugin to hand a sibling (a replacement, which the selector serves, reaches
# them): why, for the refusal of a sibling there.
SIBLINGS_UNROUTED = {
    "KimiLinearForCausalLM": (
        "Kimi-Linear's MLA layer asks vLLM's selector for its backend itself"
        " (vllm/models/kimi_k3/nvidia/mla.py), taking no attn_backend= for a sibling"
    ),
}
# The layer kinds each hybrid family's vLLM classes build, as their configs name them
# (transformers' names and the legacy ones it maps to them: mamba, attention); NemotronH's
# pattern letters (M mamba, * attention, - MLP, E MoE). A kind outside these is a layer
# vLLM's model has no class for, or one kvrig would count as the wrong kind.
LAYER_KINDS = {
    Family.HYBRID_MAMBA: frozenset(
        ("full_attention", "linear_attention", "attention", "mamba", "mlp", "moe")
    ),
    Family.GDN: frozenset(("full_attention", "linear_attention", "attention", "mamba")),
    Family.SHORT_CONV: frozenset(("conv", "full_attention")),
}
PATTERN_KINDS = frozenset("M*-E")
# The kinds of a layer list, and the letter of NemotronH's pattern, that are attention.
ATTENTION_KINDS = ("attention", "full_attention")
ATTENTION_LETTER = "*"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig.hf_text_config: where a multimodal checkpoint (Qwen3.5, Qwen3.6) keeps
    its language model's fields, `text_config`, with the top level's `architectures`,
    which name the class vLLM loads (a nested config's own names the text model, or none).

    kvrig once had two readings, and this is the one kept: the loader's returned the
    nested mapping as it is, the predictor's this one. Their layer and size fields are
    the same; only this one answers `architecture()` with the class vLLM loads."""
    nested = config.get("text_config")
    if not isinstance(nested, dict):
        return config
    merged = dict(nested)
    if config.get("architectures"):
        merged["architectures"] = config["architectures"]
    return merged


def architecture(config: dict[str, Any]) -> str | None:
    """The model class vLLM loads (the first of the config's `architectures`), or None
    when the config names none: no list, an empty one, or one holding anything but names.

    Of kvrig's two readings this keeps the stricter, the predictor's: the loader's took
    a first entry that was a name whatever followed it. transformers writes class names
    only and vLLM's registry tries every entry in turn, so a list with a number in it is
    no checkpoint's config, and judging it by its first entry would be a guess."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        return None
    return archs[0]


def mla(config: dict[str, Any]) -> bool:
    """Whether the config's attention layers are MLAAttention, which vLLM's selector and
    kvrig's plugin give only MLA backends."""
    return architecture(config) in MLA_ARCHITECTURES


def attention_layers(config: dict[str, Any], family: Family) -> list[int]:
    """Indices of the layers with an attention (non-SSM) backend, in layer order."""
    config = text_config(config)
    if "hybrid_override_pattern" in config:  # NemotronH: M mamba, * attention, - mlp, E moe
        pattern = config["hybrid_override_pattern"]
        return [i for i, c in enumerate(pattern) if c == ATTENTION_LETTER]
    types = config.get("layer_types") or config.get("layers_block_type")
    if types:
        return [i for i, t in enumerate(types) if t in ATTENTION_KINDS]
    if family == Family.MAMBA:
        return []
    linear = config.get("linear_attn_config")
    if family == Family.HYBRID_MLA and isinstance(linear, dict):
        # Kimi's config counts its layers from 1.
        return sorted(i - 1 for i in linear.get("full_attn_layers") or [])
    n = int(config["num_hidden_layers"])
    if family == Family.GDN:
        interval = int(config.get("full_attention_interval", 4))
        return [i for i in range(n) if (i + 1) % interval == 0]
    return list(range(n))


def layer_count(config: dict[str, Any]) -> int:
    """How many decoder layers vLLM builds: the layer pattern's length where the config
    lists its layers, else num_hidden_layers."""
    config = text_config(config)
    listed = (
        config.get("hybrid_override_pattern")
        or config.get("layer_types")
        or config.get("layers_block_type")
    )
    return len(listed) if listed else int(config["num_hidden_layers"])


# The layer kinds (and NemotronH's pattern letter) that keep a Mamba, GDN or
# short-convolution state.
STATE_KINDS = ("linear_attention", "mamba", "conv")
STATE_LETTER = "M"


def state_layers(config: dict[str, Any], family: Family) -> int:
    """How many layers keep a state (each a layer of the state KV-cache groups); none
    outside the hybrid and attention-free families."""
    config = text_config(config)
    if family not in HYBRID_FAMILIES and family != Family.MAMBA:
        return 0
    if family == Family.MAMBA:
        return layer_count(config)
    if "hybrid_override_pattern" in config:
        return str(config["hybrid_override_pattern"]).count(STATE_LETTER)
    types = config.get("layer_types") or config.get("layers_block_type")
    if types:
        return sum(t in STATE_KINDS for t in types)
    linear = config.get("linear_attn_config")
    if family == Family.HYBRID_MLA and isinstance(linear, dict):
        return len(linear.get("kda_layers") or [])
    total = layer_count(config)
    if family == Family.GDN:
        return total - len(attention_layers(config, family))
    return total  # a state beside attention in every layer (FalconH1)


def layer_prefix(index: int) -> str:
    """The name prefix of a decoder layer's modules, as vLLM's models name them."""
    return f"model.layers.{index}."


def attention_prefix(index: int, config: dict[str, Any]) -> str | None:
    """The `prefix` vLLM gives the attention module (Attention or MLAAttention) of layer
    `index`, the name kvrig's plugin matches a sibling's `layers` against; None for an
    architecture kvrig does not know the module names of."""
    module = ATTENTION_MODULE.get(architecture(config) or "")
    return module.format(index) if module else None
