"""Summaries of a results folder: a terminal table, Markdown and HTML (pure renderers)."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any

from kvrig import results as results_mod

_MARK = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "xfail": "XFAIL"}


def _block(row: dict[str, Any]) -> str:
    w, e = row.get("worker_block_size"), row.get("engine_block_size")
    if w is None:
        return "-"
    return str(w) if e in (None, w) else f"{w} (core {e})"


def _what(row: dict[str, Any]) -> str:
    return row["reason"].removeprefix("as expected: ")


def counts(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["status"] for r in rows)


def terminal(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no cells were judged"
    id_w = max(len(r["cell_id"]) for r in rows)
    lines = [
        f"{'cell':<{id_w}}  {'verdict':<7}  {'expected':<11}  {'block':<14}  {'time':>6}  what"
    ]
    for r in rows:
        wall = f"{r['wall_s']:.0f}s" if r.get("wall_s") is not None else "-"
        what = _what(r)
        lines.append(
            f"{r['cell_id']:<{id_w}}  {_MARK[r['status']]:<7}  {r['expected']:<11}  "
            f"{_block(r):<14}  {wall:>6}  {what}"
        )
    c = counts(rows)
    lines.append(f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], title: str) -> str:
    c = counts(rows)
    out = [
        f"# {title}",
        "",
        f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped",
        "",
        "| cell | verdict | gate | expected | block size | kernel blocks | what happened |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        what = _what(r).replace("|", "\\|")
        kernels = ", ".join(str(k) for k in r.get("kernel_block_sizes") or []) or "-"
        out.append(
            f"| `{r['cell_id']}` | {_MARK[r['status']]} | {'yes' if r.get('gate') else ''}"
            f" | {r['expected']} | {_block(r)} | {kernels} | {what} |"
        )
    return "\n".join(out) + "\n"


def to_html(rows: list[dict[str, Any]], title: str) -> str:
    c = counts(rows)
    body = []
    for r in rows:
        cls = r["status"]
        body.append(
            f"<tr class={cls}><td><code>{html.escape(r['cell_id'])}</code></td>"
            f"<td>{_MARK[cls]}</td><td>{'yes' if r.get('gate') else ''}</td>"
            f"<td>{html.escape(r['expected'])}</td><td>{html.escape(_block(r))}</td>"
            f"<td>{html.escape(_what(r))}</td></tr>"
        )
    return (
        "<!doctype html><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif}}"
        "td,th{padding:2px 8px;text-align:left}.pass td:nth-child(2){color:green}"
        ".fail td:nth-child(2){color:#b00;font-weight:bold}.skip td:nth-child(2){color:#888}"
        f"</style><h1>{html.escape(title)}</h1>"
        f"<p>{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped</p>"
        "<table><tr><th>cell<th>verdict<th>gate<th>expected<th>block size<th>what happened"
        f"</tr>{''.join(body)}</table>\n"
    )


def write(results: Path) -> tuple[Path, Path]:
    """Writes report.md and report.html beside the results; returns their paths."""
    rows = results_mod.read(results)
    title = f"kvrig results: {results.name}"
    md, page = results / "report.md", results / "report.html"
    md.write_text(markdown(rows, title))
    page.write_text(to_html(rows, title))
    return md, page
