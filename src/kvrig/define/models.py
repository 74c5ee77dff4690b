"""Miniature models written offline: a config.json in a cache folder, no weights, no hub.

vLLM loads them with load_format="dummy" and skip_tokenizer_init=True, so a folder with
only config.json is a complete model. The folder name carries a hash of the config, so
an edited config never reuses a stale folder and concurrent cells can share one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from kvrig.define.matrix import ModelSpec


def cache_root() -> Path:
    """Where models (and vLLM's own cache, see kvrig.run.runner) are kept between runs."""
    env = os.environ.get("KVRIG_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvrig"


SHIPPED = resources.files("kvrig.define") / "model_configs"

# The family each architecture's layers make it (kvrig.rules.shapes restates their shapes):
# a config of another family's architecture would be judged by rules it does not follow.
FAMILY_OF = {
    **dict.fromkeys(
        ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
        "dense",
    ),
    **dict.fromkeys(
        ("NemotronHForCausalLM", "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM"),
        "hybrid_mamba",
    ),
    **dict.fromkeys(
        (
            "Qwen3NextForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3_5MoeForCausalLM",
        ),
        "gdn",
    ),
    "DeepseekV32ForCausalLM": "dsa",
}
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
        ),
        _SELF_ATTN,
    ),
    "NemotronHForCausalLM": "model.layers.{0}.mixer.attn",
    "FalconH1ForCausalLM": "model.layers.{0}.attn",
    "Qwen3_5ForConditionalGeneration": "language_model." + _SELF_ATTN,
    "Qwen3_5MoeForConditionalGeneration": "language_model." + _SELF_ATTN,
}
# Architectures whose attention layers are MLAAttention: kvrig's plugin hands them only a
# sibling built on an MLA backend.
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")
# Config fields that are sizes or counts wherever they are set: vLLM divides and allocates
# by them, so zero, a negative or a fraction is a config no engine builds (or, cast to int,
# a different one).
SIZE_KEYS = (
    "attention_head_dim",
    "conv_kernel",
    "full_attention_interval",
    "head_dim",
    "hidden_size",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "intermediate_size",
    "kv_lora_rank",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "mamba_d_conv",
    "mamba_d_head",
    "mamba_d_ssm",
    "mamba_d_state",
    "mamba_expand",
    "mamba_head_dim",
    "mamba_n_groups",
    "mamba_n_heads",
    "mamba_num_heads",
    "max_position_embeddings",
    "n_groups",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "ssm_state_size",
    "v_head_dim",
    "vocab_size",
)


class ModelConfigError(ValueError):
    """A model whose config no engine (or no computed size) can use; `field` is where in
    the model's matrix entry the problem is written (config, family, overrides.<key>), so
    loading can point at that line."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


def shipped_names() -> list[str]:
    return sorted(p.name for p in SHIPPED.iterdir() if p.name.endswith(".json"))


def shipped_config(name: str) -> dict[str, Any]:
    """A config shipped in kvrig/define/model_configs, by file name."""
    ref = SHIPPED / name
    if not ref.is_file():
        raise FileNotFoundError(
            f"no shipped model config {name!r}; known: {', '.join(shipped_names())}"
        )
    return json.loads(ref.read_text())


def config_path(name: str, base: Path | None) -> Path | None:
    """A user's own config: `config:` as a path relative to matrix.yaml's folder."""
    if base is None:
        return None
    path = base / name
    return path if path.is_file() else None


def findable(name: str, base: Path | None) -> bool:
    return config_path(name, base) is not None or (SHIPPED / name).is_file()


def render(spec: ModelSpec, base: Path | None = None) -> dict[str, Any]:
    """The config.json a model spec stands for: its file (beside matrix.yaml, else shipped
    with kvrig) plus its overrides."""
    own = config_path(spec.config, base)
    config = json.loads(own.read_text()) if own else shipped_config(spec.config)
    if not isinstance(config, dict):
        raise ModelConfigError("config", "its config file holds no JSON object")
    config.update(spec.overrides)
    config["dtype"] = spec.dtype
    config["torch_dtype"] = spec.dtype
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Where a multimodal checkpoint keeps its language model's fields (Qwen3.5's
    `text_config`), as vLLM's hf_text_config reads them."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def attention_layers(config: dict[str, Any], family: str) -> list[int]:
    """Indices of the layers with an attention (non-SSM) backend, in layer order."""
    config = text_config(config)
    if "hybrid_override_pattern" in config:  # NemotronH: M mamba, * attention, - mlp, E moe
        return [i for i, c in enumerate(config["hybrid_override_pattern"]) if c == "*"]
    types = config.get("layer_types") or config.get("layers_block_type")
    if types:
        return [i for i, t in enumerate(types) if t in ("attention", "full_attention")]
    n = int(config["num_hidden_layers"])
    if family == "gdn":
        interval = int(config.get("full_attention_interval", 4))
        return [i for i in range(n) if (i + 1) % interval == 0]
    return list(range(n))


def layer_prefix(index: int) -> str:
    """The name prefix of a decoder layer's modules, as vLLM's models name them."""
    return f"model.layers.{index}."


def architecture(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def attention_prefix(index: int, config: dict[str, Any]) -> str | None:
    """The `prefix` vLLM gives the attention module (Attention or MLAAttention) of layer
    `index`, the name kvrig's plugin matches a sibling's `layers` against; None for an
    architecture kvrig does not know the module names of."""
    module = ATTENTION_MODULE.get(architecture(config) or "")
    return module.format(index) if module else None


def prefix_matches(prefix: str, index: int, config: dict[str, Any]) -> bool:
    """Whether kvrig's plugin gives a sibling with this `layers` prefix to the attention
    module of layer `index`: the plugin hands a sibling to each module whose own prefix
    starts with it, so a prefix that reaches into the layer elsewhere (its MLP, its
    q_proj) picks nothing. For an unknown architecture the layer's name is all that is
    known: a prefix of it, or a longer name inside it."""
    module = attention_prefix(index, config)
    if module is not None:
        return module.startswith(prefix)
    own = layer_prefix(index)
    return own.startswith(prefix) or prefix.startswith(own)


def check(spec: ModelSpec, base: Path | None) -> dict[str, Any]:
    """The rendered config, or ModelConfigError for one that would stop every cell of the
    model with a traceback, or be judged by another family's rules: not a JSON object,
    without the layer and attention fields kvrig reads, a size that is no positive
    integer, or an architecture of another family than the one the matrix names."""
    try:
        config = render(spec, base)
    except json.JSONDecodeError as exc:
        raise ModelConfigError("config", f"its config file is not JSON ({exc})") from None
    text = text_config(config)
    # Overrides replace top-level keys only; a nested text_config is the file's own.
    overridden = set(spec.overrides) if text is config else set()

    def where(key: str) -> str:
        return f"overrides.{key}" if key in overridden else "config"

    arch = architecture(config)
    if arch is None:
        field = "overrides.architectures" if "architectures" in spec.overrides else "config"
        raise ModelConfigError(
            field,
            "the config names no architecture (a non-empty `architectures` list), so the"
            " model class vLLM loads is unknown",
        )
    for source, at in ((config, set(spec.overrides)), (text, overridden)):
        for key in SIZE_KEYS:
            value = source.get(key)
            if value is not None and (type(value) is not int or value < 1):
                field = f"overrides.{key}" if key in at else "config"
                raise ModelConfigError(field, f"{key} is {value!r}, not a positive integer")
    family = FAMILY_OF.get(arch)
    if family is not None and family != spec.family:
        raise ModelConfigError(
            "family",
            f"the config's architecture {arch} is a {family} model, not {spec.family}; its"
            " cells would be judged by the rules of a family it does not have",
        )
    _check_layer_fields(text, spec.family, where)
    return config


def _check_layer_fields(text: dict[str, Any], family: str, where: Callable[[str], str]) -> None:
    """The fields attention_layers and kvrig.rules.shapes read for every architecture:
    which layers are attention layers, and one attention layer's page."""
    if "hybrid_override_pattern" in text:
        pattern = text["hybrid_override_pattern"]
        if not (isinstance(pattern, str) and pattern):
            raise ModelConfigError(
                where("hybrid_override_pattern"), "hybrid_override_pattern is no layer pattern"
            )
    types_key = next((k for k in ("layer_types", "layers_block_type") if text.get(k)), None)
    if types_key is not None:
        types = text[types_key]
        if not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
            raise ModelConfigError(where(types_key), f"{types_key} is not a list of layer kinds")
    needed: list[tuple[str, ...]] = []
    if "hybrid_override_pattern" not in text and types_key is None:
        needed.append(("num_hidden_layers",))
    if family == "dsa":
        needed += [("kv_lora_rank",), ("qk_rope_head_dim",)]
    else:
        needed.append(("num_key_value_heads",))
        if not (text.get("head_dim") or text.get("attention_head_dim")):
            needed += [("hidden_size", "head_dim"), ("num_attention_heads", "head_dim")]
    for names in needed:
        if text.get(names[0]) is None:
            missing = names[0] + (f" (or {names[1]})" if len(names) > 1 else "")
            raise ModelConfigError(
                where(names[0]),
                f"the config lacks {missing}, which kvrig reads for the model's layers and"
                " its KV-cache page",
            )


def write(name: str, config: dict[str, Any], root: Path | None = None) -> Path:
    """Writes the model folder if missing and returns it; safe to call from many processes."""
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = (root or cache_root() / "models") / f"{name}-{digest}"
    target = folder / "config.json"
    if target.is_file() and target.read_text() == text:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".config-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, target)  # atomic: a concurrent reader sees the old or the new file
    return folder
