"""Reading results: `kvrig report` and `kvrig compare`.

The folders are merged into one set of rows, a tree of downloaded CI artifacts too; rows
judged under another matrix or by another kvrig are marked, since they may not compare.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kvrig.cli.usage import UsageError
from kvrig.define import column_names, named_release
from kvrig.define.cells import expand, judged_under
from kvrig.define.column_names import columns
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.paths import RESULTS_ROOT, column_folders
from kvrig.publish import compare, report
from kvrig.publish import gate as gate_mod
from kvrig.publish import results as results_mod
from kvrig.rules import versions


def folders_of(given: list[str] | None) -> list[Path]:
    """The folders named, else results/<column> (and its shards) under the working dir."""
    if given:
        return [Path(g) for g in given]
    return column_folders(RESULTS_ROOT, columns())


def collect(given: list[str] | None, what: str, empty_ok: bool = False) -> results_mod.Merged:
    folders = folders_of(given)
    merged = results_mod.collect(folders)
    if not merged.rows and not empty_ok:
        shown = ", ".join(str(f) for f in folders) or "results/<platform>"
        raise UsageError(
            f"No results in {shown}. Run a column first (nox -s local, or nox -s"
            f" cpu|cuda|xpu|rocm), then {what} its results folder(s); a folder may also hold"
            " several results folders (downloaded CI artifacts), which are merged."
        )
    for clash in merged.clashes:
        print(f"note: {clash}", file=sys.stderr)
    return merged


def in_matrix_order(merged: results_mod.Merged, matrix_path: str) -> None:
    """Rows in matrix order (as finished they are in completion order); others at the end."""
    try:
        order = {c.id: i for i, c in enumerate(expand(load(matrix_path)))}
    except MatrixError:
        order = {}
    merged.rows.sort(key=lambda r: order.get(r["cell_id"], len(order)))


def identities(matrix: Matrix, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each row's cell's judged_under under the matrix, for the release the row ran, so a
    --vllm column's rows are compared with what that release expects."""
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((report.column_of(r), r.get("vllm_version")), []).append(r)
    out: dict[str, str] = {}
    for (column, ran), group in groups.items():
        under = _for_release(matrix, column, ran)
        if under is not None:
            out.update({c.id: judged_under(c) for c in gate_mod.column_cells(under, column, group)})
    return out


def _for_release(matrix: Matrix, column: str, ran: str | None) -> Matrix | None:
    named = column_names.parse(column)
    if named is None:
        return None
    pin = named_release.pinned(matrix, named.platform)
    try:
        if ran is None or pin is None or versions.parse(str(ran)) == versions.parse(pin):
            return matrix
        return named_release.for_column(matrix, named.platform, named.device_emulated, str(ran))[0]
    except (versions.VersionError, MatrixError):
        return None


def judged_apart(
    merged: results_mod.Merged, matrix_path: str | None
) -> tuple[dict[str, str], list[str]]:
    """The rows judged under another matrix or by another kvrig, each with which (what
    report.md and report.html mark), and the terminal's notes on them."""
    try:
        matrix = load(matrix_path)
    except MatrixError:
        return {}, []
    known = identities(matrix, merged.rows)
    shown = str(matrix.path or matrix_path or "matrix.yaml")
    mine = results_mod.judged_by()
    return (
        report.judged_apart(merged.rows, known, mine),
        report.judged_notes(merged.rows, known, mine, shown),
    )


def refuse_unknown(rows_by_source: dict[str, list[dict[str, Any]]], what: str) -> None:
    """One paragraph, exit 2, for rows whose status kvrig never writes (after the command
    showed them): a malformed results file is the user's to fix, not a regression."""
    odd = [
        f"{src}: {r.get('cell_id')} {r.get('status')!r}"
        for src, rows in rows_by_source.items()
        for r in rows
        if report.status_of(r) is None
    ]
    if odd:
        raise UsageError(
            f"{len(odd)} row(s) carry a status kvrig never writes ({'; '.join(odd[:4])}"
            f"{' and more' if len(odd) > 4 else ''}; kvrig writes"
            f" {', '.join(s.value for s in report.Status)}): something other than kvrig wrote"
            f" or changed those results files, so {what} cannot read them as verdicts. Rerun"
            " those cells (kvrig column --kvrig-cell ID) or restore the files."
        )


def cmd_report(ns: argparse.Namespace, extra: list[str]) -> int:
    merged = collect(ns.results, "report on")
    in_matrix_order(merged, ns.matrix)
    folders = sorted({str(p.parent) for p in merged.sources.values()})
    out = Path(ns.out) if ns.out else Path(os.path.commonpath(folders))
    title = "kvrig results: " + ", ".join(report.columns_of(merged.rows))
    apart, notes = judged_apart(merged, ns.matrix)
    md, page = report.write_merged(merged, out, title, apart)
    print(report.terminal(merged.rows))
    for line in report.run_facts(merged.rows):
        print(line)
    for line in notes:
        print(line)
    print(f"\nresults: {', '.join(folders)}\nreport: {md}  {page}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(md.read_text())
    refuse_unknown({", ".join(folders): merged.rows}, "the report")
    return 0


def cmd_compare(ns: argparse.Namespace, extra: list[str]) -> int:
    """Exit 1 when a cell that passed on the first run is red on the second, or missing."""
    runs = []
    for given in (ns.results_a, ns.results_b):
        merged = collect([given], "compare")
        in_matrix_order(merged, ns.matrix)
        runs.append(merged.rows)
    found = compare.compare(*runs)
    for label, given, rows in (("A", ns.results_a, runs[0]), ("B", ns.results_b, runs[1])):
        print(f"{label}: {given}")
        for line in report.run_facts(rows):
            print(f"   {line}")
    print()
    print(compare.table(found, ns.results_a, ns.results_b))
    refuse_unknown({ns.results_a: runs[0], ns.results_b: runs[1]}, "compare")
    return 1 if found.regressed else 0


def register(sub: Any) -> None:
    r = sub.add_parser("report", help="print and write the report of results folders")
    r.add_argument("results", nargs="*", help="folders or trees (default: results/<platform>)")
    r.add_argument("--out", help="folder for report.md and report.html (default: their parent)")
    r.set_defaults(run=cmd_report)
    cp = sub.add_parser(
        "compare",
        help="the cells two runs differ on; exit 1 if one that passed is red or missing on B",
    )
    cp.add_argument("results_a", metavar="RESULTS_A", help="the first run (e.g. the release)")
    cp.add_argument("results_b", metavar="RESULTS_B", help="the second (e.g. a branch on it)")
    cp.set_defaults(run=cmd_compare)
