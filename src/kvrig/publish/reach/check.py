"""The reach report of a run's folder, written and printed, with its exit status.

1 when a column left no coverage (the instrument did not measure) or the figure is below
`--min`. An unreached branch is listed, never a failure by itself: the figure is what the
minimum guards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvrig.define import reach_table
from kvrig.publish.reach import measured, render, report

MARKDOWN = "reach.md"
JSON = "reach.json"


@dataclass(frozen=True)
class Outcome:
    code: int
    lines: list[str]
    verdicts: list[report.Verdict]


def evaluate(
    root: Path, minimum: float | None = None, table: reach_table.Table | None = None
) -> Outcome:
    """The report of the reach run in `root`, written beside its columns."""
    table = table or reach_table.load()
    columns = measured.read_root(root)
    cells = tuple(c for col in columns for c in col.cells)
    roots = sorted({c.vllm_root for c in cells if c.vllm_root})
    versions = {r: next(c.vllm for c in cells if c.vllm_root == r) or "?" for r in roots}
    located = {r: report.locate_all(table, measured.sources(r, table.files)) for r in roots}
    verdicts = report.judge(table, report.Measured(cells, located, versions))
    lines = render.summary(verdicts, columns, table.release)
    code, why = _code(verdicts, columns, minimum)
    gone = _sources_gone(columns, roots)
    code, why = (1 if gone else code), [*gone, *why]
    (root / MARKDOWN).write_text(render.markdown(verdicts, columns, table.release, versions))
    (root / JSON).write_text(json.dumps(_json(verdicts, columns), indent=2))
    out = [*render.terminal(verdicts), "", *lines, *why, f"report: {root / MARKDOWN}"]
    return Outcome(code, out, verdicts)


def _sources_gone(columns: list[measured.Column], roots: list[str]) -> list[str]:
    """A vLLM a column ran whose environment is gone: its arms cannot be found, so its cells
    would count as reaching nothing."""
    out = []
    for root in roots:
        if Path(root).is_dir():
            continue
        names = sorted({col.name for col in columns for c in col.cells if c.vllm_root == root})
        out.append(
            f"kvrig reach: the vLLM the {', '.join(names)} column's cells ran ({root}) is gone,"
            " so none of their branches can be found in it and they count as reaching none;"
            f" run {'that column' if len(names) == 1 else 'those columns'} again"
            f" (--only {names[0].split('-')[0]})"
        )
    return out


def _code(
    verdicts: list[report.Verdict], columns: list[measured.Column], minimum: float | None
) -> tuple[int, list[str]]:
    why = []
    if not columns:
        why.append("kvrig reach: no column left coverage data here: nothing was measured")
    for col in columns:
        if not any(c.processes for c in col.cells):
            why.append(f"kvrig reach: the {col.name} column's cells left no coverage data")
    pct = report.figure(verdicts).percent
    if minimum is not None and pct < minimum:
        why.append(f"kvrig reach: {pct:.1f}% is below the minimum of {minimum:g}%")
    return (1 if why else 0), why


def _json(verdicts: list[report.Verdict], columns: list[measured.Column]) -> dict[str, object]:
    fig = report.figure(verdicts)
    return {
        "reached": fig.reached,
        "reachable": fig.reachable,
        "columns": {c.name: report.figure(verdicts, c.name).reached for c in columns},
        "rows": [
            {
                "n": v.branch.n,
                "class": v.branch.class_,
                "status": report.status(v),
                "where": v.where,
                "by": list(v.by),
                "missing": list(v.missing),
            }
            for v in verdicts
        ],
    }
