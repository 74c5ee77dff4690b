"""The release gate: every gating cell of the named platforms ran and passed.

A gating cell that is missing from the results fails the gate too, so a column that
crashed halfway cannot pass by omission.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvrig import results as results_mod
from kvrig.matrix import Matrix, expand


@dataclass(frozen=True)
class GateResult:
    passed: bool
    lines: list[str]


def evaluate(matrix: Matrix, rows_by_platform: dict[str, list[dict]]) -> GateResult:
    lines = []
    ok = True
    for platform, rows in rows_by_platform.items():
        by_id = {r["cell_id"]: r for r in rows}
        for cell in expand(matrix, platform):
            if not cell.case.gate:
                continue
            row = by_id.get(cell.id)
            if row is None:
                ok = False
                lines.append(f"FAIL {cell.id}: gating cell has no result (not run)")
            elif row["status"] == "fail":
                ok = False
                lines.append(f"FAIL {cell.id}: {row['reason']}")
            elif row["status"] == "skip" and cell.expect.outcome != "skip":
                ok = False
                lines.append(f"FAIL {cell.id}: gating cell was skipped: {row['reason']}")
            else:
                lines.append(f"ok   {cell.id}")
    if not rows_by_platform:
        ok = False
        lines.append("FAIL no platform results to gate on")
    return GateResult(ok, lines)


def load_rows(results_root: Path, platforms: list[str]) -> dict[str, list[dict]]:
    """A platform without a results file maps to no rows, so its gating cells fail."""
    return {p: results_mod.read(results_root / p) for p in platforms}
