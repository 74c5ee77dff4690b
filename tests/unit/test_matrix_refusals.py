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


# --- variants of the repo's matrix, refused at the line of the key they break --------------

Loc = tuple[Any, ...]


def line_at(path: Path, loc: Loc) -> int:
    """The line of the key at `loc` in the file, read with the YAML composer (not with
    the loader under test)."""
    node = yaml.compose(path.read_text())
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            key, node = next((k, v) for k, v in node.value if k.value == str(part))
            line = key.start_mark.line + 1
        else:
            node = node.value[part]
    assert line is not None
    return line


def dumped(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def refused_at(tmp_path: Path, data: dict[str, Any], loc: Loc) -> str:
    """Loading the mutated matrix is refused with a paragraph that starts at `loc`'s line
    and names its field."""
    path = dumped(tmp_path, data)
    msg = refusal(path)
    field = ".".join(str(p) for p in loc)
    assert msg.startswith(f"{path}:{line_at(path, loc)}: the matrix is invalid at {field}"), msg
    assert "Nothing was run" in msg
    return msg


def _case(data: dict[str, Any], model: str, case_id: str) -> tuple[dict[str, Any], Loc]:
    i = case_index(data, model, case_id)
    return data["cases"][i], ("cases", i)


def empty_expect(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "default")
    case["expect"] = {}
    return (*at, "expect")


def empty_shows(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "lcm_bump_rejects_exact")
    case["known_defect"]["shows"] = {}
    return (*at, "known_defect", "shows")


def _late_match(pattern: str):
    def mutate(data: dict[str, Any]) -> Loc:
        case, at = _case(data, "llama", "sibling_no_common_size")
        case["expect"]["cpu"]["match"] = pattern
        return (*at, "expect", "cpu", "match")

    return mutate


def empty_block_size_in(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "default")
    case["expect"]["cuda"]["invariants"]["block_size_in"] = []
    return (*at, "expect", "cuda", "invariants", "block_size_in")


def empty_backends_include(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "sibling_accepts")
    case["expect"]["cpu"]["invariants"]["backends_include"] = []
    return (*at, "expect", "cpu", "invariants", "backends_include")


NOTHING_DECLARED = {
    "expect: {}": empty_expect,
    "known_defect.shows: {}": empty_shows,
    "match: ''": _late_match(""),
    "match: '.*'": _late_match(".*"),
    "match: 'x*'": _late_match("x*"),
    r"match: '\d+'": _late_match(r"\d+"),
    "block_size_in: []": empty_block_size_in,
    "backends_include: []": empty_backends_include,
}


@pytest.mark.parametrize("mutate", NOTHING_DECLARED.values(), ids=list(NOTHING_DECLARED))
def test_a_declaration_that_declares_nothing_is_refused_at_its_line(tmp_path, mutate) -> None:
    data = repo_data()
    loc = mutate(data)
    refused_at(tmp_path, data, loc)
