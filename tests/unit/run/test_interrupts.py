"""Ctrl-C held over a finished cell's record and row, never over the engine itself."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from kvrig.column.one_cell import run_and_judge
from kvrig.run import interrupts
from kvrig.run.record import Record
from kvrig.run.runner import run_unsaved

from ..builders import cell_with


@pytest.fixture(autouse=True)
def default_sigint():
    """Python's own SIGINT handler for each test, whatever the suite was started under:
    under nohup or from a background job SIGINT is ignored, and these tests are about what
    a held Ctrl-C does to the handler the caller had."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigint_inside_is_raised_when_the_block_ends() -> None:
    reached = False
    with pytest.raises(KeyboardInterrupt), interrupts.held():
        os.kill(os.getpid(), signal.SIGINT)
        reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_sigint_nothing_is_raised_and_the_handler_is_restored() -> None:
    with interrupts.held():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_as_the_record_is_saved_still_writes_its_row(tmp_path: Path, monkeypatch) -> None:
    saved = Record.save

    def save_then_interrupt(self: Record, path: Path) -> None:
        saved(self, path)
        os.kill(os.getpid(), signal.SIGINT)  # the moment a user's Ctrl-C is likeliest to hit

    monkeypatch.setattr(Record, "save", save_then_interrupt)
    cell = cell_with({"outcome": "skip", "reason": "needs AMX"})
    with pytest.raises(KeyboardInterrupt):
        run_and_judge(cell, tmp_path)
    assert (tmp_path / "records" / f"{cell.id}.json").exists()
    assert (tmp_path / "results.jsonl").exists(), "the record was kept without its row"
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["cell_id"] for r in rows] == [cell.id]


def test_the_runner_leaves_the_record_to_be_saved_with_its_row(tmp_path: Path) -> None:
    # Were the runner to save it, a Ctrl-C could land between the record and the row that
    # run_and_judge writes under its one held block.
    cell = cell_with({"outcome": "skip", "reason": "needs AMX"})
    rec = run_unsaved(cell, tmp_path, python="/nonexistent")
    assert rec.outcome == "skipped"
    assert not (tmp_path / "records").exists()
