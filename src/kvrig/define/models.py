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
    config.update(spec.overrides)
    config["dtype"] = spec.dtype
    config["torch_dtype"] = spec.dtype
    return config


def attention_layers(config: dict[str, Any], family: str) -> list[int]:
    """Indices of the layers with an attention (non-SSM) backend, in layer order."""
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


def prefix_matches(prefix: str, index: int) -> bool:
    """Whether a sibling's layer prefix picks layer `index` (a prefix of its name, or
    a longer name inside it)."""
    own = layer_prefix(index)
    return own.startswith(prefix) or prefix.startswith(own)


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
