"""A checkpoint's config.json, read the way vLLM reads it, down to one rank's state shapes.

The block size is a ratio of two pages, and both are per rank: vLLM shards KV heads (and
replicates them when there are fewer than ranks) and splits the Mamba/GDN state across
tensor-parallel ranks. Reading the shapes from the whole model, or from the top level of
a Qwen3.5 config whose text model sits under `text_config`, gives a size no engine
chooses. So this module restates, field by field, what vLLM's model classes hand to
`MambaSpec` and `FullAttentionSpec`, and refuses, naming the field, what it does not know.

Pure: a config dict and the parallel settings in, shapes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvrig.define import models, vllm_models
from kvrig.define.vllm_models import (
    FAMILY_OF,
    HYBRID_FAMILIES,
    MLA_FAMILIES,
    Family,
    text_config,
)
from kvrig.facts.architectures import ARCHITECTURES

DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}
# What each of vLLM's dtype options takes (ModelDType, CacheDType and MambaDType in
# vllm/config), as far as kvrig restates the sizes: a value vLLM's argument parser refuses
# (--dtype fp8, --kv-cache-dtype float32) is refused here too, not answered.
OPTION_DTYPES = {
    "--dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "--kv-cache-dtype": (
        "auto",
        "float16",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
        "turboquant_k8v4",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_3bit_nc",
    ),
    "--mamba-ssm-cache-dtype": ("auto", "float32", "float16", "bfloat16"),
}
# The dtypes a model's weights are loaded in (a config's dtype or torch_dtype).
MODEL_DTYPES = ("float32", "bfloat16", "float16")
# The families whose shapes this module restates, from each architecture's model class
# (kvrig.define.vllm_models.FAMILY_OF): a gated delta net's state
# (MambaStateShapeCalculator.gated_delta_net_state_shape), a Mamba2 mixer's
# (mamba2_state_shape), and attention alone, whose size is phase 1's. DSA's MLA page is
# kvrig.rules.blocksize's own.
RESTATED = (
    Family.GDN,
    Family.HYBRID_MAMBA,
    Family.DENSE,
    Family.MLA,
    Family.SHORT_CONV,
    Family.HYBRID_MLA,
    Family.MAMBA,
)


class ConfigError(ValueError):
    """A config the predictor cannot read; the message is one paragraph for the user."""


@dataclass(frozen=True)
class Shapes:
    """What one rank holds per token of attention and per sequence of state."""

    architecture: str
    family: Family  # one of RESTATED
    kv_heads: int  # per rank
    head_size: int
    conv: tuple[int, int] = (0, 0)  # per rank: (conv_dim / tp, kernel - 1 + spec tokens)
    temporal: tuple[int, int, int] = (0, 0, 0)  # per rank
    head_k_dim: int | None = None  # GDN's linear_key_head_dim (FlashInfer prefill needs 128)
    # The state dtype the checkpoint asks for: Qwen3.5's mamba_ssm_dtype, NemotronH's
    # mamba_ssm_cache_dtype; None when it asks for none.
    config_ssm_dtype: str | None = None
    # MLA's one latent per token (kv_lora_rank + qk_rope_head_dim), where the attention
    # layers are MLAAttention; None for K and V heads.
    mla_width: int | None = None

    @property
    def hybrid(self) -> bool:
        return self.family in HYBRID_FAMILIES


def dtype_name(name: str) -> str:
    """A dtype as vLLM's STR_DTYPE_TO_TORCH_DTYPE knows it, or ConfigError."""
    canon = DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name
    if canon not in DTYPE_BYTES:
        raise ConfigError(
            f"Unknown dtype {name!r}. kvrig knows {', '.join(DTYPE_BYTES)}; pass one of"
            " them (--dtype, --kv-cache-dtype, --mamba-ssm-cache-dtype)."
        )
    return canon


def option_dtype(option: str, value: str) -> str:
    """`value` of one of vLLM's dtype options, as given (checked), or ConfigError."""
    takes = OPTION_DTYPES[option]
    if value.lower() not in takes:
        raise ConfigError(
            f"{option} {value} is not a value kvrig restates vLLM's {option} for: it takes"
            f" {', '.join(takes)} (a value vLLM's own parser refuses, or one whose page size"
            " kvrig does not restate). Pass one of them."
        )
    return value.lower()


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[dtype_name(name)]


def _architecture(config: dict[str, Any]) -> str:
    """The class vLLM loads (kvrig.define.vllm_models.architecture), or a ConfigError that
    says whether the config's `architectures` is malformed or missing."""
    arch = vllm_models.architecture(config)
    if arch is not None:
        return arch
    archs = config.get("architectures")
    if archs:
        raise ConfigError(
            f"The config's `architectures` is {archs!r}, and a checkpoint's config.json"
            ' lists its model classes by name (["Qwen3NextForCausalLM"]). Pass the'
            " checkpoint's own config.json."
        )
    raise ConfigError(
        "The config names no architecture (its `architectures` list is missing or"
        " empty), so the model class vLLM would load, and with it the state shapes, is"
        " unknown. Pass the checkpoint's own config.json."
    )


def model_dtype(config: dict[str, Any]) -> str | None:
    """The dtype vLLM loads an "auto" model in: the config's dtype (or torch_dtype)."""
    for source in (text_config(config), config):
        for key in ("dtype", "torch_dtype"):
            if isinstance(source.get(key), str):
                return _weights_dtype(source[key], key)
    return None


def _weights_dtype(name: str, key: str) -> str:
    """A config's dtype, one a model's weights are loaded in, or ConfigError."""
    canon = DTYPE_ALIASES.get(name, name)
    if canon not in MODEL_DTYPES:
        raise ConfigError(
            f"The config's {key} is {name!r}, and vLLM loads a model's weights in"
            f" {', '.join(MODEL_DTYPES)} only, so kvrig cannot say the KV and state dtypes."
            " Fix the config, or pass --dtype."
        )
    return canon


def config_ssm_dtype(cfg: dict[str, Any], arch: str) -> str | None:
    """The state dtype a checkpoint asks for, in the field its vLLM config class reads:
    Qwen3.5's `mamba_ssm_dtype`, NemotronH's `mamba_ssm_cache_dtype`."""
    record = ARCHITECTURES.get(arch)
    field = record.ssm_dtype_field if record else None
    return cfg.get(field) if field else None


def _whole(cfg: dict[str, Any], arch: str, name: str) -> int:
    """The config's `name` as a count of at least 1, or a ConfigError naming it: a head
    count of 0, -2 or 1.5, or the string "two", is no shape an engine could be built with,
    and a size computed from it would be a confident answer to nothing."""
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"The {arch} config's {name!r} is {value!r}, and vLLM's {arch} reads it as a"
            " whole number of at least 1 for its KV-cache or state shapes, so no engine"
            " would start with it and kvrig predicts no size for it. Fix the config, or pass"
            " the checkpoint's own config.json."
        )
    return value


def _field(cfg: dict[str, Any], arch: str, *names: str) -> int:
    """The first of `names` the config has, as a count, or a ConfigError naming them."""
    for name in names:
        if cfg.get(name) is not None:
            return _whole(cfg, arch, name)
    raise ConfigError(
        f"The {arch} config lacks {' or '.join(repr(n) for n in names)}, which vLLM's"
        f" {arch} reads for its KV-cache or state shapes. Pass the checkpoint's full"
        " config.json (a config with `text_config` is read from there)."
    )


def _divide(total: int, tp: int, what: str, arch: str) -> int:
    """vllm.distributed.divide: a sharded dimension must split evenly across ranks."""
    if total % tp:
        raise ConfigError(
            f"{arch}: {what} ({total}) does not split across {tp} tensor-parallel ranks;"
            " vLLM asserts it does. Pick a --tp that divides it."
        )
    return total // tp


def kv_heads_per_rank(total: int, tp: int) -> int:
    """ModelConfig.get_num_kv_heads: sharded, and replicated when fewer than ranks."""
    return max(1, total // tp)


def check_kv_heads_split(total: int, tp: int, arch: str) -> None:
    """What every attention class of vLLM asserts before it shards its KV heads: as many
    ranks or more, a whole number per rank; fewer, a whole number of ranks per head."""
    if total % tp if total >= tp else tp % total:
        how = "a multiple of" if total >= tp else "a divisor of"
        raise ConfigError(
            f"vLLM refuses --tp {tp} for this {arch}: its {total} KV head(s) are sharded"
            f" across the ranks or replicated over them, so their number must be {how} the"
            f" tensor-parallel size (the model's attention asserts it), and no engine starts."
            f" Pick a --tp that {'divides' if total >= tp else 'is a multiple of'} {total}."
        )


def head_size(cfg: dict[str, Any], arch: str) -> int:
    """ModelConfig.get_head_size: head_dim when the config sets it, else hidden / heads."""
    for key in ("head_dim", "attention_head_dim"):
        if cfg.get(key) is not None:  # 0 is a head size no engine has, not "unset"
            return _whole(cfg, arch, key)
    hidden = _field(cfg, arch, "hidden_size")
    return hidden // _field(cfg, arch, "num_attention_heads")


def check_config(config: dict[str, Any], arch: str) -> None:
    """The matrix loader's own checks (kvrig.define.models.check_config), so a config it
    refuses is never answered here: no engine starts with it, or kvrig cannot read it."""
    try:
        models.check_config(config, FAMILY_OF.get(arch))
    except models.ModelConfigError as exc:
        raise ConfigError(
            f"kvrig predicts no size for this {arch} config: {exc}. Fix the config, or pass"
            " the checkpoint's own config.json (a config with `text_config` is read from"
            " there)."
        ) from None


def check_heads_split(cfg: dict[str, Any], arch: str, tp: int) -> None:
    """ModelConfig.verify_with_parallel_config: vLLM refuses a --tp that does not divide
    the attention heads, before any engine starts."""
    total = _field(cfg, arch, "num_attention_heads")
    if total % tp:
        raise ConfigError(
            f"vLLM refuses --tp {tp} for this {arch}: total number of attention heads"
            f" ({total}) must be divisible by tensor parallel size ({tp})"
            " (ModelConfig.verify_with_parallel_config), so no engine starts. Pick a --tp"
            f" that divides {total}."
        )


def attention_layers(cfg: dict[str, Any], arch: str, family: Family) -> list[int] | None:
    """The indices of the attention layers as the config states them (its layer pattern,
    else its layer count), or None when it states neither: vLLM's config class then takes
    its architecture's defaults, which kvrig does not restate."""
    if "hybrid_override_pattern" in cfg:
        pattern, ok = (
            cfg["hybrid_override_pattern"],
            isinstance(cfg["hybrid_override_pattern"], str),
        )
        key = "hybrid_override_pattern"
    elif cfg.get("layer_types") or cfg.get("layers_block_type"):
        key = "layer_types" if cfg.get("layer_types") else "layers_block_type"
        pattern = cfg[key]
        ok = isinstance(pattern, list) and all(isinstance(t, str) for t in pattern)
    else:
        if cfg.get("num_hidden_layers") is None:
            return None
        _whole(cfg, arch, "num_hidden_layers")
        if family == Family.GDN and cfg.get("full_attention_interval") is not None:
            _whole(cfg, arch, "full_attention_interval")
        return vllm_models.attention_layers(cfg, family)
    if not ok:
        raise ConfigError(
            f"The {arch} config's {key!r} is {pattern!r}, which is no layer pattern vLLM"
            ' reads (a list of layer kinds, or NemotronH\'s string such as "M*M-"). Fix the'
            " config, or pass the checkpoint's own config.json."
        )
    return vllm_models.attention_layers(cfg, family)


def extra_groups(n_groups: int, tp: int) -> int:
    """MambaStateShapeCalculator.extra_groups_for_head_shards: groups replicated so that
    every head shard has its group."""
    return 0 if n_groups % tp == 0 else tp - n_groups


def shapes(config: dict[str, Any], *, tp: int = 1, num_speculative_tokens: int = 0) -> Shapes:
    """One rank's attention and state shapes for this config (ConfigError if unknown)."""
    if tp < 1 or num_speculative_tokens < 0:
        raise ConfigError("--tp must be at least 1 and --num-speculative-tokens at least 0.")
    cfg = text_config(config)
    arch = _architecture(cfg)
    family = FAMILY_OF.get(arch)
    if family not in RESTATED:
        known = ", ".join(sorted(a for a, f in FAMILY_OF.items() if f in RESTATED))
        raise ConfigError(
            f"Unknown architecture {arch!r}: kvrig restates the KV-cache and state shapes of"
            f" {known} only, so it cannot say which block size vLLM picks for it. Add its"
            " shapes to kvrig.rules.shapes (from the model's get_mamba_state_shape_from_config"
            " in vLLM), or pass the config of a supported architecture."
        )
    check_config(config, arch)
    if family == Family.MAMBA:  # no attention: only the state
        conv_dim, kernel, temporal = _mamba2_state(cfg, arch, tp)
        conv = (
            _divide(conv_dim, tp, "the conv dimension", arch),
            kernel - 1 + num_speculative_tokens,
        )
        return Shapes(arch, family, 0, 0, conv=conv, temporal=temporal)
    check_heads_split(cfg, arch, tp)
    mla = _mla_width(cfg, arch, family)
    if mla is None:
        total_kv = _field(cfg, arch, "num_key_value_heads")
        check_kv_heads_split(total_kv, tp, arch)
        kv, head = kv_heads_per_rank(total_kv, tp), head_size(cfg, arch)
    else:  # MLAAttentionSpec: one latent "head" a token, on every rank
        kv, head = 1, mla
    if family not in HYBRID_FAMILIES:
        return Shapes(arch, family, kv, head, mla_width=mla)
    conv_dim, kernel, temporal = STATES[family](cfg, arch, tp)
    spec = 0 if family == Family.SHORT_CONV else num_speculative_tokens
    return Shapes(
        arch,
        family,
        kv,
        head,
        conv=(_divide(conv_dim, tp, "the conv dimension", arch), kernel - 1 + spec),
        temporal=temporal,
        head_k_dim=cfg.get("linear_key_head_dim") if family == Family.GDN else None,
        config_ssm_dtype=config_ssm_dtype(cfg, arch),
        mla_width=mla,
    )


def _mla_width(cfg: dict[str, Any], arch: str, family: Family) -> int | None:
    """ModelConfig.get_head_size for MLA: kv_lora_rank + qk_rope_head_dim, the latent each
    token keeps; None off MLA."""
    if family not in MLA_FAMILIES:
        return None
    return _field(cfg, arch, "kv_lora_rank") + _field(cfg, arch, "qk_rope_head_dim")


def _short_conv_state(
    cfg: dict[str, Any], arch: str, tp: int
) -> tuple[int, int, tuple[int, int, int]]:
    """MambaStateShapeCalculator.short_conv_state_shape (LFM2): a conv state of conv_dim
    channels over conv_L_cache - 1 steps, no temporal state; speculative tokens do not
    widen it (Lfm2ForCausalLM passes none)."""
    return _field(cfg, arch, "conv_dim"), _field(cfg, arch, "conv_L_cache"), (0, 0, 0)


def _kda_state(cfg: dict[str, Any], arch: str, tp: int) -> tuple[int, int, tuple[int, int, int]]:
    """MambaStateShapeCalculator.kda_state_shape (Kimi-Linear): q, k and v convolved
    (heads x head_dim each), and a heads x head_dim x head_dim recurrent state."""
    linear = cfg.get("linear_attn_config")
    if not isinstance(linear, dict):
        raise ConfigError(
            f"The {arch} config lacks linear_attn_config, which vLLM's Kimi-Linear reads for"
            " its KDA state. Pass the checkpoint's full config.json."
        )
    heads = _whole(linear, arch, "num_heads")
    hdim = _whole(linear, arch, "head_dim")
    kernel = _whole(linear, arch, "short_conv_kernel_size")
    temporal = (_divide(heads, tp, "linear_attn_config.num_heads", arch), hdim, hdim)
    return 3 * heads * hdim, kernel, temporal


def _gdn_state(cfg: dict[str, Any], arch: str, tp: int) -> tuple[int, int, tuple[int, int, int]]:
    """MambaStateShapeCalculator.gated_delta_net_state_shape: (the whole conv dimension,
    the conv kernel, one rank's temporal state)."""
    nk = _field(cfg, arch, "linear_num_key_heads")
    nv = _field(cfg, arch, "linear_num_value_heads")
    dk = _field(cfg, arch, "linear_key_head_dim")
    dv = _field(cfg, arch, "linear_value_head_dim")
    kernel = _field(cfg, arch, "linear_conv_kernel_dim")
    _divide(nk, tp, "linear_num_key_heads", arch)  # the projections are viewed per key head
    temporal = (_divide(nv, tp, "linear_num_value_heads", arch), dv, dk)
    return dk * nk * 2 + dv * nv, kernel, temporal


def _mamba2_state(cfg: dict[str, Any], arch: str, tp: int) -> tuple[int, int, tuple[int, int, int]]:
    """MambaStateShapeCalculator.mamba2_state_shape, with the fields each model class
    passes it (NemotronH: heads x head_dim is the inner size; GraniteMoeHybrid: expand x
    hidden_size; FalconH1: mamba_d_ssm, else expand x hidden_size)."""
    fields = ARCHITECTURES[arch].mamba2
    assert fields is not None, f"{arch} has no Mamba2 mixer"
    heads = _field(cfg, arch, fields.heads)
    hdim = _field(cfg, arch, fields.head_dim)
    if fields.expand is None:
        inner = heads * hdim
    elif fields.d_ssm is not None and cfg.get(fields.d_ssm) is not None:
        inner = _field(cfg, arch, fields.d_ssm)
    else:
        inner = _field(cfg, arch, fields.expand) * _field(cfg, arch, "hidden_size")
    groups = _field(cfg, arch, fields.groups)
    state = _field(cfg, arch, fields.state)
    kernel = _field(cfg, arch, fields.conv)
    if groups % tp and groups != 1:
        raise ConfigError(
            f"vLLM refuses --tp {tp} for this {arch}: its {groups} Mamba groups do not split"
            " across the ranks, and MambaMixer2 replicates only a single group (it asserts"
            " n_groups % tp == 0 or n_groups == 1), so no engine starts. Pick a --tp that"
            f" divides {groups}."
        )
    conv_dim = inner + 2 * (groups + extra_groups(groups, tp)) * state
    return conv_dim, kernel, (_divide(heads, tp, "the Mamba heads", arch), hdim, state)


# TurboQuant's presets (vllm/model_executor/layers/quantization/turboquant/config.py,
# TQ_PRESETS): the key's and the value's bits; 8-bit keys are stored as fp8.
TURBOQUANT_BITS = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}


def turboquant_slot(head_size: int, preset: str) -> int:
    """TurboQuantConfig.slot_size_aligned: one head's key and value packed in one slot a
    token (key codes and an fp16 norm, or fp8 keys; value codes with an fp16 scale and
    zero), rounded up to an even number of bytes."""
    key_bits, value_bits = TURBOQUANT_BITS[preset]
    key = head_size if key_bits == 8 else math.ceil(head_size * key_bits / 8) + 2
    value = math.ceil(head_size * value_bits / 8) + 4
    slot = key + value
    return slot + slot % 2


def attention_page_per_token(s: Shapes, kv_dtype: str) -> int:
    """FullAttentionSpec(block_size=1).page_size_bytes: K and V for one rank's heads
    (TurboQuant's backend packs both in one slot a head: customize_spec);
    MLAAttentionSpec's: the one latent."""
    if s.mla_width is not None:
        return s.mla_width * dtype_bytes(kv_dtype)
    if kv_dtype in TURBOQUANT_BITS:
        return s.kv_heads * turboquant_slot(s.head_size, kv_dtype)
    return 2 * s.kv_heads * s.head_size * dtype_bytes(kv_dtype)


def mamba_page(s: Shapes, conv_dtype: str, ssm_dtype: str) -> int:
    """MambaSpec.page_size_bytes: each state's elements times its dtype's size."""
    return math.prod(s.conv) * dtype_bytes(conv_dtype) + math.prod(s.temporal) * dtype_bytes(
        ssm_dtype
    )


# Each hybrid family's state: (the whole conv dimension, the conv kernel, one rank's
# temporal state), as the family's model class hands MambaStateShapeCalculator its fields.
STATES = {
    Family.GDN: _gdn_state,
    Family.HYBRID_MAMBA: _mamba2_state,
    Family.SHORT_CONV: _short_conv_state,
    Family.HYBRID_MLA: _kda_state,
}
