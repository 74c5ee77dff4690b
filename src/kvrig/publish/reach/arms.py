"""Whether one process's coverage takes a located arm: lines and arcs in, yes or no out.

coverage.py's raw arcs, not mapped to statements, so a line inside a multi-line statement
(a conditional expression's arm, an assertion's message) is seen when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvrig.publish.reach.anchors import Located

Arc = tuple[int, int]


def taken(arm: Located, arcs: Iterable[Arc]) -> bool:
    """Whether the arcs of one file, in one process, take the arm."""
    return any(_takes(arm, a, b) for a, b in arcs)


def _takes(arm: Located, start: int, end: int) -> bool:
    if end > 0 and end in arm.enter:
        return True
    if start not in arm.leave:
        return False
    if end < 0:
        return end == arm.exit
    return not arm.exit_only and end not in arm.inside
