"""Each matrix cell of the host's platform: a real engine, judged against its expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig import report, repro, results
from kvrig.forkserver import Pool
from kvrig.matrix import Cell
from kvrig.runner import finished_record, run_cell
from kvrig.verdict import judge


def test_cell(cell: Cell, results_dir: Path, cell_pool: Pool) -> None:
    # A resumed run (see conftest) judges the record it already has instead of rerunning.
    done = finished_record(results_dir, cell.id)
    record = done or run_cell(cell, results_dir, pool=cell_pool)
    verdict = judge(cell, record)
    if done is None:
        results.append(results_dir, results.row(cell, record, verdict))
    if verdict.status == "skip":
        pytest.skip(verdict.reason)
    if verdict.status == "xfail":
        pytest.xfail(verdict.reason)  # a known vLLM defect, showing exactly as recorded
    assert verdict.passed, (
        f"{cell.id}: {verdict.reason}\n"
        f"record: {results_dir / 'records' / (cell.id + '.json')}\n"
        f"log ({record.log}), last {report.LOG_TAIL_LINES} lines:\n"
        f"{(record.log and report.log_tail(Path(record.log))) or '(no log)'}\n"
        "rerun it alone:\n" + "\n".join(repro.lines(cell.platform, cell.id))
    )
