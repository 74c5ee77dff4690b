"""The test items: matrix.yaml as a pytest File, each cell of the column an Item.

pytest's pattern for tests written in YAML; a failure prints the cell's verdict, record,
log tail and rerun lines instead of a traceback, which would be the rig's, not vLLM's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvrig.column.column_run import COLUMN_KEY, ColumnRun
from kvrig.column.one_cell import Judged, run_and_judge
from kvrig.define.cells import Cell
from kvrig.judge.verdict import Status
from kvrig.publish import report, repro, results
from kvrig.run.forkserver import ServerError


class CellFailed(Exception):
    """A cell whose verdict is red; its message is the whole failure report."""


def failure_text(cell: Cell, judged: Judged, folder: Path, where: str) -> str:
    """What a red cell prints: where its case is, the verdict, and how to look closer."""
    rec = judged.record
    log = (rec.log and report.log_tail(Path(rec.log))) or "(no log)"
    return (
        f"{where}: {cell.id}: {judged.verdict.reason}\n"
        f"record: {folder / 'records' / (cell.id + '.json')}\n"
        f"log ({rec.log}), last {report.LOG_TAIL_LINES} lines:\n{log}\n"
        "rerun it alone:\n" + "\n".join(repro.lines(cell.id, cell.column, overlay=rec.vllm_overlay))
    )


class MatrixFile(pytest.File):
    """matrix.yaml: one item per cell of the column this run is for."""

    def collect(self) -> Iterator[CellItem]:
        run: ColumnRun = self.config.stash[COLUMN_KEY]
        for cell in run.cells:
            item = CellItem.from_parent(self, name=cell.id, cell=cell)
            for mark in markers(cell):
                item.add_marker(mark)
            yield item


def markers(cell: Cell) -> list[str]:
    """The family, the expectation, and `gate` for cells that gate a release: plain str,
    as pytest-xdist sends an item's keywords to the controller and cannot send an enum."""
    marks = [cell.model.family.value, f"expect_{cell.expect.outcome}"]
    return [*marks, "gate"] if cell.case.gate else marks


class CellItem(pytest.Item):
    """One cell: a real engine in a process of its own, judged against its expectation."""

    def __init__(self, *, cell: Cell, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cell = cell

    def runtest(self) -> None:
        run: ColumnRun = self.config.stash[COLUMN_KEY]
        judged = run_and_judge(self.cell, run.results, pool=run.pool(), reuse=run.resumed)
        row = judged.row
        self.user_properties += [
            ("cell_id", self.cell.id),
            ("verdict", row["status"]),
            ("block_size", results.block_text(row)),
            ("expected_block_size", row.get("expected_block_size")),
        ]
        status = judged.verdict.status
        if status is Status.SKIP:
            pytest.skip(judged.verdict.reason)
        if status is Status.XFAIL:
            pytest.xfail(judged.verdict.reason)  # a known vLLM defect, showing as recorded
        if status is Status.UNREAD:
            # vLLM did as expected: the column records it; the gate will not take it as a
            # pass until kvrig's rules are read for this vLLM (its row says so).
            return
        if not judged.verdict.passed:
            raise CellFailed(failure_text(self.cell, judged, run.results, self.where()))

    def where(self) -> str:
        """`matrix.yaml:<line>` of the case, relative to where pytest was started."""
        path, line, _ = self.reportinfo()
        shown = Path(path)
        with contextlib.suppress(ValueError):
            shown = shown.relative_to(self.config.invocation_params.dir)
        return f"{shown}:{line + 1}" if line is not None else str(shown)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CellFailed):
            return str(excinfo.value)
        if isinstance(excinfo.value, ServerError):  # no cell could start: say why, not where
            return f"{self.where()}: {self.cell.id}: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        source = self.cell.source or ""
        _, _, line = source.rpartition(":")
        return self.path, (int(line) - 1 if line.isdigit() else None), self.cell.id
