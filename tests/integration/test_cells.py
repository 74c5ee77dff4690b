"""Each matrix cell of the host's platform: a real engine, judged against its expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig import results
from kvrig.matrix import Cell
from kvrig.runner import run_cell
from kvrig.verdict import judge

LOG_LINES_ON_FAILURE = 40


def _log_tail(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "(no log)"
    lines = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(lines[-LOG_LINES_ON_FAILURE:])


def test_cell(cell: Cell, results_dir: Path) -> None:
    record = run_cell(cell, results_dir)
    verdict = judge(cell, record)
    results.append(results_dir, results.row(cell, record, verdict))
    if verdict.status == "skip":
        pytest.skip(verdict.reason)
    if verdict.status == "xfail":
        pytest.xfail(verdict.reason)  # a known vLLM defect, showing exactly as recorded
    assert verdict.passed, (
        f"{cell.id}: {verdict.reason}\n"
        f"record: {results_dir / 'records' / (cell.id + '.json')}\n"
        f"log ({record.log}), last {LOG_LINES_ON_FAILURE} lines:\n{_log_tail(record.log)}"
    )
