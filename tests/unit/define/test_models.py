from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvrig.define import models, vllm_models
from kvrig.define.matrix import load
from kvrig.define.schema import ModelSpec

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"


def test_every_matrix_model_renders_with_its_architecture(tmp_path: Path) -> None:
    m = load(DEFAULT_MATRIX)
    for name, spec in m.models.items():
        folder = models.write(name, models.render(spec), root=tmp_path)
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"], name
        assert config["dtype"] == spec.dtype
        assert folder.name.startswith(f"{name}-")


def test_overrides_change_the_folder_and_content(tmp_path: Path) -> None:
    plain = ModelSpec(family="gdn", config="qwen3-next.json")
    wide = ModelSpec(family="gdn", config="qwen3-next.json", overrides={"linear_key_head_dim": 128})
    a = models.write("q", models.render(plain), root=tmp_path)
    b = models.write("q", models.render(wide), root=tmp_path)
    assert a != b
    assert json.loads((b / "config.json").read_text())["linear_key_head_dim"] == 128
    assert models.write("q", models.render(plain), root=tmp_path) == a  # stable for the same config


def test_rewrites_a_damaged_config(tmp_path: Path) -> None:
    spec = ModelSpec(family="dense", config="llama.json")
    folder = models.write("llama", models.render(spec), root=tmp_path)
    (folder / "config.json").write_text("{")
    models.write("llama", models.render(spec), root=tmp_path)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    assert not list(folder.glob(".config-*"))  # no temp files left behind


def test_unknown_shipped_config_lists_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match=r"granite-hybrid-4l\.json"):
        models.shipped_config("nope.json")


def test_cache_root_honours_env(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVRIG_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path


def test_cpu_safe_dimensions_in_shipped_configs() -> None:
    """CPU attention kernels take head sizes 32, 64, 80, ...; GDN keys 64 or 128 (MLA
    layers keep a latent, not heads; an attention-free model has none)."""
    m = load(DEFAULT_MATRIX)
    for name, spec in m.models.items():
        config = models.render(spec)
        if spec.family in (*vllm_models.MLA_FAMILIES, vllm_models.Family.MAMBA):
            continue
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        assert head in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512), name
        if spec.family == "gdn":
            assert config["linear_key_head_dim"] in (64, 128), name


def test_a_users_own_config_beside_the_matrix_is_used(tmp_path: Path) -> None:
    (tmp_path / "mine.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    spec = ModelSpec(family="dense", config="mine.json", overrides={"num_hidden_layers": 2})
    config = models.render(spec, tmp_path)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2
    with pytest.raises(FileNotFoundError, match=r"no shipped model config 'mine\.json'"):
        models.render(spec)  # without the matrix's folder only shipped configs are known
