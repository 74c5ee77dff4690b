"""Reading results: `kvrig report` and `kvrig compare`.

The folders named, or every column's under results/ (a tree of downloaded CI artifacts
too), are merged into one set of rows; a command with none to read says how to make some.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kvrig.cli.usage import UsageError
from kvrig.define.cells import expand
from kvrig.define.column_names import columns
from kvrig.define.matrix import MatrixError, load
from kvrig.define.paths import RESULTS_ROOT, column_folders
from kvrig.publish import compare, report
from kvrig.publish import results as results_mod


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
            f"No results in {shown}. Run a column first (nox -s local, or nox -s cpu|cuda|xpu),"
            f" then {what} its results folder(s); a folder may also hold several results"
            " folders (downloaded CI artifacts), which are merged."
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


def cmd_report(ns: argparse.Namespace, extra: list[str]) -> int:
    merged = collect(ns.results, "report on")
    in_matrix_order(merged, ns.matrix)
    folders = sorted({str(p.parent) for p in merged.sources.values()})
    out = Path(ns.out) if ns.out else Path(os.path.commonpath(folders))
    title = "kvrig results: " + ", ".join(report.columns_of(merged.rows))
    md, page = report.write_merged(merged, out, title)
    print(report.terminal(merged.rows))
    for line in report.run_facts(merged.rows):
        print(line)
    print(f"\nresults: {', '.join(folders)}\nreport: {md}  {page}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(md.read_text())
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
