"""Two runs side by side: every cell whose verdict, outcome, chosen size or error differs.

A branch is judged against the release it sits on: the same cells, run on two vLLMs (a
release and an overlay of a checkout on it, say). What matters is what changed, and
above all a cell that passed on the first and is red on the second, or is not on the
second at all (a run cut short is no evidence that the cell still passes): `kvrig compare`
exits 1 for either. Pure: rows in, changes and a table out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvrig.judge.verdict import Status
from kvrig.publish.results import block_text

Row = dict[str, Any]
# What a change is made of, as the table shows it.
ASPECTS = ("verdict", "outcome", "block", "error")


def status(row: Row) -> Status | None:
    """The row's verdict, or None for a status kvrig never writes (counted as no pass)."""
    try:
        return Status(row.get("status"))
    except ValueError:
        return None


def aspects(row: Row | None) -> dict[str, str]:
    if row is None:
        return dict.fromkeys(ASPECTS, "-") | {"verdict": "NOT RUN"}
    known = status(row)
    return {
        "verdict": known.word if known else f"{row.get('status')!s}?".upper(),
        "outcome": str(row.get("outcome") or "-"),
        "block": block_text(row),
        "error": str(row.get("error") or "-"),
    }


@dataclass(frozen=True)
class Change:
    key: str
    a: Row | None
    b: Row | None

    @property
    def differs(self) -> tuple[str, ...]:
        left, right = aspects(self.a), aspects(self.b)
        return tuple(k for k in ASPECTS if left[k] != right[k])

    @property
    def turned_red(self) -> bool:
        """Passed (or showed a known defect as recorded) on A; on B failed, undecided, or
        a status kvrig does not know."""
        if self.a is None or self.b is None or not _passed(self.a):
            return False
        return status(self.b) in (Status.FAIL, Status.UNDECIDED, None)


def _passed(row: Row) -> bool:
    known = status(row)
    return known is not None and known.passed


def _keys(rows: Iterable[Row], by_id: bool) -> dict[str, Row]:
    return {r["cell_id"] if by_id else f"{r.get('model')}-{r.get('case')}": r for r in rows}


@dataclass(frozen=True)
class Comparison:
    changed: list[Change]  # cells both runs ran, differing in some aspect
    only_a: list[str]
    only_b: list[str]
    same: int
    lost: list[str] = field(default_factory=list)  # of only_a, those that passed on A

    @property
    def turned_red(self) -> list[Change]:
        return [c for c in self.changed if c.turned_red]

    @property
    def regressed(self) -> bool:
        """What `kvrig compare` exits 1 for: a cell that passed on A is red or missing on B."""
        return bool(self.turned_red or self.lost)


def compare(rows_a: list[Row], rows_b: list[Row]) -> Comparison:
    """Cells matched by id; two runs of different columns (a CPU class against another)
    share no id and are matched by model and case instead. A cell only one run has (a
    run cut short, or narrowed with -k) is listed apart: it has nothing to differ from, and
    one that passed on A and is missing on B is lost."""
    ids_a, ids_b = {r["cell_id"] for r in rows_a}, {r["cell_id"] for r in rows_b}
    by_id = bool(ids_a & ids_b) or not (rows_a and rows_b)
    a, b = _keys(rows_a, by_id), _keys(rows_b, by_id)
    both = [Change(k, a[k], b[k]) for k in a if k in b]
    changed = [c for c in both if c.differs]
    only_a = [k for k in a if k not in b]
    return Comparison(
        changed,
        only_a=only_a,
        only_b=[k for k in b if k not in a],
        same=len(both) - len(changed),
        lost=[k for k in only_a if _passed(a[k])],
    )


def _names(keys: list[str], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def table(result: Comparison, label_a: str, label_b: str, width: int = 70) -> str:
    """The changes as an aligned text table, A's facts over B's for each cell."""
    found = result.changed
    tail = [
        f"{len(found)} cell(s) differ between A ({label_a}) and B ({label_b}), {result.same}"
        f" are the same; {len(result.turned_red)} passed on A and are red on B"
    ]
    if result.only_a:
        tail.append(f"ran on A only ({len(result.only_a)}): {_names(result.only_a)}")
    if result.lost:
        tail.append(
            f"passed on A and missing on B ({len(result.lost)}): {_names(result.lost)};"
            " B may have been cut short: run those cells on B"
        )
    if result.only_b:
        tail.append(f"ran on B only ({len(result.only_b)}): {_names(result.only_b)}")
    if not found:
        return "\n".join(["no cell differs", *tail])
    key_w = max(len("cell"), *(len(c.key) for c in found))
    head = f"{'cell':<{key_w}}  {'run':<3}  {'verdict':<7}  {'outcome':<8}  {'block':<14}  error"
    lines = [head, "-" * len(head)]
    for c in found:
        mark = "  <- turned red" if c.turned_red else ""
        for run, row in (("A", c.a), ("B", c.b)):
            x = aspects(row)
            error = x["error"] if len(x["error"]) <= width else x["error"][: width - 3] + "..."
            lines.append(
                f"{c.key if run == 'A' else '':<{key_w}}  {run:<3}  {x['verdict']:<7}"
                f"  {x['outcome']:<8}  {x['block']:<14}  {error}"
                f"{mark if run == 'B' else ''}"
            )
    return "\n".join([*lines, *tail])
