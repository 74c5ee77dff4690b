"""The container run's check: every cell back on the host, passing, naming its image, and
judged as the host judged it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvrig.define.matrix import load
from kvrig.publish import container_check as cc
from kvrig.publish import results as results_mod

from ..builders import BASE, cells_of, gpu_matrix

CELLS = cells_of(BASE)
IMAGE = {"image": "kvrig-cpu:0.1.0-abc", "image_digest": "sha256:123"}


def row(cell_id: str, status: str = "pass", **extra: Any) -> dict[str, Any]:
    return {
        "cell_id": cell_id,
        "status": status,
        "reason": "r",
        "outcome": "ran",
        "worker_block_size": 384,
        "engine_block_size": 384,
        "kernel_block_sizes": [384],
        **extra,
    }


def good() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    rows = [row(c.id) for c in CELLS]
    records = {c.id: {"cell_id": c.id, "host": dict(IMAGE)} for c in CELLS}
    return rows, records


def test_a_complete_passing_run_has_no_problems() -> None:
    rows, records = good()
    assert cc.check(CELLS, rows, records, rows, "kvrig-cpu:") == []


def test_no_results_at_all() -> None:
    assert cc.check(CELLS, [], {}) == [
        "no results came back from the container (results.jsonl is missing or empty)"
    ]


def test_missing_failing_and_unnamed_cells_are_each_reported() -> None:
    rows, records = good()
    missing, failing = CELLS[0].id, CELLS[1].id
    rows = [r if r["cell_id"] != failing else row(failing, "fail") for r in rows[1:]]
    records[failing]["host"] = {}
    problems = cc.check(CELLS, rows, records, (), "kvrig-cpu:")
    assert f"{missing}: no result came back from the container" in problems
    assert any(p.startswith(f"{failing}: fail in the container") for p in problems)
    assert any(p.startswith(f"{failing}: its record does not name the image") for p in problems)


def test_a_cell_judged_differently_from_the_host() -> None:
    rows, records = good()
    host = [dict(r) for r in rows]
    host[0]["engine_block_size"] = 288
    problems = cc.check(CELLS, rows, records, host, "kvrig-cpu:")
    assert problems == [
        f"{CELLS[0].id}: differs from the host's run in engine_block_size (288 on the host)"
    ]


def test_a_folder_is_read_and_checked(tmp_path: Path, write_matrix: Any, capsys: Any) -> None:
    matrix = load(write_matrix(BASE))
    rows, records = good()
    folder = tmp_path / "cpu-container"
    for r in rows:
        results_mod.append(folder, r)
    for cell_id, rec in records.items():
        (folder / "records").mkdir(exist_ok=True)
        (folder / "records" / f"{cell_id}.json").write_text(json.dumps(rec))
    assert cc.check_folder(folder, matrix) == 0
    assert "container results ok: 2 cpu cells" in capsys.readouterr().out
    (folder / "records" / f"{CELLS[0].id}.json").unlink()
    assert cc.check_folder(folder, matrix) == 1


def test_partial_checks_only_the_cells_that_ran(tmp_path: Path, write_matrix: Any) -> None:
    matrix = load(write_matrix(BASE))
    folder = tmp_path / "cpu-container"
    results_mod.append(folder, row(CELLS[0].id))
    (folder / "records").mkdir()
    record = {"cell_id": CELLS[0].id, "host": dict(IMAGE)}
    (folder / "records" / f"{CELLS[0].id}.json").write_text(json.dumps(record))
    assert cc.check_folder(folder, matrix) == 1
    assert cc.check_folder(folder, matrix, partial=True) == 0


def _container_run(folder: Path, cells: list[str], engine_block_size: int = 384) -> None:
    """What a container run leaves in its results folder."""
    for cell_id in cells:
        results_mod.append(folder, row(cell_id, engine_block_size=engine_block_size))
        (folder / "records").mkdir(exist_ok=True)
        record = {"cell_id": cell_id, "host": dict(IMAGE)}
        (folder / "records" / f"{cell_id}.json").write_text(json.dumps(record))


def test_the_container_run_goes_to_a_fresh_folder_and_is_held_to_the_hosts(
    tmp_path: Path, write_matrix: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    matrix = write_matrix(BASE)
    stale = tmp_path / "results" / "cpu-container"
    _container_run(stale, [c.id for c in CELLS])  # an earlier run's rows must not count
    launched: list[list[str]] = []

    def launch(argv: list[str]) -> int:
        launched.append(list(argv))
        folder = Path(argv[argv.index("--results") + 1])
        assert not folder.exists(), "the container run must start from an empty folder"
        _container_run(folder, [c.id for c in CELLS])
        return 0

    assert cc.in_container([], matrix, run=launch) == 0
    assert launched == [["cpu", "--matrix", str(matrix), "--results", str(stale.resolve())]]
    # No host run: said so, never read as a comparison that passed.
    assert "NOT compared with a host run" in capsys.readouterr().out
    # With the host's own run in results/cpu, a cell judged otherwise there is red.
    _container_run(tmp_path / "results" / "cpu", [c.id for c in CELLS], engine_block_size=288)
    assert cc.in_container([], matrix, run=launch) == 1
    assert "differs from the host's run in engine_block_size" in capsys.readouterr().out


def test_pytest_arguments_reach_the_column_and_only_the_cells_that_ran_are_checked(
    tmp_path: Path, write_matrix: Any, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    matrix = write_matrix(BASE)
    launched: list[list[str]] = []

    def launch(argv: list[str]) -> int:
        launched.append(list(argv))
        _container_run(Path(argv[argv.index("--results") + 1]), [CELLS[0].id])
        return 0

    assert cc.in_container([], matrix, run=launch) == 1  # a cell missing from a full run
    assert cc.in_container(["-k", "default"], matrix, run=launch) == 0
    assert launched[-1][-2:] == ["-k", "default"]
    # A container run that failed is the check's failure, its folder left unread.
    assert cc.in_container([], matrix, run=lambda argv: 2) == 2


def test_a_known_defect_showing_as_recorded_counts_as_passing() -> None:
    rows, records = good()
    rows[0]["status"] = "xfail"
    assert cc.check(CELLS, rows, records, (), "kvrig-cpu:") == []


def test_the_emulated_cuda_column_runs_in_the_cuda_image_and_is_held_to_the_hosts(
    tmp_path: Path, write_matrix: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    data = gpu_matrix()
    matrix = write_matrix(data)
    cuda_image = {"image": "kvrig-cuda:0.1.0-abc", "image_digest": "sha256:9"}
    ids = ["cuda-sm90-emulated-granite_hybrid-c"]
    launched: list[list[str]] = []

    def launch(argv: list[str]) -> int:
        launched.append(list(argv))
        folder = Path(argv[argv.index("--results") + 1])
        for cell_id in ids:
            results_mod.append(folder, row(cell_id))
            (folder / "records").mkdir(exist_ok=True)
            record = {"cell_id": cell_id, "host": dict(cuda_image)}
            (folder / "records" / f"{cell_id}.json").write_text(json.dumps(record))
        return 0

    assert cc.in_container([], matrix, run=launch, emulate="9.0") == 0
    folder = (tmp_path / "results" / "cuda-sm90-emulated-container").resolve()
    # From the release's wheels: no registry here serves vLLM's image.
    wanted = ["cuda", "--matrix", str(matrix), "--emulate", "9.0", "--from-wheels"]
    assert launched == [[*wanted, "--results", str(folder)]]
    assert "1 cuda cells passed in the container" in capsys.readouterr().out
    # The host's own emulated run is what the image's must agree with.
    host = tmp_path / "results" / "cuda-sm90-emulated"
    results_mod.append(host, row(ids[0], engine_block_size=144))
    assert cc.in_container([], matrix, run=launch, emulate="9.0") == 1
    assert "differs from the host's run in engine_block_size (144" in capsys.readouterr().out
    ids.clear()  # a cell that never came back
    assert cc.in_container([], matrix, run=launch, emulate="9.0") == 1


def test_a_host_run_of_only_some_cells_says_how_many_were_compared(
    tmp_path: Path, write_matrix: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    matrix = write_matrix(BASE)

    def launch(argv: list[str]) -> int:
        _container_run(Path(argv[argv.index("--results") + 1]), [c.id for c in CELLS])
        return 0

    _container_run(tmp_path / "results" / "cpu", [CELLS[0].id])
    assert cc.in_container([], matrix, run=launch) == 0
    out = capsys.readouterr().out
    assert f"for 1 of them ({len(CELLS) - 1} not run on the host, so not compared)" in out


def test_a_skip_counts_only_for_a_module_the_cells_model_needs_and_the_image_lacks() -> None:
    from kvrig.define.cells import expand, with_needs_met
    from kvrig.provision.install import missing_module_hint

    from ..builders import ROOT

    cells = expand(load(ROOT / "matrix.yaml"), "cpu")
    qwen35 = next(c for c in cells if c.id == "cpu-qwen35_4b-default")
    granite = next(c for c in cells if c.id == "cpu-granite_hybrid-default")
    [lacking] = with_needs_met([qwen35], lambda m: False, missing_module_hint)
    records = {c.id: {"cell_id": c.id, "host": dict(IMAGE)} for c in (qwen35, granite)}
    said = lacking.expect.reason
    assert cc.check([qwen35], [row(qwen35.id, "skip", reason=said)], records) == []
    # Skipped for another reason, or a model that needs nothing skipped for this one: red.
    assert cc.check([qwen35], [row(qwen35.id, "skip", reason="timed out")], records)
    assert cc.check([granite], [row(granite.id, "skip", reason=said)], records)
