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
from collections.abc import Callable, Collection
from importlib import resources
from pathlib import Path
from typing import Any

from kvrig.define.schema import ModelSpec
from kvrig.define.vllm_models import (
    FAMILY_OF,
    LAYER_KINDS,
    MLA_FAMILIES,
    PATTERN_KINDS,
    Family,
    architecture,
    attention_prefix,
    layer_prefix,
    text_config,
)
from kvrig.facts.architectures import ARCHITECTURES


def cache_root() -> Path:
    """Where models (and vLLM's own cache, see kvrig.run.runner) are kept between runs."""
    env = os.environ.get("KVRIG_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvrig"


SHIPPED = resources.files("kvrig.define") / "model_configs"

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
    model with a traceback, or be judged by another family's rules (check_config)."""
    try:
        config = render(spec, base)
    except json.JSONDecodeError as exc:
        raise ModelConfigError("config", f"its config file is not JSON ({exc})") from None
    check_config(config, spec.family, spec.overrides)
    return config


def check_config(
    config: dict[str, Any], family: Family | None = None, overridden: Collection[str] = ()
) -> None:
    """ModelConfigError for a config no engine starts with, or one kvrig cannot read: no
    architecture, a size that is no positive integer, an architecture of another family
    than `family` (None: the architecture's own), layer fields kvrig cannot read or that
    disagree, heads vLLM cannot group. The matrix's loader and `kvrig predict` both ask
    here, so a config one of them refuses is never answered by the other.

    `overridden`: the top-level keys the matrix's overrides set, named as the field."""
    text = text_config(config)
    top = set(overridden)
    # Overrides replace top-level keys only; a nested text_config is the file's own.
    inner = top if text is config else set()

    def where(key: str) -> str:
        return f"overrides.{key}" if key in inner else "config"

    arch = architecture(config)
    if arch is None:
        raise ModelConfigError(
            "overrides.architectures" if "architectures" in top else "config",
            "the config names no architecture (a non-empty `architectures` list), so the"
            " model class vLLM loads is unknown",
        )
    for source, at in ((config, top), (text, inner)):
        for key in SIZE_KEYS:
            value = source.get(key)
            if value is not None and (type(value) is not int or value < 1):
                raise ModelConfigError(
                    f"overrides.{key}" if key in at else "config",
                    f"{key!r} is {value!r}, and vLLM reads it as a whole number of at least 1"
                    " (a size or a count), so no engine would start with it",
                )
    own = FAMILY_OF.get(arch)
    if family is not None and own is not None and own != family:
        raise ModelConfigError(
            "family",
            f"the config's architecture {arch} is a {own} model, not {family}; its"
            " cells would be judged by the rules of a family it does not have",
        )
    family = family or own or ""
    _check_layer_fields(text, family, where)
    _check_layer_count(text, family, where)
    _check_heads(text, family, where)
    _check_state_heads(text, arch, family, where)


def _stated_layers(text: dict[str, Any]) -> str | None:
    """The key that lists the layers' kinds (NemotronH's pattern, else the first list
    set), or None when the config states only a layer count."""
    if "hybrid_override_pattern" in text:
        return "hybrid_override_pattern"
    return next((k for k in ("layer_types", "layers_block_type") if text.get(k) is not None), None)


def _check_layer_fields(text: dict[str, Any], family: str, where: Callable[[str], str]) -> None:
    """The fields kvrig.define.vllm_models.attention_layers and kvrig.rules.shapes read for
    every architecture: which layers are attention layers, and one attention layer's page."""
    key = _stated_layers(text)
    if key == "hybrid_override_pattern":
        pattern = text[key]
        if not (isinstance(pattern, str) and pattern):
            raise ModelConfigError(where(key), "hybrid_override_pattern is no layer pattern")
    elif key is not None:
        types = text[key]
        if not (isinstance(types, list) and types and all(isinstance(t, str) for t in types)):
            raise ModelConfigError(
                where(key), f"{key} is {types!r}, not a non-empty list of layer kinds"
            )
    needed: list[tuple[str, ...]] = [("num_hidden_layers",)] if key is None else []
    for names in needed + _page_fields(text, family):
        if text.get(names[0]) is None:
            missing = names[0] + (f" (or {names[1]})" if len(names) > 1 else "")
            raise ModelConfigError(
                where(names[0]),
                f"the config lacks {missing}, which vLLM builds the model's layers from and"
                " kvrig reads for its attention layers and KV-cache page",
            )


def _page_fields(text: dict[str, Any], family: str) -> list[tuple[str, ...]]:
    """The fields one attention layer's page is read from (each with the one that may stand
    in for it): MLA's latent, else K and V heads and a head size; none without attention."""
    if family in MLA_FAMILIES:
        return [("kv_lora_rank",), ("qk_rope_head_dim",)]
    if family == Family.MAMBA:
        return []
    if text.get("head_dim") is None and text.get("attention_head_dim") is None:
        return [
            ("num_key_value_heads",),
            ("hidden_size", "head_dim"),
            ("num_attention_heads", "head_dim"),
        ]
    return [("num_key_value_heads",)]


def _check_layer_count(text: dict[str, Any], family: str, where: Callable[[str], str]) -> None:
    """A layer list and a layer count that agree, of kinds the family's layers have:
    transformers refuses a count that is not the list's length (NemotronH takes the
    list's), vLLM builds num_hidden_layers layers from the list, and kvrig finds the
    attention layers in it, so a disagreement has no one answer."""
    key = _stated_layers(text)
    if key is None:
        return
    kinds = text[key]
    count = text.get("num_hidden_layers")
    if count is not None and len(kinds) != count:
        field = where(key) if where(key) != "config" else where("num_hidden_layers")
        raise ModelConfigError(
            field,
            f"{key} states {len(kinds)} layers and num_hidden_layers {count}; transformers"
            " refuses a layer count that is not the number of layer kinds (NemotronH takes"
            " the list's), so the model's layers are not known: make them agree",
        )
    known = PATTERN_KINDS if key == "hybrid_override_pattern" else LAYER_KINDS.get(family)
    unknown = sorted({k for k in kinds if k not in known}) if known else []
    if unknown:
        raise ModelConfigError(
            where(key),
            f"{key} holds {', '.join(map(repr, unknown))}, no kind of layer a {family}"
            f" model of vLLM's has (it knows {', '.join(sorted(known or ()))})",
        )


def _check_heads(text: dict[str, Any], family: str, where: Callable[[str], str]) -> None:
    """vLLM's Attention asserts num_heads % num_kv_heads == 0: each KV head serves a whole
    number of query heads (MLA keeps no KV heads of its own)."""
    heads, kv = text.get("num_attention_heads"), text.get("num_key_value_heads")
    if family in MLA_FAMILIES or heads is None or kv is None or heads % kv == 0:
        return
    field = where("num_key_value_heads")
    raise ModelConfigError(
        field if field != "config" else where("num_attention_heads"),
        f"num_key_value_heads ({kv}) does not divide num_attention_heads ({heads}): vLLM's"
        " attention layer gives each KV head a whole number of query heads and asserts"
        " num_heads % num_kv_heads == 0, so no engine would start with it",
    )


def _check_state_heads(
    text: dict[str, Any], arch: str, family: str, where: Callable[[str], str]
) -> None:
    """The state's heads as vLLM's layers group them: a gated delta net repeats each key
    head over a whole number of value heads; a Mamba2 mixer's SSD kernels assert nheads %
    ngroups == 0, and its heads times their dimension are its inner size."""
    if family == Family.GDN:
        why = "vLLM's gated delta net repeats each key head over a whole number of value heads"
        _divides(text, "linear_num_key_heads", "linear_num_value_heads", where, why)
        return
    record = ARCHITECTURES.get(arch)
    fields = record.mamba2 if record and family == Family.HYBRID_MAMBA else None
    if fields is None:
        return
    heads, hdim = fields.heads, fields.head_dim
    _divides(
        text, fields.groups, heads, where, "vLLM's Mamba2 kernels assert nheads % ngroups == 0"
    )
    if fields.expand is None:
        return  # its inner size is heads x head dimension
    if fields.d_ssm is not None and text.get(fields.d_ssm) is not None:
        inner, named = text[fields.d_ssm], fields.d_ssm
    elif text.get(fields.expand) is not None and text.get("hidden_size") is not None:
        inner, named = text[fields.expand] * text["hidden_size"], f"{fields.expand} x hidden_size"
    else:
        return
    n, d = text.get(heads), text.get(hdim)
    if n is not None and d is not None and n * d != inner:
        raise ModelConfigError(
            where(hdim) if where(hdim) != "config" else where(heads),
            f"{heads} x {hdim} is {n} x {d} = {n * d}, and the Mamba2 mixer's inner size"
            f" ({named}) is {inner}: vLLM splits the inner size into the heads, so no"
            " engine would start with it",
        )


def _divides(
    text: dict[str, Any], part: str, whole: str, where: Callable[[str], str], why: str
) -> None:
    """ModelConfigError, saying `why` vLLM needs it, unless `part` divides `whole`."""
    a, b = text.get(part), text.get(whole)
    if a is None or b is None or b % a == 0:
        return
    raise ModelConfigError(
        where(part) if where(part) != "config" else where(whole),
        f"{part} ({a}) does not divide {whole} ({b}): {why}, so no engine would start with it",
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
