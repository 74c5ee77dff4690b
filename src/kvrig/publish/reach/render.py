"""The reach report as text: a terminal table and a Markdown page (reach.md).

Pure: verdicts and the columns' cells in, lines out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvrig.publish.reach.measured import Column
from kvrig.publish.reach.report import APART, TITLES, Verdict, detail, figure, status

WIDTH = 160


def summary(verdicts: Sequence[Verdict], columns: Sequence[Column], release: str) -> list[str]:
    """The figure, what is listed apart, each column's share, and what was not measured."""
    apart = {c: sum(1 for v in verdicts if v.branch.class_ == c) for c in APART}
    lines = [
        f"kvrig reach: {figure(verdicts)} of vLLM's block-size code"
        f" (the table of {len(verdicts)} read against vLLM {release})",
        f"  apart: {apart['hardware']} hardware only, {apart['dead']} dead,"
        f" {apart['elsewhere']} on another platform, release or model",
    ]
    for col in columns:
        versions = sorted({c.vllm for c in col.cells if c.vllm})
        lines.append(
            f"  {col.name} (vLLM {', '.join(versions) or '?'}, {len(col.cells)} cells"
            f" measured): {figure(verdicts, col.name).reached}"
        )
    lines += _unmeasured(columns)
    wrong = [v for v in verdicts if v.contradicts]
    if wrong:
        lines.append(
            f"  {len(wrong)} branch(es) taken though classed as none can be:"
            f" {', '.join(f'#{v.branch.n}' for v in wrong)} (the table is wrong there)"
        )
    return lines


def _unmeasured(columns: Sequence[Column]) -> list[str]:
    out = []
    for col in columns:
        if col.unmeasured:
            out.append(
                f"  {col.name}: {len(col.unmeasured)} cell(s) ran and left no coverage:"
                f" {', '.join(col.unmeasured)}"
            )
        failed = [c for c in col.cells if c.error]
        for cell in failed:
            out.append(f"  {cell.id}: not measured: {cell.error}")
    return out


def terminal(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per branch, the reachable ones first."""
    ordered = sorted(verdicts, key=lambda v: (not v.branch.reachable, v.branch.n))
    lines = [f"{'#':>3}  {'status':<12} {'where':<44} branch: cells, or why not"]
    for v in ordered:
        line = f"{v.branch.n:>3}  {status(v):<12} {v.where:<44} {v.branch.what}: {detail(v)}"
        lines.append(line if len(line) <= WIDTH else line[: WIDTH - 3] + "...")
    return lines


def markdown(
    verdicts: Sequence[Verdict],
    columns: Sequence[Column],
    release: str,
    versions: Mapping[str, str],
) -> str:
    """reach.md: the summary, the reachable branches, then each class apart."""
    out = ["# Reach of vLLM's block-size branches", "", "```", *summary(verdicts, columns, release)]
    out += ["```", "", "## By column", "", "| column | vLLM | cells | reachable branches taken |"]
    out.append("|---|---|---|---|")
    for col in columns:
        vllm = ", ".join(sorted({c.vllm for c in col.cells if c.vllm})) or "?"
        out.append(
            f"| {col.name} | {vllm} | {len(col.cells)} | {figure(verdicts, col.name).reached} |"
        )
    out += ["", "## Reachable branches", "", *_table([v for v in verdicts if v.branch.reachable])]
    missed = [v for v in verdicts if v.branch.reachable and not v.reached]
    out += ["", f"### Not reached ({len(missed)})", ""]
    out += [f"- **#{v.branch.n}** `{v.where}`: {v.branch.what}. {detail(v)}" for v in missed]
    for cls in APART:
        rows = [v for v in verdicts if v.branch.class_ == cls]
        out += ["", f"## {TITLES[cls]} ({len(rows)})", "", *_table(rows)]
    measured = ", ".join(f"{root} ({ver})" for root, ver in sorted(versions.items()))
    out += ["", f"vLLM sources read: {measured or 'none'}.", ""]
    return "\n".join(out)


def _table(rows: Sequence[Verdict]) -> list[str]:
    out = ["| # | where | branch | status | cells, or why not |", "|---|---|---|---|---|"]
    for v in rows:
        text = detail(v).replace("|", "\\|")
        what = v.branch.what.replace("|", "\\|")
        out.append(f"| {v.branch.n} | `{v.where}` | {what} | {status(v)} | {text} |")
    return out
