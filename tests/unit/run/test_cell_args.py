from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvrig.run.cell import cell_env, craft_spec, engine_kwargs
from kvrig.run.vllm_plugin.crafted import CraftSpec

from ..builders import cell_with, gpu_matrix

RUNS = {"outcome": "runs"}


def test_engine_kwargs_are_offline_and_tiny() -> None:
    kw = engine_kwargs(cell_with(RUNS), Path("/m"))
    assert kw["model"] == "/m"
    assert kw["load_format"] == "dummy"
    assert kw["skip_tokenizer_init"] is True
    assert kw["enforce_eager"] is True
    assert "block_size" not in kw
    assert "attention_config" not in kw


def test_knobs_reach_the_engine() -> None:
    knobs = {
        "block_size": 32,
        "enable_prefix_caching": False,
        "mamba_ssm_cache_dtype": "bfloat16",
        "attention_backend": "TRITON_ATTN",
    }
    kw = engine_kwargs(cell_with(RUNS, knobs=knobs), Path("/m"))
    assert kw["block_size"] == 32
    assert kw["enable_prefix_caching"] is False
    assert kw["mamba_ssm_cache_dtype"] == "bfloat16"
    assert kw["attention_config"] == {"backend": "TRITON_ATTN"}


def test_custom_route_selects_custom(base) -> None:
    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix

    base["platforms"]["cpu"]["crafted_route"] = "custom"
    base["cases"][0]["crafted"] = {"replace": {"name": "KVRIG_EXACT", "sizes": [16]}}
    cell = expand(Matrix.model_validate(base), "cpu")[0]
    assert engine_kwargs(cell, Path("/m"))["attention_config"] == {"backend": "CUSTOM"}
    spec = craft_spec(cell)
    assert spec.route == "custom"
    assert spec.replace.base == "CPU_ATTN"


def test_env_turns_plugin_on_and_hub_off(tmp_path: Path) -> None:
    crafted = {"siblings": [{"name": "S", "layers": "model.layers.3.", "sizes": [32]}]}
    env = cell_env(cell_with(RUNS, crafted=crafted), tmp_path, base={"KVRIG_CRAFT": "stale"})
    assert env["VLLM_PLUGINS"] == "kvrig"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["KVRIG_PROBE_FILE"] == str(tmp_path / "probe.jsonl")
    spec = CraftSpec.from_json(env["KVRIG_CRAFT"])
    assert spec.siblings[0].base == "CPU_ATTN"
    assert spec.siblings[0].exact is True
    assert spec.siblings[0].layers == "model.layers.3."


def test_env_without_crafting_clears_a_stale_spec(tmp_path: Path) -> None:
    env = cell_env(cell_with(RUNS), tmp_path, base={"KVRIG_CRAFT": "stale"})
    assert "KVRIG_CRAFT" not in env


def test_multiprocessing_knob_sets_vllm_env(tmp_path: Path) -> None:
    env = cell_env(cell_with(RUNS, knobs={"multiprocessing": True}), tmp_path, base={})
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_replacement_target_follows_the_case_backend() -> None:
    cell = cell_with(
        RUNS,
        knobs={"attention_backend": "TRITON_ATTN"},
        crafted={"replace": {"name": "E", "sizes": [16]}},
    )
    assert craft_spec(cell).replace.base == "TRITON_ATTN"
    cell = cell_with(
        RUNS, crafted={"replace": {"name": "E", "sizes": [16], "target": "FLASH_ATTN"}}
    )
    assert craft_spec(cell).replace.base == "FLASH_ATTN"


def test_craft_spec_round_trips() -> None:
    cell = cell_with(
        RUNS,
        crafted={
            "replace": {"name": "E", "sizes": [16, 32], "exact": False},
            "siblings": [{"name": "S", "layers": "a.", "sizes": [8], "base": "FLASHMLA_SPARSE"}],
        },
    )
    spec = craft_spec(cell)
    assert CraftSpec.from_json(spec.to_json()) == spec
    assert json.loads(spec.to_json())["siblings"][0]["base"] == "FLASHMLA_SPARSE"
    assert craft_spec(cell_with(RUNS)) is None


def test_tensor_parallelism_gets_a_process_per_rank_and_a_core_each(tmp_path: Path) -> None:
    cell = cell_with(RUNS, knobs={"tensor_parallel_size": 2})
    kw = engine_kwargs(cell, Path("/m"))
    assert kw["tensor_parallel_size"] == 2
    assert kw["distributed_executor_backend"] == "mp"
    assert cell_env(cell, tmp_path, base={})["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    one = cell_with(RUNS)
    assert "distributed_executor_backend" not in engine_kwargs(one, Path("/m"))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cell_env(one, tmp_path, base={})


def test_a_crafted_backend_on_rocm_builds_on_the_backend_its_target_selects() -> None:
    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix

    data = gpu_matrix(crafted={"siblings": [{"name": "S", "layers": "a.", "sizes": [32]}]})
    data["platforms"]["rocm"] = {
        "vllm": {"kind": "pypi", "package": "vllm", "version": "0.34.0"},
        "base_image": "rocm/dev-ubuntu-24.04:7.0-complete",
        "default_backend": "ROCM_ATTN",
        "crafted_route": "custom",
    }
    data["cases"][0]["expect"] = {"rocm": {"outcome": "runs"}}
    matrix = Matrix.model_validate(data)
    bases = {
        arch: craft_spec(expand(matrix, "rocm", gpu_arch=arch)[0]).siblings[0].base
        for arch in ("gfx942", "gfx950", "gfx1201")
    }
    # vLLM 0.34.0 puts TRITON_ATTN ahead of ROCM_ATTN on gfx1201 (kvrig.rules.rocm).
    assert bases == {"gfx942": "ROCM_ATTN", "gfx950": "ROCM_ATTN", "gfx1201": "TRITON_ATTN"}


class _AttentionBackendLike:
    """Stands in for vLLM's AttentionBackend: a plain size means any multiple of it."""

    sizes: tuple[int, ...] = ()

    @classmethod
    def get_supported_kernel_block_sizes(cls) -> list[int]:
        return list(cls.sizes)

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        sizes = cls.get_supported_kernel_block_sizes()
        return block_size is None or not sizes or any(block_size % s == 0 for s in sizes)


class _AnyMultipleOf16(_AttentionBackendLike):
    """As TRITON_ATTN: its own rule (any multiple of 16) in place of the declared sizes'."""

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size % 16 == 0


def _vllm_base(monkeypatch: pytest.MonkeyPatch, base: Any) -> None:
    """crafted.need answering for vLLM's AttentionBackend (no vLLM in the unit tests)."""
    from kvrig.run.vllm_plugin import crafted
    from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol

    def need(dotted: str, user: str) -> Any:
        if base is None:
            raise MissingVllmSymbol(dotted, user, "class AttentionBackend has no such rule")
        assert dotted == f"{crafted.BACKEND_BASE}.supports_block_size"
        return base.supports_block_size

    monkeypatch.setattr(crafted, "need", need)


def test_a_plain_crafted_backend_keeps_vllms_reading_of_its_sizes_over_its_bases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvrig.run.vllm_plugin.crafted import BackendSpec, make_backend

    _vllm_base(monkeypatch, _AttentionBackendLike)
    plain = make_backend(_AnyMultipleOf16, BackendSpec("KVRIG_T_PLAIN", (24,), False, "X"))
    assert plain.supports_block_size(48) and plain.supports_block_size(72)
    assert not plain.supports_block_size(64)  # the base's own rule would take it
    exact = make_backend(_AnyMultipleOf16, BackendSpec("KVRIG_T_EXACT", (32,), True, "X"))
    assert exact.supports_block_size(32) and not exact.supports_block_size(64)


def test_a_release_without_vllms_base_rule_names_it_instead_of_guessing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvrig.run.vllm_plugin.crafted import BackendSpec, make_backend
    from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol

    _vllm_base(monkeypatch, None)
    with pytest.raises(MissingVllmSymbol, match=r"AttentionBackend\.supports_block_size"):
        make_backend(_AnyMultipleOf16, BackendSpec("KVRIG_T_NONE", (24,), False, "X"))


def test_a_sibling_takes_a_layer_handed_the_backend_it_is_built_over_and_no_other() -> None:
    """DeepSeek-V3.2's sparse MLA on ROCm is handed ROCM_AITER_MLA_SPARSE by the model; a
    sibling over it stands in for it there, and one over another backend does not."""
    from kvrig.run.vllm_plugin.crafted import _with_siblings

    class Named:
        @staticmethod
        def is_mla() -> bool:
            return True

    class Other(Named):
        pass

    class Sibling(Named):
        pass

    seen: list[Any] = []
    init = _with_siblings(
        lambda self, **kw: seen.append(kw.get("attn_backend")), [("model.layers.1.", Sibling)]
    )

    class MLAAttention:
        pass

    for given, routed in ((None, Sibling), (Named, Sibling), (Other, Other)):
        seen.clear()
        init(MLAAttention(), prefix="model.layers.1.self_attn.attn", attn_backend=given)
        assert seen == [routed], given
    seen.clear()
    init(MLAAttention(), prefix="model.layers.0.self_attn.attn", attn_backend=Named)
    assert seen == [Named]
