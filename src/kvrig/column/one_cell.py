"""Runs one cell and judges it into its results row: the one path every caller takes.

The pytest item, the benchmark and the mutation check all go through `run_and_judge`,
so a cell is run, recorded, judged and written the same way wherever it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.define.cells import Cell
from kvrig.judge.verdict import Verdict, judge
from kvrig.publish import results
from kvrig.run import interrupts
from kvrig.run.forkserver import Pool
from kvrig.run.record import Record
from kvrig.run.runner import Paths, run_unsaved


@dataclass(frozen=True)
class Judged:
    record: Record
    verdict: Verdict
    row: dict[str, Any]
    reused: bool  # the record of a resumed run, judged again, not run again


def run_and_judge(
    cell: Cell,
    folder: Path,
    *,
    pool: Pool | None = None,
    reuse: bool = False,
    env_overrides: dict[str, str] | None = None,
) -> Judged:
    """Runs the cell (unless `reuse` finds its finished record), judges it and appends its
    row; the row is written with the record under one held Ctrl-C, so a run cut short
    never keeps a record without its row."""
    done = finished_record(folder, cell.id) if reuse else None
    if done is not None:
        verdict = judge(cell, done)
        return Judged(done, verdict, results.row(cell, done, verdict), reused=True)
    record = run_unsaved(cell, folder, pool=pool, env_overrides=env_overrides)
    with interrupts.held():  # a Ctrl-C from here waits until the record has its row
        record.save(Paths(folder, cell.id).record)
        verdict = judge(cell, record)
        row = results.row(cell, record, verdict)
        results.append(folder, row)
    return Judged(record, verdict, row, reused=False)


def finished_record(folder: Path, cell_id: str) -> Record | None:
    """The record of a cell this run already finished (it has a results row and a record
    that reads back), so a resumed run need not start it again."""
    if not any(r.get("cell_id") == cell_id for r in results.read(folder)):
        return None
    try:
        return Record.load(Paths(folder, cell_id).record)
    except (OSError, ValueError):
        return None
