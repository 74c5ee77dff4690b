"""Resuming a column run cut short: kvrig.column.resume, on tmp results folders."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvrig.column import resume
from kvrig.judge.verdict import Status, Verdict
from kvrig.publish import results
from kvrig.run.record import Record

from ..builders import BASE, cells_of

SELECTION = {"keyword": "", "markexpr": "", "shard": None, "cells": [], "cold": False}
COLUMN = {"column": "cpu", "isa": "amx"}
ENVIRONMENT = {"vllm": "0.32.0", "vllm_files": "aaaa", "rig": "0.1.0", "rig_files": "bbbb"}


def parts(**override: str) -> dict[str, str]:
    """A fingerprint as kvrig.column.plugin builds it, with some parts replaced."""
    base = {
        "matrix": "0123456789abcdef",
        "selection": json.dumps(SELECTION, sort_keys=True),
        "column": json.dumps(COLUMN, sort_keys=True),
        **ENVIRONMENT,
    }
    return {**base, **override}


def write_rows(folder: Path) -> list[str]:
    """Two judged cells of BASE appended to the folder's results.jsonl; their ids."""
    ids = []
    for cell in cells_of(BASE):
        rec = Record(**cell.identity(), outcome="ran", timings={"wall_s": 1.0})
        results.append(folder, results.row(cell, rec, Verdict(cell.id, Status.PASS, "ok")))
        ids.append(cell.id)
    return ids


def unfinished_run(folder: Path, fingerprint: dict[str, str]) -> list[str]:
    """A run that began with this fingerprint and was killed after two cells."""
    began = resume.start(folder, fingerprint, rerun=False)
    ids = write_rows(folder)
    assert began.state["state"] == "running"  # the setup itself, not the fact under test
    return ids


def reason_of(message: str) -> str:
    """The parts a 'not resumed' message names: "... because <parts> changed since; ..."."""
    return message.split(" because ", 1)[1].split(" changed since", 1)[0]


# --- start -----------------------------------------------------------------------------------


def test_an_unfinished_run_with_the_same_fingerprint_resumes(tmp_path: Path) -> None:
    ids = unfinished_run(tmp_path, parts())
    state = {"state": "running", "started": "2026-11-29 10:00:00 UTC", "fingerprint": parts()}
    (tmp_path / resume.RUN_FILE).write_text(json.dumps(state))  # began hours ago
    began = resume.start(tmp_path, parts(), rerun=False)
    assert began.resumed is True
    assert [r["cell_id"] for r in results.read(tmp_path)] == ids
    assert not (tmp_path / results.PREVIOUS_FILE).exists()
    assert began.message is not None
    assert began.message.startswith(
        "kvrig: resuming the unfinished run started 2026-11-29 10:00:00 UTC"
    )
    assert "2 cells already done are not run again" in began.message
    # The resumed run is the same run: it keeps its start time and is still running.
    assert began.state["started"] == "2026-11-29 10:00:00 UTC"
    saved = json.loads((tmp_path / resume.RUN_FILE).read_text())
    assert saved["state"] == "running"


def test_a_finished_run_starts_over_keeping_its_rows_as_previous(tmp_path: Path) -> None:
    ids = unfinished_run(tmp_path, parts())
    resume.finish(tmp_path, json.loads((tmp_path / resume.RUN_FILE).read_text()))
    assert json.loads((tmp_path / resume.RUN_FILE).read_text())["state"] == "finished"
    began = resume.start(tmp_path, parts(), rerun=False)
    assert began.resumed is False
    assert began.message is None
    assert not (tmp_path / results.RESULTS_FILE).exists()
    assert results.read(tmp_path) == []
    previous = results.collect([tmp_path / results.PREVIOUS_FILE]).rows
    assert [r["cell_id"] for r in previous] == ids
    assert json.loads((tmp_path / resume.RUN_FILE).read_text())["state"] == "running"


def finished_run(folder: Path, fingerprint: dict[str, str]) -> list[str]:
    """A run that began with this fingerprint, judged two cells and finished."""
    ids = unfinished_run(folder, fingerprint)
    resume.finish(folder, json.loads((folder / resume.RUN_FILE).read_text()))
    return ids


def test_keep_finished_takes_a_finished_run_with_this_fingerprint_as_it_is(
    tmp_path: Path,
) -> None:
    ids = finished_run(tmp_path, parts())
    finished_at = json.loads((tmp_path / resume.RUN_FILE).read_text())["finished"]
    began = resume.start(tmp_path, parts(), rerun=False, keep_finished=True)
    assert began.resumed is True
    assert [r["cell_id"] for r in results.read(tmp_path)] == ids
    assert not (tmp_path / results.PREVIOUS_FILE).exists()
    assert began.message is not None
    assert began.message.startswith(f"kvrig: keeping the run finished {finished_at}")
    assert "none is run" in began.message


def test_keep_finished_starts_a_finished_run_over_when_its_fingerprint_differs(
    tmp_path: Path,
) -> None:
    ids = finished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(vllm_files="cccc"), rerun=False, keep_finished=True)
    assert began.resumed is False
    assert began.message is not None
    assert began.message.startswith("kvrig: the finished run started")
    assert reason_of(began.message) == "vllm_files"
    previous = results.collect([tmp_path / results.PREVIOUS_FILE]).rows
    assert [r["cell_id"] for r in previous] == ids


def test_rerun_wins_over_keep_finished(tmp_path: Path) -> None:
    finished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(), rerun=True, keep_finished=True)
    assert began.resumed is False
    assert not (tmp_path / results.RESULTS_FILE).exists()


def test_rerun_starts_over_even_when_the_run_is_unfinished(tmp_path: Path) -> None:
    ids = unfinished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(), rerun=True)
    assert began.resumed is False
    assert began.message is None
    assert not (tmp_path / results.RESULTS_FILE).exists()
    previous = results.collect([tmp_path / results.PREVIOUS_FILE]).rows
    assert [r["cell_id"] for r in previous] == ids


@pytest.mark.parametrize(
    "changed_part",
    [
        {"vllm_files": "cccc"},
        {"column": json.dumps({"column": "cpu-avx2", "isa": "avx2"}, sort_keys=True)},
        {"matrix": "fedcba9876543210"},
        {"selection": json.dumps({**SELECTION, "shard": "1/2"}, sort_keys=True)},
        {"rig_files": "dddd"},
    ],
    ids=lambda d: next(iter(d)),
)
def test_an_unfinished_run_whose_fingerprint_differs_is_not_resumed(
    tmp_path: Path, changed_part: dict[str, str]
) -> None:
    name = next(iter(changed_part))
    ids = unfinished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(**changed_part), rerun=False)
    assert began.resumed is False
    assert began.message is not None
    assert "is not resumed" in began.message
    assert reason_of(began.message) == name
    assert not (tmp_path / results.RESULTS_FILE).exists()
    previous = results.collect([tmp_path / results.PREVIOUS_FILE]).rows
    assert [r["cell_id"] for r in previous] == ids
    # The new run remembers the new fingerprint, so running it again resumes that one.
    assert began.state["fingerprint"] == parts(**changed_part)


def test_a_message_names_every_part_that_changed(tmp_path: Path) -> None:
    unfinished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(vllm="0.33.0", vllm_files="cccc"), rerun=False)
    assert began.message is not None
    assert reason_of(began.message) == "vllm, vllm_files"


def test_rerun_with_a_changed_fingerprint_starts_over_silently(tmp_path: Path) -> None:
    unfinished_run(tmp_path, parts())
    began = resume.start(tmp_path, parts(vllm_files="cccc"), rerun=True)
    assert began.resumed is False
    assert began.message is None


def test_a_first_run_in_an_empty_folder_starts_fresh(tmp_path: Path) -> None:
    began = resume.start(tmp_path, parts(), rerun=False)
    assert began.resumed is False
    assert began.message is None
    assert not (tmp_path / results.PREVIOUS_FILE).exists()
    assert json.loads((tmp_path / resume.RUN_FILE).read_text())["fingerprint"] == parts()


@pytest.mark.parametrize("state_text", ['{"state": "runn', "not json at all\n"])
def test_an_unreadable_state_file_starts_over(tmp_path: Path, state_text: str) -> None:
    ids = write_rows(tmp_path)
    (tmp_path / resume.RUN_FILE).write_text(state_text)
    began = resume.start(tmp_path, parts(), rerun=False)
    assert began.resumed is False
    previous = results.collect([tmp_path / results.PREVIOUS_FILE]).rows
    assert [r["cell_id"] for r in previous] == ids


def test_a_running_state_without_results_starts_fresh(tmp_path: Path) -> None:
    resume.start(tmp_path, parts(), rerun=False)  # killed before any cell ended
    began = resume.start(tmp_path, parts(), rerun=False)
    assert began.resumed is False
    assert began.message is None


# --- changed ---------------------------------------------------------------------------------


def test_changed_lists_the_keys_that_differ_sorted() -> None:
    old = {"a": "1", "b": "2", "c": "3", "gone": "x"}
    new = {"a": "1", "b": "9", "c": "8", "added": "y"}
    assert resume.changed(old, new) == ["added", "b", "c", "gone"]


def test_changed_is_empty_for_the_same_fingerprint() -> None:
    assert resume.changed(parts(), parts()) == []


def test_an_old_state_without_a_fingerprint_differs_in_every_part() -> None:
    assert resume.changed({}, parts()) == sorted(parts())


# --- tree_digest -----------------------------------------------------------------------------


def _tree(folder: Path) -> Path:
    (folder / "pkg" / "sub").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "sub" / "mod.py").write_text("X = 1\n")
    return folder / "pkg"


def test_tree_digest_changes_when_a_file_content_changes(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    before = resume.tree_digest(pkg)
    (pkg / "sub" / "mod.py").write_text("X = 2\n")
    assert resume.tree_digest(pkg) != before


def test_tree_digest_changes_when_a_file_is_renamed(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    before = resume.tree_digest(pkg)
    (pkg / "sub" / "mod.py").rename(pkg / "sub" / "other.py")
    assert resume.tree_digest(pkg) != before


def test_tree_digest_is_the_same_for_the_same_files(tmp_path: Path) -> None:
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert resume.tree_digest(a) == resume.tree_digest(b)


@pytest.mark.parametrize(
    ("pattern", "cached"),
    [("*", "mod.cpython-312.pyc"), ("*.py", "stale.py")],
)
def test_tree_digest_ignores_pycache(tmp_path: Path, pattern: str, cached: str) -> None:
    pkg = _tree(tmp_path)
    before = resume.tree_digest(pkg, pattern)
    (pkg / "sub" / "__pycache__").mkdir()
    (pkg / "sub" / "__pycache__" / cached).write_bytes(b"\x00compiled")
    assert resume.tree_digest(pkg, pattern) == before


def test_tree_digest_only_reads_files_matching_the_pattern(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    before = resume.tree_digest(pkg)
    (pkg / "notes.txt").write_text("not code")
    assert resume.tree_digest(pkg) == before
    assert resume.tree_digest(pkg, "*") != before


@pytest.mark.parametrize("folder", [None, Path("/nonexistent/kvrig-test")])
def test_tree_digest_of_no_folder_is_none(folder: Path | None) -> None:
    assert resume.tree_digest(folder) == "none"


# --- fingerprint -----------------------------------------------------------------------------


def _fingerprint(matrix: Path, selection: Any = None, column: Any = None) -> dict[str, str]:
    return resume.fingerprint(
        matrix,
        SELECTION if selection is None else selection,
        COLUMN if column is None else column,
        ENVIRONMENT,
    )


def test_fingerprint_differs_only_in_matrix_when_the_file_bytes_change(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\n")
    before = _fingerprint(matrix)
    matrix.write_text("version: 1\n# a comment\n")
    assert resume.changed(before, _fingerprint(matrix)) == ["matrix"]


def test_fingerprint_of_an_unchanged_matrix_is_the_same(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\n")
    before = _fingerprint(matrix)
    # The same bytes written again (a checkout switched back, an editor's save): new times.
    matrix.unlink()
    matrix.write_text("version: 1\n")
    os.utime(matrix, (1, 1))
    after = _fingerprint(matrix)
    assert resume.changed(before, after) == []
    assert after["matrix"] == before["matrix"] != _fingerprint(tmp_path / "none.yaml")["matrix"]


def test_fingerprint_differs_only_in_selection_when_the_selection_changes(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\n")
    narrowed = {**SELECTION, "cells": ["cpu-granite_hybrid-default"]}
    assert resume.changed(_fingerprint(matrix), _fingerprint(matrix, narrowed)) == ["selection"]


@pytest.mark.parametrize(
    "column",
    [{"column": "cpu-avx2", "isa": "avx2"}, {"column": "cpu", "isa": "avx512"}],
)
def test_fingerprint_differs_only_in_column_when_the_column_changes(
    tmp_path: Path, column: dict[str, str]
) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\n")
    assert resume.changed(_fingerprint(matrix), _fingerprint(matrix, column=column)) == ["column"]


def test_fingerprint_does_not_depend_on_key_order(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("version: 1\n")
    reordered = dict(reversed(list(SELECTION.items())))
    assert _fingerprint(matrix, reordered) == _fingerprint(matrix)


def test_fingerprint_carries_the_environment_parts(tmp_path: Path) -> None:
    fp = _fingerprint(tmp_path / "matrix.yaml")
    assert {k: fp[k] for k in ENVIRONMENT} == ENVIRONMENT


def test_environment_parts_hash_the_rigs_own_files() -> None:
    env = resume.environment_parts()
    assert sorted(env) == ["rig", "rig_files", "vllm", "vllm_files", "vllm_overrides"]
    rig = resume.package_folder("kvrig")
    assert rig is not None
    assert env["rig_files"] == resume.tree_digest(rig, "*")


def test_a_resumed_run_whose_every_cell_has_its_row_starts_no_warm_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvrig.column.column_run import ColumnRun
    from kvrig.define import column_choice

    from ..builders import BASE

    cells = cells_of(BASE)
    started: list[str] = []

    class Pool:
        def prestart(self, env: dict[str, str]) -> None:
            started.append("parent")

    run = ColumnRun(None, column_choice.Choice("cpu"), cells, tmp_path, cold=False)  # type: ignore[arg-type]
    monkeypatch.setattr(run, "pool", lambda: Pool())
    run.prestart()
    assert started == ["parent"]  # a fresh run starts its parent early
    write_rows(tmp_path)
    run.resumed = True
    run.prestart()
    assert started == ["parent"]  # every cell has its row: nothing left to fork
