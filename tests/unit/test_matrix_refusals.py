"""Malformed matrices are refused at load, at their line, before anything runs.

Each variant starts from the project's own matrix.yaml, so what is refused is a mistake a
maintainer can make in the real file, not in a toy one.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvrig.define.matrix import MatrixError, load

REPO_MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"


@functools.cache
def _repo_data() -> dict[str, Any]:
    return yaml.safe_load(REPO_MATRIX.read_text())


def repo_data() -> dict[str, Any]:
    """The project's matrix as plain data, a fresh copy to mutate."""
    return copy.deepcopy(_repo_data())


def refusal(path: Path) -> str:
    """The one paragraph loading `path` refuses it with (the test fails if it loads)."""
    with pytest.raises(MatrixError) as err:
        load(path)
    msg = str(err.value)
    assert "\n" not in msg, "one paragraph"
    return msg


def line_of(path: Path, needle: str, nth: int = 1) -> int:
    """The line of the nth line of the file holding `needle`."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]
    return hits[nth - 1]


def case_index(data: dict[str, Any], model: str, case_id: str) -> int:
    return next(
        i for i, c in enumerate(data["cases"]) if c["model"] == model and c["id"] == case_id
    )


def write_text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


# --- a key written twice ---------------------------------------------------------------


def test_the_repo_matrix_loads() -> None:
    assert load(REPO_MATRIX).cases


def test_a_second_model_entry_of_the_same_name_is_refused_naming_both_lines(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "  granite_hybrid_2kv:\n",
        "  llama:\n    family: hybrid_mamba\n    config: granite-hybrid-4l.json\n"
        "  granite_hybrid_2kv:\n",
        1,
    )
    path = write_text(tmp_path, text)
    first, second = line_of(path, "  llama:"), line_of(path, "  llama:", 2)
    msg = refusal(path)
    assert msg.startswith(f"{path}:{second}: the matrix repeats the key 'llama'")
    assert f"first at line {first}" in msg


def test_an_expectation_written_twice_in_a_case_is_refused(tmp_path) -> None:
    text = REPO_MATRIX.read_text()
    at = text.index("  - id: default\n    model: granite_hybrid\n")
    head, tail = text[:at], text[at:]
    tail = tail.replace(
        "    review: control\n", "    review: control\n    expect: {cpu: {outcome: runs}}\n", 1
    )
    path = write_text(tmp_path, head + tail)
    first = line_of(path, "    expect: {cpu: {outcome: runs}}")
    second = next(
        i
        for i, ln in enumerate(path.read_text().splitlines(), 1)
        if i > first and ln == "    expect:"
    )
    msg = refusal(path)
    assert msg.startswith(f"{path}:{second}: the matrix repeats the key 'expect'")
    assert f"first at line {first}" in msg


def test_a_key_repeated_inside_one_flow_mapping_is_refused(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "cpu: {outcome: runs, invariants: {block_size: 256}}",
        "cpu: {outcome: runs, invariants: {block_size: 256, block_size: 384}}",
        1,
    )
    path = write_text(tmp_path, text)
    line = line_of(path, "block_size: 256, block_size: 384")
    assert refusal(path).startswith(f"{path}:{line}: the matrix repeats the key 'block_size'")


def test_a_key_that_overrides_a_merged_one_is_not_a_repeat(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "    knobs: {block_size: 32}\n", "    knobs: &k32 {block_size: 32}\n", 1
    )
    merged = "    knobs: {<<: *k32, block_size: 32}\n"
    text = text.replace("    knobs: {block_size: 32}\n", merged, 1)
    assert "<<: *k32" in text
    assert load(write_text(tmp_path, text)).cases
