"""The pytest plugin's collection: cells of matrix.yaml as items (no engine is started:
every run here is --collect-only, which needs no vLLM)."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import execnet.gateway_base
import pytest
import yaml

from kvrig.define.cells import expand
from kvrig.define.matrix import load

from ..builders import BASE, ROOT, cell_with

PYTEST = (sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def collect(pytester: pytest.Pytester) -> Callable[..., Done]:
    """Collects a matrix in this process (pytester), as `pytest --co` would."""

    def run(matrix: Path, *args: str) -> Done:
        result = pytester.runpytest(
            str(matrix), "--co", "-q", "-p", "no:cacheprovider", "--kvrig-platform=cpu", *args
        )
        return Done(int(result.ret), result.stdout.str(), result.stderr.str())

    return run


def ids(done: Done | subprocess.CompletedProcess) -> list[str]:
    return [ln.split("::", 1)[1] for ln in done.stdout.splitlines() if "::" in ln]


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_items_are_the_cells_of_the_column_named_by_their_ids(
    tmp_path: Path, collect: Callable[..., Done]
) -> None:
    done = collect(write(tmp_path, copy.deepcopy(BASE)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ids(done) == ["cpu-granite_hybrid-default", "cpu-granite_hybrid-sibling_rejects"]


def test_an_empty_folder_with_only_the_matrix_collects_the_column(tmp_path: Path) -> None:
    # No conftest, no tests/ folder: the installed plugin does it all.
    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    done = subprocess.run(
        [*PYTEST, "matrix.yaml", "-p", "kvrig", "--kvrig-platform=cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(ids(done)) == len(expand(load(ROOT / "matrix.yaml"), "cpu"))


def test_markers_and_keywords_select_cells(tmp_path: Path, collect: Callable[..., Done]) -> None:
    matrix = write(tmp_path, copy.deepcopy(BASE))
    assert ids(collect(matrix, "-m", "expect_early_error")) == [
        "cpu-granite_hybrid-sibling_rejects"
    ]
    assert ids(collect(matrix, "-m", "gate")) == ["cpu-granite_hybrid-default"]
    assert ids(collect(matrix, "-k", "sibling")) == ["cpu-granite_hybrid-sibling_rejects"]


def test_kvrig_cell_selects_exactly_one_id(tmp_path: Path, collect: Callable[..., Done]) -> None:
    data = copy.deepcopy(BASE)
    extra = copy.deepcopy(data["cases"][0])
    extra["id"] = "default_mp"
    data["cases"].append(extra)
    matrix = write(tmp_path, data)
    # -k matches every id it is part of; --kvrig-cell exactly one.
    assert len(ids(collect(matrix, "-k", "cpu-granite_hybrid-default"))) == 2
    assert ids(collect(matrix, "--kvrig-cell", "cpu-granite_hybrid-default")) == [
        "cpu-granite_hybrid-default"
    ]
    done = collect(matrix, "--kvrig-cell", "cpu-nope-default")
    assert done.returncode == 4
    assert "not a cell of the cpu column" in done.stderr


def test_shards_are_disjoint_parts_of_the_real_column(collect: Callable[..., Done]) -> None:
    everything = {c.id for c in expand(load(ROOT / "matrix.yaml"), "cpu")}
    one = set(ids(collect(ROOT / "matrix.yaml", "--kvrig-shard=1/2")))
    two = set(ids(collect(ROOT / "matrix.yaml", "--kvrig-shard=2/2")))
    assert one
    assert two
    assert one | two == everything
    assert not one & two


def test_a_filter_that_matches_no_cell_says_which(
    tmp_path: Path, collect: Callable[..., Done]
) -> None:
    done = collect(write(tmp_path, copy.deepcopy(BASE)), "-k", "nope", "-m", "gate")
    assert done.returncode == 5
    assert "kvrig: -k 'nope' and -m 'gate' matched no cell of the cpu column" in done.stdout


def test_a_platform_without_cells_is_an_error_naming_it(
    tmp_path: Path, collect: Callable[..., Done]
) -> None:
    data = copy.deepcopy(BASE)
    data["platforms"]["cuda"] = copy.deepcopy(data["platforms"]["cpu"])
    data["platforms"]["cuda"]["default_backend"] = "FLASH_ATTN"
    for case in data["cases"]:
        case["expect"] = {"cuda": case["expect"]["cpu"]}
    done = collect(write(tmp_path, data))
    assert done.returncode != 0
    assert "no cell for the cpu platform" in done.stderr


def test_an_unknown_cpu_class_is_refused_naming_the_known_ones(
    tmp_path: Path, collect: Callable[..., Done]
) -> None:
    done = collect(write(tmp_path, copy.deepcopy(BASE)), "--kvrig-isa", "sse4")
    assert done.returncode == 4
    assert "Unknown CPU class 'sse4'" in done.stderr
    assert "avx512_bf16" in done.stderr


def test_an_emulated_class_gets_its_own_column_ids(
    tmp_path: Path, collect: Callable[..., Done]
) -> None:
    done = collect(write(tmp_path, copy.deepcopy(BASE)), "--kvrig-isa", "avx2")
    if done.returncode == 4 and "lacks" in done.stderr:
        pytest.skip(f"this host cannot run the avx2 class: {done.stderr.strip()}")
    assert ids(done) == [
        "cpu-avx2-granite_hybrid-default",
        "cpu-avx2-granite_hybrid-sibling_rejects",
    ]


def test_pytest_in_a_checkout_runs_unit_tests_only_and_leaves_results_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    collected = [ln for ln in done.stdout.splitlines() if "::" in ln]
    assert collected
    assert all(ln.startswith("tests/unit/") for ln in collected)


FAKE_RUN = """
from kvrig.column import items
from kvrig.column.one_cell import Judged
from kvrig.judge.verdict import Status, Verdict
from kvrig.run.record import Record

VERDICTS = {
    "cpu-granite_hybrid-default": (Status.FAIL, "expected the engine to run; got crashed: SIGILL"),
    "cpu-granite_hybrid-sibling_rejects": (Status.XFAIL, "known vLLM defect: shows"),
}


def fake(cell, folder, *, pool=None, reuse=False, env_overrides=None):
    status, reason = VERDICTS[cell.id]
    rec = Record(**cell.identity(), outcome="crashed", log=None)
    row = {"cell_id": cell.id, "status": status.value, "worker_block_size": 384,
           "engine_block_size": None, "expected_block_size": 384}
    return Judged(rec, Verdict(cell.id, status, reason, 384), row, reused=False)


_real = items.run_and_judge


def pytest_configure(config):
    items.run_and_judge = fake  # items are no functions: no fixture can patch for them


def pytest_unconfigure(config):
    items.run_and_judge = _real
"""


def test_a_red_cell_reports_its_matrix_line_verdict_and_rerun_lines(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(vllm="")  # the plugin checks that vLLM is importable
    pytester.makeconftest(FAKE_RUN)
    matrix = pytester.path / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(copy.deepcopy(BASE), sort_keys=False))
    line = next(i for i, ln in enumerate(matrix.read_text().splitlines(), 1) if "id: default" in ln)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(
        str(matrix),
        "--kvrig-platform=cpu",
        f"--kvrig-results={pytester.path / 'results'}",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(failed=1, xfailed=1)
    out = result.stdout.str()
    failure = out[out.index("_ cpu-granite_hybrid-default _") :]
    first = failure.splitlines()[1]
    assert first == (
        f"matrix.yaml:{line}: cpu-granite_hybrid-default: expected the engine to run; got"
        " crashed: SIGILL"
    )
    assert "nox -s local -- --kvrig-cell cpu-granite_hybrid-default" in failure
    assert "Traceback" not in failure
    xml = junit.read_text()
    assert '<property name="cell_id" value="cpu-granite_hybrid-default"' in xml
    assert '<property name="verdict" value="fail"' in xml
    assert '<property name="block_size" value="384"' in xml


def test_an_items_markers_are_plain_text_that_xdist_can_send() -> None:
    # pytest-xdist serializes an item's keywords to the controller with execnet, which
    # refuses a str subclass such as an enum member: the column then stops with an
    # internal error before its first cell.
    cell = cell_with({"outcome": "runs"}, family="gdn", gate=True)
    from kvrig.column import items

    marks = items.markers(cell)
    assert marks == ["gdn", "expect_runs", "gate"]
    assert all(type(m) is str for m in marks)
    execnet.gateway_base.dumps(marks)
