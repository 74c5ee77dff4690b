"""Summaries of results: a terminal table, Markdown and a self-contained HTML grid.

The HTML page is one file a person can open anywhere. A row judged under another matrix
or by another kvrig is marked wherever it appears, and a row kvrig did not write as it
writes rows is shown as such, never a traceback.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvrig.define import gpus
from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import isa
from kvrig.judge.verdict import Status
from kvrig.publish import overview as overview_mod
from kvrig.publish import repro as repro_mod
from kvrig.publish import results as results_mod
from kvrig.publish.compare import names

Row = dict[str, Any]
_ICON = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.SKIP: "⏭️",
    Status.XFAIL: "⚠️",
    Status.UNDECIDED: "❔",
    Status.UNREAD: "📖",
}
UNKNOWN_ICON = "❓"
LOG_TAIL_LINES = 40


def status_of(row: Row) -> Status | None:
    """The row's verdict, or None for a status kvrig never writes."""
    try:
        return Status(row.get("status"))
    except (ValueError, TypeError):
        return None


def word(row: Row) -> str:
    """The verdict as the tables show it; a status kvrig never writes as itself with `?`."""
    known = status_of(row)
    return known.word if known else f"{row.get('status')!s}?".upper()


def css(row: Row) -> str:
    """The verdict's class in the HTML page (never the row's own text: it may hold anything)."""
    known = status_of(row)
    return known.value if known else "unknown"


def unknown_statuses(rows: list[Row]) -> list[str]:
    """One line per row whose status kvrig never writes: something else wrote or changed
    it, so it is no verdict of kvrig's (kvrig.judge.verdict.Status)."""
    known = ", ".join(s.value for s in Status)
    return [
        f"{r.get('cell_id')}: status {r.get('status')!r}, which kvrig never writes ({known})"
        for r in rows
        if status_of(r) is None
    ]


@dataclass(frozen=True)
class Detail:
    """What a grid cell opens: the cell's record, its log's tail, its repro commands."""

    record: dict[str, Any] | None = None
    log_tail: str = ""
    repro: list[str] = field(default_factory=list)


def _what(row: Row) -> str:
    return str(row.get("reason") or "").removeprefix("as expected: ")


# What a passing cell that expects vLLM to stop showed, in place of a size it never had.
_STOPPED = {
    "unsupported": "refused as expected",
    "early_error": "early error as expected",
    "late_error": "late error as expected",
}


def shown(row: Row) -> str:
    """What the cell showed, in a few words: its block size, else the refusal it expected,
    since "PASS -" says nothing of a refusal."""
    block = results_mod.block_text(row)
    if block != "-":
        return block
    stopped = _STOPPED.get(str(row.get("expected")))
    if stopped is not None and status_of(row) in (Status.PASS, Status.UNREAD):
        kind = str(row.get("error") or "").split(" from ", 1)[0].split(":", 1)[0]
        return f"{stopped}: {kind}" if kind else stopped
    if status_of(row) is Status.SKIP:
        return "skipped"
    return str(row.get("outcome") or "-")


def counts(rows: list[Row]) -> Counter[Status]:
    """The rows by verdict; those with a status kvrig never writes are not counted here."""
    return Counter(s for r in rows if (s := status_of(r)) is not None)


def _tally(rows: list[Row]) -> str:
    c = counts(rows)
    xfail = c[Status.XFAIL]
    known = f", {xfail} known vLLM defect(s) (xfail)" if xfail else ""
    if c[Status.UNDECIDED]:
        known += f", {c[Status.UNDECIDED]} undecided without a device"
    if c[Status.UNREAD]:
        known += (
            f", {c[Status.UNREAD]} unread (as expected by vLLM's outcome, judged by rules not"
            " read for this vLLM: no pass)"
        )
    odd = len(rows) - sum(c.values())
    if odd:
        known += f", {odd} with a status kvrig never writes"
    return f"{c[Status.PASS]} passed, {c[Status.FAIL]} failed, {c[Status.SKIP]} skipped{known}"


def terminal(rows: list[Row]) -> str:
    if not rows:
        return "no cells were judged"
    id_w = max(len(r["cell_id"]) for r in rows)
    lines = [
        f"{'cell':<{id_w}}  {'verdict':<7}  {'expected':<11}  {'block':<14}  {'time':>6}  what"
    ]
    for r in rows:
        wall = f"{r['wall_s']:.0f}s" if isinstance(r.get("wall_s"), int | float) else "-"
        lines.append(
            f"{r['cell_id']:<{id_w}}  {word(r):<7}  {r.get('expected') or '-'!s:<11}  "
            f"{results_mod.block_text(r):<14}  {wall:>6}  {_what(r)}"
        )
    lines.append(_tally(rows))
    return "\n".join(lines)


# --- the grid ------------------------------------------------------------------------------


def column_of(row: Row) -> str:
    """A row's column: its platform, or `cpu-<class>` for a class the rig emulated."""
    return row.get("column") or row.get("platform") or row["cell_id"].split("-", 1)[0]


def is_emulated(column: str) -> bool:
    """An emulated device's column (kvrig.define.gpus): never a hardware result."""
    return column in gpus.emulated_columns()


def _column_order(column: str) -> tuple[int, int]:
    if is_emulated(column):  # after every hardware column, in the devices' own order
        return len(PLATFORMS) + 1, gpus.emulated_columns().index(column)
    platform, _, cls = column.partition("-")
    rank = PLATFORMS.index(platform) if platform in PLATFORMS else len(PLATFORMS)
    # The host's own column first, then the classes from the highest down.
    return rank, -(isa.CLASSES.index(cls) + 1) if cls in isa.CLASSES else -99


def columns_of(rows: list[Row]) -> list[str]:
    """The columns present, platforms in their order, a platform's CPU classes beside it."""
    return sorted({column_of(r) for r in rows}, key=_column_order)


def column_label(column: str, rows: list[Row]) -> str:
    """A column's heading: `cpu (avx2)` for a host's own class, `cpu-avx2 (emulated)`."""
    if is_emulated(column):
        return f"{column} (vLLM's code, no device)"
    classes = sorted({r["isa"] for r in rows if column_of(r) == column and r.get("isa")})
    if not classes:
        return column
    if "-" in column:
        hosts = sorted({r.get("host_isa") or "?" for r in rows if column_of(r) == column})
        return f"{column} (emulated on {', '.join(hosts)})"
    return f"{column} ({', '.join(classes)})"


def short_label(column: str, rows: list[Row]) -> str:
    """A column's heading where space is short (the page's grids and picture): an emulated
    device's by its name alone, its section saying what emulated means."""
    return column if is_emulated(column) else column_label(column, rows)


def _key(row: Row) -> tuple[str, str, str]:
    return (row.get("family") or "?", row.get("model") or "?", row.get("case") or row["cell_id"])


def grid(rows: list[Row]) -> list[tuple[tuple[str, str, str], dict[str, Row]]]:
    """Case rows grouped by family and then model, in first-seen order: rows arrive as cells
    finish, and a model's cases scattered down the page read as unrelated."""
    out: dict[tuple[str, str, str], dict[str, Row]] = {}
    for r in rows:
        out.setdefault(_key(r), {})[column_of(r)] = r
    families: dict[str, int] = {}
    models: dict[tuple[str, str], int] = {}
    for family, model, _ in out:
        families.setdefault(family, len(families))
        models.setdefault((family, model), len(models))
    return sorted(out.items(), key=lambda kv: (families[kv[0][0]], models[kv[0][:2]]))


def run_facts(rows: list[Row]) -> list[str]:
    """One line per column: what ran where, so merged results stay traceable."""
    lines = []
    for column in columns_of(rows):
        mine = [r for r in rows if column_of(r) == column]

        def values(key: str, rs: list[Row] = mine) -> str:
            return ", ".join(sorted({str(r[key]) for r in rs if r.get(key)})) or "?"

        starts = sorted(r["started_at"] for r in mine if r.get("started_at"))
        ends = sorted(r["ended_at"] for r in mine if r.get("ended_at"))
        span = f"{starts[0]} to {ends[-1]}" if starts and ends else "times unknown"
        lines.append(
            f"{column_label(column, rows)}: {len(mine)} cells, {_tally(mine)};"
            f" vLLM {values('vllm_version')}{results_mod.overrides_text(mine)}"
            f" ({_commit(mine)}), rig {values('rig_version')}"
            f"{_judged_by(mine)}, host {values('host_id')}; {span}"
        )
        lines.extend(f"  vLLM under test: {text}" for text in results_mod.overlays_of(mine))
    return lines


def _commit(rows: list[Row]) -> str:
    """The vLLM commit the rows name, or what it means that they name none: a release's
    wheel or image records no commit (a build from a checkout does)."""
    commits = sorted({str(r["vllm_commit"]) for r in rows if r.get("vllm_commit")})
    if commits:
        return f"commit {', '.join(commits)}"
    if not any(r.get("vllm_version") for r in rows):
        return "commit ?"
    return "commit none: a release build records none"


def _judged_by(rows: list[Row]) -> str:
    """ ", judged by kvrig <digest>", or how many kvrigs judged rows merged into one column:
    verdicts of different kvrig code are not one run's."""
    seen = Counter(str(r.get("judged_by") or "none named") for r in rows)
    if len(seen) <= 1:
        return f", judged by kvrig {next(iter(seen), 'none named')}"
    shown = ", ".join(f"{d} ({n})" for d, n in sorted(seen.items()))
    return f", judged by {len(seen)} different kvrigs ({shown}: not one kvrig's verdicts)"


OTHER_MATRIX = "judged under another matrix"
OTHER_KVRIG = "judged by another kvrig"


def judged_apart(rows: list[Row], identity: dict[str, str], mine: str) -> dict[str, str]:
    """The rows judged under another matrix or by another kvrig, each with which, for the
    report to mark beside their verdicts."""
    out = {}
    for r in rows:
        if r.get("judged_by") != mine:
            out[r["cell_id"]] = OTHER_KVRIG
        if r["cell_id"] in identity and r.get("judged_under") != identity[r["cell_id"]]:
            out[r["cell_id"]] = OTHER_MATRIX
    return out


def judged_notes(rows: list[Row], identity: dict[str, str], mine: str, matrix: str) -> list[str]:
    """What the rows were judged under and by: a row of another matrix or kvrig is not a
    verdict this one would give, and merged with others it would pass for one."""
    other_matrix = [
        r["cell_id"]
        for r in rows
        if r["cell_id"] in identity and r.get("judged_under") != identity[r["cell_id"]]
    ]
    other_kvrig = [r["cell_id"] for r in rows if r.get("judged_by") != mine]
    out = []
    if other_matrix:
        out.append(
            f"note: {len(other_matrix)} cell(s) judged under another matrix than {matrix}"
            " (their case, model or platform spec, the vLLM pinned included, differ from it"
            f" now): {names(other_matrix)}; rerun them to judge them under it"
        )
    if other_kvrig:
        out.append(
            f"note: {len(other_kvrig)} cell(s) judged by another kvrig than this one"
            f" ({mine}; their rows name {_digests(rows, other_kvrig)}): {names(other_kvrig)};"
            " their verdicts may not be this kvrig's: rerun them"
        )
    return out


def _digests(rows: list[Row], cells: list[str]) -> str:
    chosen = set(cells)
    return ", ".join(
        sorted({str(r.get("judged_by") or "none") for r in rows if r["cell_id"] in chosen})
    )


# --- Markdown ------------------------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


EMULATED_HEADING = "Emulated GPU columns"
EMULATED_NOTE = (
    "vLLM's own CUDA, XPU and ROCm platform code, per GPU architecture, run on a CPU host: the"
    " backends it selects and validates, the block size, the early check and the KV-cache"
    " config, as far as configuration goes. No kernel runs and nothing generates; these are"
    " not hardware results and the release gate never counts them."
)


def groups(rows: list[Row]) -> list[tuple[str | None, list[str]]]:
    """The report's tables: the hardware columns, then the emulated devices' apart."""
    columns = columns_of(rows)
    hardware = [c for c in columns if not is_emulated(c)]
    emulated = [c for c in columns if is_emulated(c)]
    return [(None, hardware)] * bool(hardware) + [(EMULATED_HEADING, emulated)] * bool(emulated)


def _marked(row: Row, apart: dict[str, str]) -> str:
    """A grid cell's words: the verdict, what was shown, and why it is apart if it is."""
    why = apart.get(row["cell_id"])
    return f"{word(row)} {shown(row)}" + (f" ({why})" if why else "")


def _md_table(rows: list[Row], platforms: list[str], apart: dict[str, str]) -> list[str]:
    out = [
        "| family | model | case | " + " | ".join(column_label(p, rows) for p in platforms) + " |",
        "|---|---|---|" + "---|" * len(platforms),
    ]
    for (family, model, case), by_platform in grid(rows):
        if not any(p in by_platform for p in platforms):
            continue
        gate = " (gate)" if any(r.get("gate") for r in by_platform.values()) else ""
        cells = []
        for p in platforms:
            r = by_platform.get(p)
            cells.append("·" if r is None else f"{_icon(r)} {_md(_marked(r, apart))}")
        out.append(f"| {family} | {model} | {case}{gate} | " + " | ".join(cells) + " |")
    return out


def markdown(
    rows: list[Row],
    title: str,
    repro: Callable[[Row], list[str]] | None = None,
    apart: dict[str, str] | None = None,
) -> str:
    """The report as Markdown; `apart` marks the rows judged under another matrix or by
    another kvrig (`judged_apart`), in the grid and in a list of their own."""
    apart = apart or {}
    out = [f"# {title}", "", _tally(rows), ""]
    out += [f"- {line}" for line in run_facts(rows)]
    for heading, platforms in groups(rows):
        out.append("")
        if heading:
            out += [f"## {heading}", "", EMULATED_NOTE, ""]
        out += _md_table(rows, platforms, apart)
    if apart:
        out += ["", f"## Not judged under this matrix by this kvrig ({len(apart)})", ""]
        out += [f"- `{cid}`: {why}; {RERUN_APART}" for cid, why in apart.items()]
    failed = [r for r in rows if r.get("status") == Status.FAIL]
    if failed:
        out += ["", f"## Failures ({len(failed)})", ""]
        for r in failed:
            out.append(
                f"- **`{r['cell_id']}`**{' (gate)' if r.get('gate') else ''}:"
                f" {_md(str(r.get('reason')))}"
            )
            if repro is not None:
                out += ["  ```", *(f"  {x}" for x in repro(r)), "  ```"]
    skipped = [r for r in rows if r.get("status") == Status.SKIP]
    if skipped:
        out += ["", f"## Skipped ({len(skipped)})", ""]
        out += [f"- `{r['cell_id']}`: {_md(_what(r))}" for r in skipped]
    odd = unknown_statuses(rows)
    if odd:
        out += ["", f"## Not kvrig's verdicts ({len(odd)})", ""]
        out += [f"- {_md(x)}" for x in odd]
    return "\n".join(out) + "\n"


RERUN_APART = "its verdict is not one this matrix and kvrig would give: rerun it"


def _icon(row: Row) -> str:
    known = status_of(row)
    return _ICON[known] if known else UNKNOWN_ICON


# --- HTML ----------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em}
table{border-collapse:collapse}th,td{padding:3px 6px;border:1px solid #ddd;text-align:left}
table.grid th{max-width:8em;overflow-wrap:anywhere;font-size:13px;vertical-align:bottom}
td.cell{cursor:pointer;font-weight:600;font-size:13px;max-width:9em;overflow-wrap:anywhere}
td.cell:hover{outline:2px solid #333}
.pass{background:#d7f5dd}.fail{background:#f9d0d0}.skip{background:#e6e6e6}
.xfail{background:#fbe9c6}.unknown{background:#f9d0d0;outline:2px dashed #a00}
td.apart{outline:2px dashed #333;outline-offset:-3px}small.apart{color:#a00}
tr.group th{background:#f3f3f3;font-weight:600;max-width:none}
td.none{color:#aaa}small{color:#555;font-weight:normal}
dialog{max-width:90vw;width:70em}pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}
body.only-fail tr.clean{display:none}
"""

_SCRIPT = """
(function(){
  var dlg=document.getElementById('detail'),body=document.getElementById('detail-body');
  function open(td){
    var t=document.getElementById('t-'+td.dataset.cell);
    body.replaceChildren(t.content.cloneNode(true));
    dlg.showModal();
  }
  document.querySelectorAll('td[data-cell]').forEach(function(td){
    td.addEventListener('click',function(){open(td);});
    td.addEventListener('keydown',function(e){if(e.key==='Enter'){open(td);}});
  });
  document.getElementById('close').addEventListener('click',function(){dlg.close();});
  document.getElementById('only-fail').addEventListener('change',function(e){
    document.body.classList.toggle('only-fail',e.target.checked);
  });
  document.body.dataset.ready='1';
})();
"""


def _esc(x: object) -> str:
    return html.escape(str(x))


def _template(r: Row, d: Detail, why: str | None) -> str:
    record = json.dumps(d.record, indent=2, sort_keys=True) if d.record else "(no record)"
    parts = [
        f"<h2>{_esc(r['cell_id'])} <span class={css(r)}>{_esc(word(r))}</span></h2>",
        *([f"<p class=apart>{_esc(why)}: {_esc(RERUN_APART)}</p>"] if why else []),
        f"<p>{_esc(r.get('reason'))}</p>",
        f"<p>expected {_esc(r.get('expected'))}; shown {_esc(shown(r))};"
        f" vLLM {_esc(r.get('vllm_version'))}{_esc(results_mod.overrides_text([r]))};"
        f" host {_esc(r.get('host_id'))}</p>",
    ]
    if d.repro:
        parts.append(
            "<h3>Rerun it alone</h3><pre class=repro>" + _esc("\n".join(d.repro)) + "</pre>"
        )
    parts.append(
        f"<h3>Log (last {LOG_TAIL_LINES} lines)</h3>"
        f"<pre class=log>{_esc(d.log_tail or '(no log)')}</pre>"
    )
    parts.append(f"<h3>Record</h3><pre class=record>{_esc(record)}</pre>")
    return f"<template id='t-{_esc(r['cell_id'])}'>{''.join(parts)}</template>"


def _clean(by_platform: dict[str, Row], platforms: list[str]) -> bool:
    """No failure (nor a status kvrig never writes) on any of the table's columns."""
    return all(
        status_of(by_platform[p]) not in (Status.FAIL, None) for p in platforms if p in by_platform
    )


def _td(r: Row | None, apart: dict[str, str]) -> str:
    if r is None:
        return "<td class=none>·</td>"
    why = apart.get(r["cell_id"])
    mark = f" <small class=apart>{_esc(why)}</small>" if why else ""
    return (
        f"<td class='cell {css(r)}{' apart' if why else ''}' data-cell='{_esc(r['cell_id'])}'"
        f" tabindex=0 title='{_esc(_what(r))}'>{_esc(word(r))}"
        f" <small>{_esc(shown(r))}</small>{mark}</td>"
    )


def _html_table(rows: list[Row], platforms: list[str], apart: dict[str, str], tid: str) -> str:
    """A grid: a heading row per family and model, then a row per case of it."""
    head = "".join(f"<th>{_esc(short_label(p, rows))}</th>" for p in platforms)
    mine = [(k, by) for k, by in grid(rows) if any(p in by for p in platforms)]
    trs = []
    for i, ((family, model, case), by_platform) in enumerate(mine):
        if i == 0 or mine[i - 1][0][:2] != (family, model):
            group = [by for k, by in mine if k[:2] == (family, model)]
            clean = all(_clean(by, platforms) for by in group)
            trs.append(
                f"<tr class='group {'clean' if clean else 'dirty'}'>"
                f"<th colspan={len(platforms) + 1}>{_esc(family)} · {_esc(model)}</th></tr>"
            )
        gate = " <small>gate</small>" if any(r.get("gate") for r in by_platform.values()) else ""
        tds = "".join(_td(by_platform.get(p), apart) for p in platforms)
        trs.append(
            f"<tr class={'clean' if _clean(by_platform, platforms) else 'dirty'}>"
            f"<td>{_esc(case)}{gate}</td>{tds}</tr>"
        )
    return (
        f"<table id={tid} class=grid><thead><tr><th>case</th>{head}</tr></thead>"
        f"<tbody>{''.join(trs)}</tbody></table>"
    )


def _overview(rows: list[Row], apart: dict[str, str]) -> str:
    """The whole matrix as one picture (kvrig.publish.overview): a line per column, the
    hardware's first, a square per case in the grids' order."""
    cases = grid(rows)
    gaps = {i for i in range(1, len(cases)) if cases[i][0][:2] != cases[i - 1][0][:2]}
    lines = []
    for column in columns_of(rows):
        squares: list[overview_mod.Square | None] = []
        for _, by_column in cases:
            r = by_column.get(column)
            if r is None:
                squares.append(None)
                continue
            why = apart.get(r["cell_id"])
            title = f"{r['cell_id']}: {word(r)} {shown(r)}" + (f" ({why})" if why else "")
            squares.append(
                overview_mod.Square(css(r) + (" apart" if why else ""), title, r["cell_id"])
            )
        lines.append(overview_mod.Line(short_label(column, rows), squares))
    legend = [(s.value, s.word.lower()) for s in Status] + [("unknown", "not kvrig's")]
    return overview_mod.picture(lines, gaps, legend)


def to_html(
    rows: list[Row],
    title: str,
    details: dict[str, Detail] | None = None,
    apart: dict[str, str] | None = None,
) -> str:
    """The page: the picture, the grids, the failures and the rows judged apart; a
    template per cell holds what clicking it opens."""
    details, apart = details or {}, apart or {}
    tables = []
    for heading, platforms in groups(rows):
        if heading is None:
            tables.append(_html_table(rows, platforms, apart, "grid"))
        else:
            tables.append(
                f"<h2 id=emulated>{_esc(heading)}</h2><p>{_esc(EMULATED_NOTE)}</p>"
                + _html_table(rows, platforms, apart, "emulated-grid")
            )
    templates = [
        _template(r, details.get(r["cell_id"], Detail()), apart.get(r["cell_id"])) for r in rows
    ]
    facts = "".join(f"<li>{_esc(x)}</li>" for x in run_facts(rows))
    return (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{_esc(title)}</title><style>{_STYLE}{overview_mod.STYLE}</style><body>"
        f"<h1>{_esc(title)}</h1><p id=tally>{_esc(_tally(rows))}</p>"
        f"{_overview(rows, apart)}<ul>{facts}</ul>"
        "<label><input type=checkbox id=only-fail> only rows with a failure</label>"
        f"{''.join(tables)}"
        "<p><small>Click a cell for its record, log and the commands that rerun it.</small></p>"
        f"{_html_lists(rows, apart)}"
        "<dialog id=detail><button id=close>close</button><div id=detail-body></div></dialog>"
        f"{''.join(templates)}<script>{_SCRIPT}</script></body></html>\n"
    )


def _html_lists(rows: list[Row], apart: dict[str, str]) -> str:
    """The failures, the rows that are no verdict of kvrig's and those judged apart."""
    out = ""
    failed = [r for r in rows if r.get("status") == Status.FAIL]
    if failed:
        out += f"<h2>Failures ({len(failed)})</h2><ul id=failures>" + "".join(
            f"<li><code>{_esc(r['cell_id'])}</code>: {_esc(r.get('reason'))}</li>" for r in failed
        )
        out += "</ul>"
    odd = unknown_statuses(rows)
    if odd:
        out += f"<h2>Not kvrig's verdicts ({len(odd)})</h2><ul id=unknown>"
        out += "".join(f"<li>{_esc(x)}</li>" for x in odd) + "</ul>"
    if apart:
        out += f"<h2>Not judged under this matrix by this kvrig ({len(apart)})</h2><ul id=apart>"
        out += "".join(
            f"<li><code>{_esc(cid)}</code>: {_esc(why)}; {_esc(RERUN_APART)}</li>"
            for cid, why in apart.items()
        )
        out += "</ul>"
    return out


# --- reading and writing -------------------------------------------------------------------


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def repro_lines(r: Row) -> list[str]:
    overlay = results_mod.overlay_of(r)
    try:
        return repro_mod.lines(r["cell_id"], column_of(r), r.get("image"), overlay)
    except (TypeError, ValueError):  # an overlay not as kvrig writes one: rerun without it
        return repro_mod.lines(r["cell_id"], column_of(r), r.get("image"), None)


def gather(merged: results_mod.Merged) -> dict[str, Detail]:
    """Each cell's record and log tail, looked up beside the results file it came from."""
    out = {}
    for r in merged.rows:
        cid = r["cell_id"]
        folder = merged.sources[cid].parent
        record_path = folder / "records" / f"{cid}.json"
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            record = None
        log = folder / "logs" / f"{cid}.log"
        if not log.exists() and r.get("log"):
            log = Path(r["log"])
        out[cid] = Detail(record, log_tail(log), repro_lines(r))
    return out


def write_merged(
    merged: results_mod.Merged, out: Path, title: str, apart: dict[str, str] | None = None
) -> tuple[Path, Path]:
    """Writes report.md and report.html into `out` (`apart`: see `judged_apart`);
    returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md, page = out / "report.md", out / "report.html"
    md.write_text(markdown(merged.rows, title, repro_lines, apart))
    page.write_text(to_html(merged.rows, title, gather(merged), apart))
    return md, page


def write(results: Path) -> tuple[Path, Path]:
    """Writes report.md and report.html beside one folder's results; returns their paths."""
    return write_merged(results_mod.collect([results]), results, f"kvrig results: {results.name}")
