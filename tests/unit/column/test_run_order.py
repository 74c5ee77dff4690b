"""The order a column's cells run in: slowest first for workers side by side, a warm
parent at a time for one process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvrig.column import column_run, run_order
from kvrig.define import column_choice
from kvrig.define.cells import expand
from kvrig.define.matrix import load

from ..builders import ROOT


def stub(cid: str, multiprocessing: bool = False, checkpoint: bool = False) -> Any:
    """What the order reads of a cell (its engine's kind, whether its model is read)."""
    return SimpleNamespace(
        id=cid, multiprocessing=multiprocessing, model=SimpleNamespace(checkpoint=checkpoint)
    )


def stretches(keys: list[object]) -> list[object]:
    """The parents in the order a process asks for them, one entry per switch."""
    return [k for i, k in enumerate(keys) if not i or k != keys[i - 1]]


def cell_of(item: Any) -> Any:
    return None if isinstance(item, str) else item


def test_workers_side_by_side_start_the_slowest_cells_first() -> None:
    items = ["x", stub("a"), stub("ckpt", checkpoint=True), stub("mp", True), "y", stub("b")]
    ordered = run_order.run_order(items, cell_of)
    assert [getattr(i, "id", i) for i in ordered] == ["mp", "ckpt", "a", "b", "x", "y"]


def test_one_process_takes_a_parent_at_a_time_each_group_where_its_first_cell_stands() -> None:
    cells = [stub("a1"), stub("b1"), stub("a2"), stub("mp", True), stub("b2")]
    parent = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "mp": "B"}
    ordered = run_order.run_order([*cells, "not a cell"], cell_of, lambda c: parent[c.id])
    # mp is slowest, so its parent's group comes first; the slowest first within a group.
    assert [getattr(i, "id", i) for i in ordered] == ["mp", "b1", "b2", "a1", "a2", "not a cell"]


def test_a_rocm_column_in_one_process_leaves_each_parent_once() -> None:
    """The real gfx1201 column: its AITER cells import vLLM under another environment, and
    in one process they come together, so each parent is asked for in one stretch."""
    cells = expand(load(ROOT / "matrix.yaml"), "rocm", gpu_arch="gfx1201", device_emulated=True)
    choice = column_choice.choose("rocm", emulate="gfx1201")
    run = column_run.ColumnRun(
        matrix=load(ROOT / "matrix.yaml"), choice=choice, cells=cells,
        results=Path("/nonexistent/results"), cold=False,
    )  # fmt: skip
    keys = [run.parent_key(c) for c in cells]
    assert len(set(keys)) > 1, "every cell of the column forks from one parent: nothing to group"
    assert len(stretches(keys)) > len(set(keys)), "the matrix's order is grouped already"

    run.one_process = True
    assert len(stretches([run.parent_key(c) for c in run.in_run_order(cells)])) == len(set(keys))
    assert sorted(map(id, run.in_run_order(cells))) == sorted(map(id, cells))

    run.one_process = False  # two workers: slowest first, the parents as they come
    assert run.in_run_order(cells) == run_order.run_order(cells, lambda c: c)
