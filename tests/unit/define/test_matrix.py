from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvrig.define.cells import expand
from kvrig.define.matrix import MatrixError, load

from ..builders import ROOT, cells_of

DEFAULT_MATRIX = ROOT / "matrix.yaml"


def test_shipped_matrix_is_valid_and_has_the_required_cpu_cells() -> None:
    m = load(DEFAULT_MATRIX)
    ids = {c.id for c in expand(m, "cpu")}
    for family_model in ("granite_hybrid", "qwen3_next"):
        for case in (
            "default",
            "user_block_size",
            "prefix_caching_off",
            "exact_rejects",
            "sibling_rejects",
            "sibling_accepts",
            "sibling_divides",
        ):
            assert f"cpu-{family_model}-{case}" in ids
    assert "cpu-deepseek_v32-default" in ids
    assert any(i.startswith("cpu-llama-") for i in ids)
    assert any(i.startswith("cpu-nemotron_h-") for i in ids)


def test_cell_ids_read_platform_model_case(base) -> None:
    assert [c.id for c in cells_of(base)] == [
        "cpu-granite_hybrid-default",
        "cpu-granite_hybrid-sibling_rejects",
    ]


def test_expand_filters_by_platform_and_refuses_unknown(base) -> None:
    from kvrig.define.matrix import Matrix

    m = Matrix.model_validate(base)
    assert expand(m, "cuda") == []
    with pytest.raises(MatrixError, match="Unknown platform 'tpu'"):
        expand(m, "tpu")


def _error(write_matrix, data=None, text=None) -> str:
    path = write_matrix(data, text)
    with pytest.raises(MatrixError) as info:
        load(path)
    msg = str(info.value)
    assert "\n" not in msg, "one paragraph"
    assert str(path) in msg
    return msg


def test_unknown_key_is_named_with_its_line(write_matrix, base) -> None:
    base["cases"][0]["blok_size"] = 32
    msg = _error(write_matrix, base)
    assert "cases.0.blok_size" in msg
    assert "unknown key 'blok_size'" in msg
    assert re.search(r"matrix\.yaml:\d+:", msg)


def test_wrong_type_names_field_and_value(write_matrix, base) -> None:
    base["cases"][0]["knobs"] = {"block_size": "big"}
    msg = _error(write_matrix, base)
    assert "cases.0.knobs.block_size" in msg
    assert "'big'" in msg


def test_case_naming_unknown_model(write_matrix, base) -> None:
    base["cases"][1]["model"] = "gpt5"
    msg = _error(write_matrix, base)
    assert "unknown model 'gpt5'" in msg
    assert "granite_hybrid" in msg


def test_crafted_backend_without_sizes(write_matrix, base) -> None:
    del base["cases"][1]["crafted"]["siblings"][0]["sizes"]
    msg = _error(write_matrix, base)
    assert "cases.1.crafted.siblings.0.sizes" in msg
    assert "missing" in msg


def test_crafted_backend_with_empty_sizes(write_matrix, base) -> None:
    base["cases"][1]["crafted"]["siblings"][0]["sizes"] = []
    assert "sizes" in _error(write_matrix, base)


def test_yaml_syntax_error_names_line(write_matrix) -> None:
    msg = _error(write_matrix, text="version: 1\nplatforms: {cpu: [\n  bad\nmodels: x\n")
    assert "not valid YAML" in msg
    assert re.search(r"matrix\.yaml:\d+", msg)


def test_unknown_outcome(write_matrix, base) -> None:
    base["cases"][0]["expect"]["cpu"] = {"outcome": "works"}
    msg = _error(write_matrix, base)
    assert "outcome must be one of" in msg


def test_expectation_for_undefined_platform(write_matrix, base) -> None:
    base["cases"][0]["expect"]["xpu"] = {"outcome": "runs"}
    assert "platform 'xpu' is not defined" in _error(write_matrix, base)


def test_duplicate_case_and_bad_regex(write_matrix, base) -> None:
    base["cases"].append(dict(base["cases"][0]))
    assert "repeats" in _error(write_matrix, base)
    base["cases"].pop()
    base["cases"][0]["expect"]["cpu"] = {"outcome": "late_error", "match": "("}
    msg = _error(write_matrix, base)
    assert "cases.0.expect.cpu.match" in msg


def test_pypi_source_needs_a_version(write_matrix, base) -> None:
    del base["platforms"]["cpu"]["vllm"]["version"]
    assert "needs 'version'" in _error(write_matrix, base)


def test_missing_file_and_non_mapping(tmp_path: Path, write_matrix) -> None:
    with pytest.raises(MatrixError, match="cannot read the matrix file"):
        load(tmp_path / "nope.yaml")
    assert "must be a mapping" in _error(write_matrix, text="- 1\n- 2\n")


def test_multiprocessing_knob_overrides_platform(base) -> None:
    base["cases"][0]["knobs"] = {"multiprocessing": True}
    cells = cells_of(base)
    assert cells[0].multiprocessing is True
    assert cells[1].multiprocessing is False


def test_every_case_names_the_review_statement_it_stands_for() -> None:
    missing = [f"{c.model}/{c.id}" for c in load(DEFAULT_MATRIX).cases if not c.review.strip()]
    assert not missing


def test_a_known_defect_must_stand_against_an_expectation(base, write_matrix) -> None:
    base["cases"][0]["known_defect"] = {
        "reason": "r",
        "shows": {"cuda": {"outcome": "early_error", "backends": ["X"]}},
    }
    base["platforms"]["cuda"] = base["platforms"]["cpu"]
    with pytest.raises(MatrixError, match="no expectation on 'cuda'"):
        load(write_matrix(base))


def test_shape_faithful_miniatures_name_checkpoint_and_source() -> None:
    faithful = {n: m for n, m in load(DEFAULT_MATRIX).models.items() if m.checkpoint}
    assert {m.family for m in faithful.values()} >= {"hybrid_mamba", "gdn", "dsa"}
    assert all(m.source.strip() for m in faithful.values())


def refusal(path: Path, needle: str) -> tuple[int, str]:
    """The line of the file that holds `needle`, and the paragraph loading it gives."""
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)
    with pytest.raises(MatrixError) as err:
        load(path)
    return line, str(err.value)


def test_a_model_config_that_does_not_exist_is_refused_at_its_line(write_matrix, base) -> None:
    base["models"]["llama"]["config"] = "lama.json"
    path = write_matrix(base)
    line, msg = refusal(path, "lama.json")
    assert msg.startswith(f"{path}:{line}: the matrix is invalid at models.llama.config")
    assert "no config file 'lama.json'" in msg
    assert "granite-hybrid-4l.json" in msg  # the shipped ones are named


def test_a_model_config_may_lie_beside_the_matrix(write_matrix, base, tmp_path) -> None:
    own = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 3,
        "num_key_value_heads": 1,
        "head_dim": 64,
    }
    (tmp_path / "own.json").write_text(json.dumps(own))
    base["models"]["llama"]["config"] = "own.json"
    base["cases"].append({"id": "own", "model": "llama", "expect": {"cpu": {"outcome": "runs"}}})
    from kvrig.define.cells import expand

    cells = {c.id: c for c in expand(load(write_matrix(base)), "cpu")}
    assert cells["cpu-llama-own"].config == {
        **own,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


@pytest.mark.parametrize(
    "where",
    [
        ("platforms", "cpu", "default_backend"),
        ("cases", 1, "crafted", "siblings", 0, "base"),
    ],
)
def test_an_unknown_backend_name_is_refused_at_its_line(write_matrix, base, where) -> None:
    node = base
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = "NOPE_ATTN"
    path = write_matrix(base)
    line, msg = refusal(path, "NOPE_ATTN")
    assert msg.startswith(f"{path}:{line}: the matrix is invalid at {'.'.join(map(str, where))}")
    assert "'NOPE_ATTN' is not one of vLLM's attention backends" in msg


def test_a_sibling_prefix_that_matches_no_attention_layer_is_refused(write_matrix, base) -> None:
    # granite-hybrid-4l: mamba, attention, mamba, attention; layer 2 is a Mamba layer.
    base["cases"][1]["crafted"]["siblings"][0]["layers"] = "model.layers.2."
    path = write_matrix(base)
    with pytest.raises(MatrixError) as err:
        load(path)
    msg = str(err.value)
    assert "cases.1.crafted.siblings.0.layers: 'model.layers.2.' matches no attention layer" in msg
    assert "its attention layers: model.layers.1., model.layers.3." in msg
