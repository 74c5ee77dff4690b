"""The reach report from coverage data laid out as a reach run leaves it (real coverage.py
data files, written here with the arcs a cell would have taken): which rows are reached
and by which cell, what is listed apart, the figure, and the exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from coverage import CoverageData

from kvrig.define import reach_table
from kvrig.publish.reach import check, measured, render, report
from kvrig.run import reach as hook

SOURCE = """\
class Platform:
    def update(self, config):
        if not config.user_size:
            config.size = 64
        if config.hybrid:
            config.size = 96
        return config.size

    def pick(self):
        return 16 if self.rocm else 64
"""
OLD_SOURCE = SOURCE.replace("config.size = 96", "config.size = 128")
TABLE = reach_table.parse(
    """
release: "0.34.0"
rows:
  - {n: 1, file: platforms/interface.py, function: Platform.update, what: phase 1,
     arms: [{at: "if not config.user_size:", arm: "true"}], class: reachable, reason: a default}
  - {n: 2, file: platforms/interface.py, function: Platform.update, what: user size,
     arms: [{at: "if not config.user_size:", arm: "false"}], class: reachable, reason: --block-size}
  - {n: 3, file: platforms/interface.py, function: Platform.update, what: hybrid,
     arms: [{at: "config.size = 96", arm: line}], class: reachable, reason: a hybrid}
  - {n: 4, file: platforms/interface.py, function: Platform.pick, what: rocm,
     arms: [{at: "return 16 if self.rocm else 64", arm: line, platforms: [rocm]}],
     class: reachable, reason: ROCm}
  - {n: 5, file: platforms/interface.py, function: Platform.update, what: both in one cell,
     together: true, class: reachable, reason: a default hybrid,
     arms: [{at: "config.size = 64", arm: line}, {at: "config.size = 96", arm: line}]}
  - {n: 6, file: platforms/gone.py, function: f, what: another file, class: dead,
     arms: [{at: "x", arm: line}], reason: never}
  - {n: 7, file: platforms/interface.py, function: Platform.update, what: the return,
     arms: [{at: "return config.size", arm: line}], class: hardware, reason: a device}
"""
)
# Arcs of platforms/interface.py as cells take them (lines of SOURCE).
DEFAULT_DENSE = [(-2, 3), (3, 4), (4, 5), (5, 7), (7, -2)]
USER_HYBRID = [(-2, 3), (3, 5), (5, 6), (6, 7), (7, -2)]
PICK = [(-9, 10), (10, -9)]


def vllm_tree(root: Path, version: str, source: str) -> Path:
    tree = root / f"site-{version}" / "vllm"
    (tree / "platforms").mkdir(parents=True)
    (tree / "platforms" / "interface.py").write_text(source)
    return tree


def cell(
    results: Path, cell_id: str, tree: Path, version: str, platform: str, *processes: list
) -> None:
    """What kvrig.run.reach leaves for a cell: a data file per process, and its meta."""
    folder = hook.data_folder(results)
    folder.mkdir(parents=True, exist_ok=True)
    for i, arcs in enumerate(processes):
        data = CoverageData(basename=str(folder / f"{cell_id}{hook.DATA_SUFFIX}.host.pid{i}"))
        data.add_arcs({str(tree / "platforms" / "interface.py"): arcs})
        data.write()
    meta = {"cell": cell_id, "platform": platform, "vllm": version, "vllm_root": str(tree)}
    (folder / f"{cell_id}{hook.META_SUFFIX}").write_text(json.dumps(meta))
    with (results / "results.jsonl").open("a") as rows:
        rows.write(json.dumps({"cell_id": cell_id, "outcome": "ran"}) + "\n")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A reach run: a CUDA column on the table's release, a ROCm one, a CPU one on an
    older vLLM whose source moved the hybrid line, and a CPU cell that left nothing."""
    new = vllm_tree(tmp_path, "0.34.0", SOURCE)
    old = vllm_tree(tmp_path, "0.32.0", OLD_SOURCE)
    root = tmp_path / "reach"
    cuda = root / "cuda-sm90-emulated"
    cell(cuda, "cuda-sm90-emulated-llama-default", new, "0.34.0", "cuda", DEFAULT_DENSE, PICK)
    cell(
        cuda,
        "cuda-sm90-emulated-granite-user",
        new,
        "0.34.0",
        "cuda",
        USER_HYBRID[:2],
        USER_HYBRID[2:],
    )
    cell(root / "rocm-gfx942-emulated", "rocm-gfx942-emulated-dsa", new, "0.34.0", "rocm", PICK)
    cell(root / "cpu", "cpu-granite-default", old, "0.32.0", "cpu", DEFAULT_DENSE)
    with (root / "cpu" / "results.jsonl").open("a") as rows:
        rows.write(json.dumps({"cell_id": "cpu-crashed", "outcome": "crashed"}) + "\n")
        rows.write(json.dumps({"cell_id": "cpu-skipped", "outcome": "skipped"}) + "\n")
    return root


def by_row(
    root: Path, minimum: float | None = None
) -> tuple[check.Outcome, dict[int, report.Verdict]]:
    outcome = check.evaluate(root, minimum, TABLE)
    return outcome, {v.branch.n: v for v in outcome.verdicts}


def test_a_reached_row_names_the_cells_that_take_it(run: Path) -> None:
    _, rows = by_row(run)
    assert rows[1].reached
    assert rows[1].by == ("cuda-sm90-emulated-llama-default", "cpu-granite-default (vLLM 0.32.0)")
    assert rows[1].where == "platforms/interface.py:3"
    assert rows[2].by == ("cuda-sm90-emulated-granite-user",)  # its processes together


def test_an_arm_one_release_lacks_is_named_with_that_release(run: Path) -> None:
    _, rows = by_row(run)
    assert rows[3].reached and rows[3].by == ("cuda-sm90-emulated-granite-user",)
    assert rows[3].missing == (
        "not in vLLM 0.32.0: 'config.size = 96' is found nowhere in Platform.update",
    )


def test_an_arm_kept_to_a_platform_counts_its_cells_only(run: Path) -> None:
    _, rows = by_row(run)
    assert rows[4].by == ("rocm-gfx942-emulated-dsa",)  # the CUDA cell ran the line too


def test_a_row_asking_for_one_cell_is_not_reached_by_two(run: Path) -> None:
    _, rows = by_row(run)
    assert not rows[5].reached  # the default took 64, the hybrid 96: no cell took both
    assert report.status(rows[5]) == "NOT REACHED"
    assert report.detail(rows[5]) == (
        "needs a default hybrid; not in vLLM 0.32.0: 'config.size = 96' is found nowhere in"
        " Platform.update"
    )


def test_rows_no_cell_can_take_are_listed_apart_and_flagged_when_taken(run: Path) -> None:
    _, rows = by_row(run)
    assert report.status(rows[6]) == "DEAD"
    assert "not in vLLM 0.34.0: no file platforms/gone.py" in rows[6].missing
    assert rows[7].contradicts and report.status(rows[7]) == "REACHED (hardware!)"


def test_the_figure_counts_reachable_rows_overall_and_by_column(run: Path) -> None:
    outcome, rows = by_row(run)
    verdicts = list(rows.values())
    assert str(report.figure(verdicts)) == "4 of 5 reachable branches reached (80.0%)"
    assert report.figure(verdicts, "cuda-sm90-emulated").reached == 3
    assert report.figure(verdicts, "rocm-gfx942-emulated").reached == 1
    assert report.figure(verdicts, "cpu").reached == 1
    assert outcome.code == 0


def test_the_report_says_what_was_not_measured(run: Path) -> None:
    outcome, _ = by_row(run)
    text = "\n".join(outcome.lines)
    assert "cpu: 1 cell(s) ran and left no coverage: cpu-crashed" in text
    assert "1 branch(es) taken though classed as none can be: #7" in text
    page = (run / check.MARKDOWN).read_text()
    assert "### Not reached (1)" in page and "## Dead code (no engine or CLI path) (1)" in page
    assert json.loads((run / check.JSON).read_text())["reached"] == 4


def test_a_minimum_above_the_figure_fails(run: Path) -> None:
    assert by_row(run, 80.0)[0].code == 0
    outcome, _ = by_row(run, 90.0)
    assert outcome.code == 1 and "80.0% is below the minimum of 90%" in outcome.lines[-2]


def test_a_column_whose_cells_left_no_data_fails(run: Path, tmp_path: Path) -> None:
    for data in (run / "cpu" / "coverage").glob("*.cov.*"):
        data.unlink()
    outcome, _ = by_row(run)
    assert outcome.code == 1
    assert "the cpu column's cells left no coverage data" in "\n".join(outcome.lines)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check.evaluate(empty, None, TABLE).code == 1


def test_a_column_whose_vllm_is_gone_fails_and_says_to_run_it_again(run: Path) -> None:
    assert by_row(run)[0].code == 0
    shutil.rmtree(run.parent / "site-0.32.0" / "vllm")
    outcome, _ = by_row(run)
    text = "\n".join(outcome.lines)
    assert outcome.code == 1
    assert "the vLLM the cpu column's cells ran" in text and "(--only cpu)" in text


def test_a_cell_that_could_not_start_coverage_is_named(run: Path) -> None:
    meta = run / "cpu" / "coverage" / "cpu-granite-default.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "error": "no coverage.py"}))
    columns = measured.read_root(run)
    assert "  cpu-granite-default: not measured: no coverage.py" in render.summary(
        check.evaluate(run, None, TABLE).verdicts, columns, "0.34.0"
    )


def test_a_measured_path_is_read_inside_its_vllm() -> None:
    assert measured.relative("/env/site/vllm/v1/core/x.py", "/env/site/vllm") == "v1/core/x.py"
    assert measured.relative("/a/vllm/b/vllm/platforms/x.py", None) == "platforms/x.py"
