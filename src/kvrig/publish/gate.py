"""The release gate: every required cell of the gated platforms ran and passed.

Required cells are the `gate: true` cases. A required cell that is missing from the
results, failed, or was skipped without the matrix saying so fails the gate, so a column
that crashed halfway or skipped its hard cells cannot pass by omission. An allowance in
matrix.yaml excuses one cell until its expiry date; an expired allowance fails the gate
by itself, so excuses cannot quietly become permanent. Against a previous run the gate
also names new failures, fixes and every cell whose chosen block size moved: a block
size that changes silently is what this rig exists to catch, so that fails the gate
unless the change is accepted explicitly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Allowance, Matrix
from kvrig.judge.verdict import Status
from kvrig.publish.results import block_text, overlays_of

Row = dict[str, Any]
# (cell id, column, image, overlay) -> the commands that rerun it (kvrig.publish.repro.lines)
Repro = Callable[[str, str, str | None, dict[str, Any] | None], list[str]]


def column_cells(matrix: Matrix, column: str, rows: list[Row]) -> list[Cell]:
    """The cells of a column: a platform's, or a CPU class's (`cpu-<class>`), whose
    expectations follow the class the rows were run under."""
    platform, _, cls = column.partition("-")
    if cls:
        return expand(matrix, platform, isa=cls, emulated=True)
    seen = {r.get("isa") for r in rows if r.get("column", r.get("platform")) == column}
    seen.discard(None)
    return expand(matrix, platform, isa=seen.pop() if len(seen) == 1 else None)


@dataclass(frozen=True)
class GateResult:
    passed: bool
    lines: list[str]
    problems: list[str] = field(default_factory=list)


def _block(row: Row) -> tuple[Any, Any]:
    return (row.get("worker_block_size"), row.get("engine_block_size"))


def _problem(row: Row | None, expected: str) -> str | None:
    """Why a required cell does not count as passed, or None when it does."""
    if row is None:
        return "not run: the results hold no row for it (the column crashed or was cut short?)"
    if row["status"] == Status.FAIL:
        return f"failed: {row['reason']}"
    if row["status"] == Status.SKIP and expected != "skip":
        return f"skipped, and the matrix expects it to run: {row['reason']}"
    return None


def changes(rows: list[Row], previous: list[Row]) -> tuple[list[str], list[str], list[str]]:
    """New failures, fixes and block-size changes against a previous run (pure)."""
    before = {r["cell_id"]: r for r in previous}
    new_fail, fixed, moved = [], [], []
    for r in rows:
        old = before.get(r["cell_id"])
        if old is None:
            continue
        if r["status"] == Status.FAIL and old["status"] != Status.FAIL:
            new_fail.append(f"{r['cell_id']}: {r['reason']}")
        elif r["status"] == Status.PASS and old["status"] == Status.FAIL:
            fixed.append(r["cell_id"])
        was, now = _block(old), _block(r)
        if was[0] is not None and now[0] is not None and was != now:
            moved.append(f"{r['cell_id']}: {block_text(old)} -> {block_text(r)}")
    return new_fail, fixed, moved


def evaluate(
    matrix: Matrix,
    rows: list[Row],
    columns: list[str],
    today: dt.date,
    previous: list[Row] | None = None,
    accept_block_size_changes: bool = False,
    repro: Repro | None = None,
) -> GateResult:
    by_id = {r["cell_id"]: r for r in rows}
    allowances: dict[str, Allowance] = {a.cell: a for a in matrix.allowances}
    lines: list[str] = []
    problems: list[str] = []
    counts = {"passed": 0, "allowed": 0, "failed": 0}
    if not columns:
        problems.append("no column results to gate on")
    for column in columns:
        for cell in column_cells(matrix, column, rows):
            if not cell.case.gate:
                continue
            row = by_id.get(cell.id)
            why = _problem(row, cell.expect.outcome)
            allowance = allowances.get(cell.id)
            if why is None:
                counts["passed"] += 1
                lines.append(f"ok      {cell.id}")
                if allowance is not None:
                    lines.append(
                        f"        (its allowance by {allowance.owner} is no longer needed)"
                    )
            elif allowance is not None and allowance.expires >= today:
                counts["allowed"] += 1
                lines.append(
                    f"ALLOWED {cell.id}: {why} -- allowed until {allowance.expires} by"
                    f" {allowance.owner}: {allowance.reason}"
                )
            else:
                counts["failed"] += 1
                problems.append(f"{cell.id} {why.split(':')[0]}")
                lines.append(f"FAIL    {cell.id}: {why}")
                if repro is not None:
                    image = row.get("image") if row else None
                    under = row.get("vllm_overlay") if row else None
                    lines.extend(f"          {x}" for x in repro(cell.id, column, image, under))
    for a in matrix.allowances:
        # The allowance's own column (a cell id is `<column>-<model>-<case>`, and neither
        # a model nor a case has a hyphen): a prefix would take `cpu-avx2-m-c` for `cpu`'s.
        if a.expires < today and a.cell.rsplit("-", 2)[0] in columns:
            problems.append(f"allowance for {a.cell} expired")
            lines.append(
                f"EXPIRED allowance for {a.cell} (owner {a.owner}, expired {a.expires}: {a.reason})"
                "; renew its expiry date in matrix.yaml or remove it"
            )
    required = {c.id for col in columns for c in column_cells(matrix, col, rows) if c.case.gate}
    others = [r for r in rows if r["status"] == Status.FAIL and r["cell_id"] not in required]
    if others:
        lines.append(f"not required, failed ({len(others)}):")
        for r in others:
            lines.append(f"        {r['cell_id']}: {r['reason']}")
            if repro is not None:
                column = r.get("column") or r["cell_id"].split("-", 1)[0]
                again = repro(r["cell_id"], column, r.get("image"), r.get("vllm_overlay"))
                lines.extend(f"          {x}" for x in again)
    if previous is not None:
        new_fail, fixed, moved = changes(rows, previous)
        lines.append(
            f"since the previous run: {len(new_fail)} new failure(s), {len(fixed)} fixed,"
            f" {len(moved)} block size change(s)"
        )
        lines.extend(f"  NEW FAILURE {x}" for x in new_fail)
        lines.extend(f"  FIXED       {x}" for x in fixed)
        for x in moved:
            lines.append(f"  BLOCK SIZE CHANGED {x}")
            if not accept_block_size_changes:
                problems.append(f"block size of {x.split(':')[0]} changed")
        if moved and not accept_block_size_changes:
            lines.append(
                "  A chosen block size changed. If vLLM meant it, rerun the gate with"
                " --accept-block-size-changes (and update the matrix's invariants)."
            )
    summary = (
        f"required cells on {', '.join(columns) or 'no column'}: {counts['passed']} passed,"
        f" {counts['allowed']} allowed, {counts['failed']} failed"
    )
    lines.append(summary)
    lines.extend(f"vLLM under test: {text}" for text in overlays_of(rows))
    passed = not problems
    verdict = "PASS" if passed else f"FAIL ({'; '.join(problems)})"
    lines.append(f"gate: {verdict}")
    return GateResult(passed, lines, problems)
