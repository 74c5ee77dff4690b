"""The reach report: for each branch of the table, a cell that takes it, or why none can.

The figure is the share of the reachable branches some cell takes; the rest are listed
apart with their reasons. An arm the measured vLLM lacks is named with its version, so a
release that moved the code shows, never silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvrig.define.reach_table import Branch, Table
from kvrig.publish.reach.anchors import Located, Missing, locate
from kvrig.publish.reach.arms import taken
from kvrig.publish.reach.measured import Cell

ArmKey = tuple[int, int]  # (row number, arm index)
NAMED = 2  # cells named per arm
APART = ("hardware", "dead", "elsewhere")
TITLES = {
    "hardware": "Hardware only (needs a real device, driver or kernel)",
    "dead": "Dead code (no engine or CLI path)",
    "elsewhere": "Another platform, release or model kvrig does not run",
}


def locate_all(table: Table, sources: Mapping[str, str | None]) -> dict[ArmKey, Located | Missing]:
    """Every arm of the table in one vLLM's sources (file -> text, None: no such file)."""
    out: dict[ArmKey, Located | Missing] = {}
    for row in table.rows:
        for i, arm in enumerate(row.arms):
            text = sources.get(row.file_of(arm))
            out[(row.n, i)] = (
                Missing(f"no file {row.file_of(arm)}")
                if text is None
                else locate(text, row.function_of(arm), arm)
            )
    return out


@dataclass(frozen=True)
class Verdict:
    branch: Branch
    reached: bool
    by: tuple[str, ...]  # cells that take it, labelled with their vLLM when not the table's
    columns: frozenset[str]  # columns whose cells alone take it
    where: str  # file:line of its first arm in a measured vLLM, or file:function
    missing: tuple[str, ...]  # "vLLM 0.32.0: <why the arm is not there>"

    @property
    def contradicts(self) -> bool:
        """Taken, though classed as something no cell can take."""
        return self.reached and not self.branch.reachable


@dataclass(frozen=True)
class Measured:
    """The cells of the columns, and where each vLLM they ran has every arm."""

    cells: tuple[Cell, ...]
    located: Mapping[str, Mapping[ArmKey, Located | Missing]]  # vLLM root -> arms
    versions: Mapping[str, str]  # vLLM root -> version


def judge(table: Table, measured: Measured) -> list[Verdict]:
    return [_row(table, row, measured) for row in table.rows]


def _takers(row: Branch, i: int, cells: Iterable[Cell], measured: Measured) -> list[Cell]:
    arm = row.arms[i]
    out = []
    for cell in cells:
        where = measured.located.get(cell.vllm_root or "", {}).get((row.n, i))
        if (
            isinstance(where, Located)
            and cell.platform in arm.platforms
            and taken(where, cell.arcs.get(row.file_of(arm), ()))
        ):
            out.append(cell)
    return out


def _reached_by(row: Branch, cells: Sequence[Cell], measured: Measured) -> list[list[Cell]]:
    """Per arm, the cells taking it; one list of the cells taking every arm when the row
    asks for one cell; empty lists where the row is not reached."""
    per_arm = [_takers(row, i, cells, measured) for i in range(len(row.arms))]
    if row.together:
        ids = set.intersection(*({c.id for c in t} for t in per_arm))
        both = [c for c in per_arm[0] if c.id in ids]
        return [both] * len(per_arm)
    return per_arm


def _row(table: Table, row: Branch, measured: Measured) -> Verdict:
    per_arm = _reached_by(row, measured.cells, measured)
    reached = all(per_arm)
    columns = sorted({c.column for c in measured.cells})
    in_column = frozenset(
        col
        for col in columns
        if all(_reached_by(row, [c for c in measured.cells if c.column == col], measured))
    )
    return Verdict(
        branch=row,
        reached=reached,
        by=_named(per_arm, measured, table.release) if reached else (),
        columns=in_column,
        where=_where(row, measured, table.release),
        missing=_missing(row, measured),
    )


def _named(per_arm: list[list[Cell]], measured: Measured, release: str) -> tuple[str, ...]:
    """A few cells per arm, the table's release first, each labelled with its vLLM when
    it is another."""
    out: list[str] = []
    for takers in per_arm:
        ranked = sorted(
            takers, key=lambda c: (measured.versions.get(c.vllm_root or "") != release, c.id)
        )
        for cell in ranked[:NAMED]:
            version = measured.versions.get(cell.vllm_root or "")
            label = cell.id if version in (None, release) else f"{cell.id} (vLLM {version})"
            if label not in out:
                out.append(label)
    return tuple(out)


def _where(row: Branch, measured: Measured, release: str) -> str:
    roots = sorted(measured.located, key=lambda r: measured.versions.get(r) != release)
    for root in roots:
        found = measured.located[root].get((row.n, 0))
        if isinstance(found, Located):
            return f"{row.file_of(row.arms[0])}:{found.line}"
    return f"{row.file}:{row.function}"


def _missing(row: Branch, measured: Measured) -> tuple[str, ...]:
    out = []
    for root, located in sorted(measured.located.items()):
        for i in range(len(row.arms)):
            found = located.get((row.n, i))
            if isinstance(found, Missing):
                out.append(f"not in vLLM {measured.versions.get(root, '?')}: {found.reason}")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Figure:
    reached: int
    reachable: int

    @property
    def percent(self) -> float:
        return 100.0 * self.reached / self.reachable if self.reachable else 0.0

    def __str__(self) -> str:
        return (
            f"{self.reached} of {self.reachable} reachable branches reached ({self.percent:.1f}%)"
        )


def figure(verdicts: Sequence[Verdict], column: str | None = None) -> Figure:
    """Reached over reachable, for every column together or for one alone."""
    reachable = [v for v in verdicts if v.branch.reachable]
    hit = [v for v in reachable if (v.reached if column is None else column in v.columns)]
    return Figure(len(hit), len(reachable))


def status(v: Verdict) -> str:
    """The row's status word: REACHED, NOT REACHED, or its class when no cell can."""
    if v.reached:
        return "REACHED" if v.branch.reachable else f"REACHED ({v.branch.class_}!)"
    return "NOT REACHED" if v.branch.reachable else v.branch.class_.upper()


def detail(v: Verdict) -> str:
    """The cells that take it, or what a cell would need, or why none can; then any arm
    a measured vLLM lacks."""
    if v.reached:
        text = "by " + ", ".join(v.by)
        if v.contradicts:
            text += f"; classed {v.branch.class_}: {v.branch.reason}"
    elif v.branch.reachable:
        text = f"needs {v.branch.reason}"
    else:
        text = v.branch.reason
    if v.missing:
        text += "; " + "; ".join(v.missing)
    return text
