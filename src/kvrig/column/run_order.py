"""The order a column's cells run in, read off the matrix alone.

Two workers side by side start the longest cells first, so that neither ends idle behind
a long one. One process running the cells in turn instead takes them a warm parent at a
time: each import-time environment's cells together (a ROCm column's AITER cells, an XPU
column's batch-invariant ones), in the order each environment first comes, so a parent
is never wanted again once the next one has started and can go at once. A shared
architecture parent that imports all of vLLM then stops holding its memory through the
rest of its column, beside the next one's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from kvrig.define.cells import Cell

T = TypeVar("T")
NOT_A_CELL = 3  # anything else a session collected: after every cell


def slowness(cell: Cell | None) -> int:
    """0 for the slowest kind of cell (a multiprocess engine), 1 for a model read from a
    checkpoint, 2 for the rest, NOT_A_CELL for an item that is not a cell."""
    if cell is None:
        return NOT_A_CELL
    if cell.multiprocessing:
        return 0
    return 1 if cell.model.checkpoint else 2


def run_order(
    items: Sequence[T],
    cell_of: Callable[[T], Cell | None],
    parent: Callable[[Cell], Hashable] | None = None,
) -> list[T]:
    """The items slowest first; with `parent` (one process runs them all in turn), then
    grouped by the parent each cell forks from, each group where its first cell stands."""
    ordered = sorted(items, key=lambda item: slowness(cell_of(item)))
    if parent is None:
        return ordered
    groups: dict[Hashable, list[T]] = {}
    for item in ordered:
        cell = cell_of(item)
        groups.setdefault(None if cell is None else parent(cell), []).append(item)
    # Items that are not cells stay last, as slowness put them.
    rest = groups.pop(None, [])
    return [item for group in groups.values() for item in group] + rest
