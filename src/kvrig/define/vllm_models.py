"""How vLLM reads a checkpoint's config.json: which class it loads, which layers hold
attention or a state, and the tables of kvrig.facts.architectures by architecture.

The matrix's loader (kvrig.define.models, kvrig.define.checks) and the predictor
(kvrig.rules.shapes) both read configs; reading them from one place keeps a config one
of them accepts from being read differently by the other.

Pure: a config dict in, names and indices out.
"""

from __future__ import annotations

from typing import Any

from kvrig.facts.architectures import (
    ARCHITECTURES,
    HYBRID_FAMILIES,
    MLA_FAMILIES,
    Family,
)

__all__ = ["HYBRID_FAMILIES", "MLA_FAMILIES", "Family"]  # the facts' names, read here too

# The family each architecture's layers make it: a config of another family's
# architecture would be judged by rules it does not follow.
FAMILY_OF: dict[str, Family] = {a.name: a.family for a in ARCHITECTURES.values()}
# Architectures whose attention layers are MLAAttention: kvrig's plugin hands them only a
# sibling built on an MLA backend, and vLLM's selector gives them only MLA backends.
MLA_ARCHITECTURES = tuple(a.name for a in ARCHITECTURES.values() if a.mla)
# The prefix of layer {0}'s attention module, by architecture.
ATTENTION_MODULE = {a.name: a.attention for a in ARCHITECTURES.values() if a.attention}
# Architectures whose attention layers ask the selector themselves, with no attn_backend=
# for kvrig's plugin to hand a sibling (a replacement, which the selector serves, reaches
# them): why, for the refusal of a sibling there.
SIBLINGS_UNROUTED = {a.name: a.unrouted for a in ARCHITECTURES.values() if a.unrouted}

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
    which name the class vLLM loads (a nested config's own names the text model, or none)."""
    nested = config.get("text_config")
    if not isinstance(nested, dict):
        return config
    merged = dict(nested)
    if config.get("architectures"):
        merged["architectures"] = config["architectures"]
    return merged


def architecture(config: dict[str, Any]) -> str | None:
    """The model class vLLM loads (the first of the config's `architectures`), or None
    when the config names none: no list, an empty one, or one holding anything but names
    (transformers writes class names only, so such a list is no checkpoint's config)."""
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
