"""Two runs side by side: every cell whose verdict, outcome, chosen size or error differs.

A branch is judged against the release it sits on, so what matters is what changed. A
cell that passed on the first run counts as regressed when the second shows it red,
skipped, undecided, only as a known defect, or not at all: none of those is evidence that
it still passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    except (ValueError, TypeError):
        return None


# On B, after a pass on A: red, or no longer shown (a skip or an undecided cell proves
# nothing about the cell), or a status kvrig never writes.
NOT_SHOWN = (Status.SKIP, Status.UNDECIDED)


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
        return tuple(k for k in ASPECTS if _seen(k, left[k]) != _seen(k, right[k]))

    @property
    def turned_red(self) -> bool:
        """Shown on A; on B failed, unknown, not shown (skipped, undecided: nothing was
        proved), or a known defect where A did as the cell expects."""
        if self.a is None or self.b is None or not _shown(self.a):
            return False
        now = status(self.b)
        return now in (Status.FAIL, *NOT_SHOWN, None) or self.became_defect

    @property
    def became_defect(self) -> bool:
        """Did as the cell expects on A, and on B shows a known vLLM defect instead."""
        if self.a is None or self.b is None:
            return False
        return status(self.a) is not Status.XFAIL and status(self.b) is Status.XFAIL

    @property
    def mark(self) -> str:
        """What the table says beside B's line."""
        now = status(self.b) if self.b is not None else None
        if not self.turned_red:
            unread = self.a is not None and _passed(self.a) and now is Status.UNREAD
            return "  <- unread on B: as expected by vLLM's outcome, not a pass" if unread else ""
        if now in NOT_SHOWN:
            return f"  <- no longer shown ({now.value}): regressed"  # type: ignore[union-attr]
        if self.became_defect:
            return "  <- now a known defect (xfail): regressed"
        return "  <- turned red" if now is Status.FAIL else "  <- turned red (unknown status)"


# A pass and an unread verdict saw vLLM do the same; only the rules they were checked by
# differ (the tail of the table counts the unread ones).
_SAME_OUTCOME = {Status.UNREAD.word: Status.PASS.word}


def _seen(aspect: str, value: str) -> str:
    return _SAME_OUTCOME.get(value, value) if aspect == "verdict" else value


def _passed(row: Row) -> bool:
    known = status(row)
    return known is not None and known.passed


def _shown(row: Row) -> bool:
    """What a regression is measured from: vLLM's outcome as the cell expects, whichever
    rules checked its size, so an unread run that broke is a regression all the same."""
    return _passed(row) or status(row) is Status.UNREAD


def _keys(rows: Iterable[Row], by_id: bool) -> dict[str, Row]:
    return {r["cell_id"] if by_id else f"{r.get('model')}-{r.get('case')}": r for r in rows}


@dataclass(frozen=True)
class Comparison:
    changed: list[Change]  # cells both runs ran, differing in some aspect
    only_a: list[str]
    only_b: list[str]
    same: int
    lost: list[str] = field(default_factory=list)  # of only_a, those shown on A
    # Per run, the cells judged by rules not read for that run's vLLM.
    unread: tuple[int, int] = (0, 0)
    # Of the cells both ran: passed on A and unread on B; judged under another matrix
    # identity (judged_under) or by another kvrig (judged_by) on B than on A.
    unread_on_b: list[str] = field(default_factory=list)
    other_matrix: list[str] = field(default_factory=list)
    other_kvrig: list[str] = field(default_factory=list)
    # The vLLM versions of A and B where other_matrix's cells ran different ones.
    other_vllm: tuple[str, str] | None = None
    # "A cpu-m-c: 'error'": rows whose status kvrig never writes.
    unknown: list[str] = field(default_factory=list)

    @property
    def turned_red(self) -> list[Change]:
        return [c for c in self.changed if c.turned_red]

    @property
    def regressed(self) -> bool:
        """What `kvrig compare` exits 1 for: a cell that passed on A is red or missing on B."""
        return bool(self.turned_red or self.lost)


def compare(rows_a: list[Row], rows_b: list[Row]) -> Comparison:
    """Cells matched by id, or by model and case across columns, which share no id. A cell
    only one run has is listed apart; one that passed on A and is missing on B is lost."""
    ids_a, ids_b = {r["cell_id"] for r in rows_a}, {r["cell_id"] for r in rows_b}
    by_id = bool(ids_a & ids_b) or not (rows_a and rows_b)
    a, b = _keys(rows_a, by_id), _keys(rows_b, by_id)
    both = [Change(k, a[k], b[k]) for k in a if k in b]
    changed = [c for c in both if c.differs]
    only_a = [k for k in a if k not in b]
    other_matrix = _differ(both, "judged_under")
    return Comparison(
        changed,
        only_a=only_a,
        only_b=[k for k in b if k not in a],
        same=len(both) - len(changed),
        lost=[k for k in only_a if _shown(a[k])],
        unread=(_unread(rows_a), _unread(rows_b)),
        unread_on_b=[c.key for c in both if c.mark.startswith("  <- unread")],
        other_matrix=other_matrix,
        other_kvrig=_differ(both, "judged_by"),
        other_vllm=_other_vllm([c for c in both if c.key in other_matrix]),
        unknown=[
            f"{run} {r.get('cell_id')}: {r.get('status')!r}"
            for run, rows in (("A", rows_a), ("B", rows_b))
            for r in rows
            if status(r) is None
        ],
    )


def _unread(rows: list[Row]) -> int:
    return sum(status(r) is Status.UNREAD for r in rows)


def _differ(both: list[Change], key: str) -> list[str]:
    """The cells whose rows on A and B name different `key`s (one naming none counts)."""
    return [c.key for c in both if c.a and c.b and c.a.get(key) != c.b.get(key)]


def _other_vllm(cells: list[Change]) -> tuple[str, str] | None:
    """(A's vLLM, B's) when every one of `cells` ran one vLLM on A and another on B: then
    their matrix identities differ by the pin, as a release diff's two sides do."""
    pairs = {
        (str(c.a.get("vllm_version")), str(c.b.get("vllm_version"))) for c in cells if c.a and c.b
    }
    if len(pairs) != 1:
        return None
    (va, vb) = next(iter(pairs))
    return (va, vb) if va != vb else None


def names(keys: Sequence[str], limit: int = 6) -> str:
    """The first `limit` of `keys`, and how many more: a list a line can hold."""
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def table(result: Comparison, label_a: str, label_b: str, width: int = 70) -> str:
    """The changes as an aligned text table, A's facts over B's, then what the table cannot
    show: cells one run lacks, unread and differently judged cells, and the outcome."""
    found = result.changed
    tail = [
        f"{len(found)} cell(s) differ between A ({label_a}) and B ({label_b}), {result.same}"
        f" are the same; {len(result.turned_red)} passed on A and are red, no longer shown"
        " or a known defect on B",
        *_tail(result),
        _outcome(result),
    ]
    if not found:
        return "\n".join(["no cell differs", *tail])
    key_w = max(len("cell"), *(len(c.key) for c in found))
    head = f"{'cell':<{key_w}}  {'run':<3}  {'verdict':<9}  {'outcome':<10}  {'block':<14}  error"
    lines = [head, "-" * len(head)]
    for c in found:
        for run, row in (("A", c.a), ("B", c.b)):
            x = aspects(row)
            error = x["error"] if len(x["error"]) <= width else x["error"][: width - 3] + "..."
            lines.append(
                f"{c.key if run == 'A' else '':<{key_w}}  {run:<3}  {x['verdict']:<9}"
                f"  {x['outcome']:<10}  {x['block']:<14}  {error}"
                f"{c.mark if run == 'B' else ''}"
            )
    return "\n".join([*lines, *tail])


def _tail(result: Comparison) -> list[str]:
    tail = []
    if result.only_a:
        tail.append(f"ran on A only ({len(result.only_a)}): {names(result.only_a)}")
    if result.lost:
        tail.append(
            f"passed on A and missing on B ({len(result.lost)}): {names(result.lost)};"
            " B may have been cut short: run those cells on B"
        )
    if result.only_b:
        tail.append(f"ran on B only ({len(result.only_b)}): {names(result.only_b)}")
    for run, n in zip(("A", "B"), result.unread, strict=True):
        if n:
            tail.append(
                f"{run}: {n} cell(s) judged by kvrig rules not read for its vLLM (UNREAD: vLLM's"
                " outcome as expected, no pass for the gate)"
            )
    if result.unread_on_b:
        tail.append(
            f"passed on A and unread on B ({len(result.unread_on_b)}):"
            f" {names(result.unread_on_b)}; B's vLLM did as they expect, and the size was"
            " checked by rules not read for it: not shown to pass"
        )
    return tail + _judged(result) + [f"status kvrig never writes: {x}" for x in result.unknown]


def _judged(result: Comparison) -> list[str]:
    """The cells A and B were judged differently for, said: a verdict that moved there may
    have moved with the matrix or with kvrig, not with vLLM."""
    out = []
    if result.other_matrix:
        pins = (
            f" (here every one ran vLLM {result.other_vllm[0]} on A and {result.other_vllm[1]}"
            " on B, whose pins differ as a release diff's sides do)"
            if result.other_vllm
            else ""
        )
        out.append(
            f"judged under different matrices on A and B ({len(result.other_matrix)}):"
            f" {names(result.other_matrix)}; a cell's judged_under covers its case, model"
            f" and platform spec, the vLLM pinned included{pins}: a difference there may be"
            " the matrix's, not vLLM's"
        )
    if result.other_kvrig:
        out.append(
            f"judged by different kvrigs on A and B ({len(result.other_kvrig)}):"
            f" {names(result.other_kvrig)}; kvrig's rules, judge or matrix code differ"
            " between the runs (judged_by), so a verdict may differ by kvrig, not by vLLM:"
            " rerun both with one kvrig to compare their verdicts"
        )
    return out


def _outcome(result: Comparison) -> str:
    """The comparison in a line, as `kvrig compare` exits: regressed (1) or not (0)."""
    if result.regressed:
        return (
            f"compare: REGRESSED ({len(result.turned_red)} passed on A and red, no longer"
            f" shown or a known defect on B, {len(result.lost)} missing on B)"
        )
    but = [
        f"{len(x)} {what}"
        for x, what in (
            (result.unread_on_b, "unread on B"),
            (result.other_matrix, "judged under different matrices"),
            (result.other_kvrig, "judged by different kvrigs"),
        )
        if x
    ]
    return "compare: no regression" + (f" in vLLM's outcomes ({'; '.join(but)})" if but else "")
