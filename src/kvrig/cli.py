"""The `kvrig` command: run a column, list cells, validate the matrix, report, gate.

Every failure a user can cause (a bad matrix, an unknown platform, a missing results
folder) ends with one paragraph on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from kvrig import gate as gate_mod
from kvrig import hardware, report
from kvrig import results as results_mod
from kvrig.matrix import DEFAULT_MATRIX, PLATFORMS, MatrixError, expand, load
from kvrig.runner import ResultsFolderError, check_results_folder


class UsageError(Exception):
    """A one-paragraph message for the user; the command exits 2."""


def _tests_dir() -> Path:
    for base in (os.environ.get("KVRIG_HOME"), os.getcwd(), str(DEFAULT_MATRIX.parent)):
        if base and (Path(base) / "tests" / "integration").is_dir():
            return Path(base) / "tests" / "integration"
    raise UsageError(
        "Cannot find tests/integration: run kvrig from its checkout (or the image's /opt/kvrig),"
        " or set KVRIG_HOME to the folder that holds tests/integration."
    )


def column_args(
    platform: str, results: Path, matrix: Path, extra: list[str], tests: Path
) -> list[str]:
    """The pytest command line that runs one platform's column (pure; shared by nox)."""
    return [
        str(tests),
        f"--kvrig-platform={platform}",
        f"--kvrig-results={results}",
        f"--kvrig-matrix={matrix}",
        f"--junitxml={results / 'junit.xml'}",
        "-v",  # a line per cell as it ends: progress on a long column
        "-p",
        "no:cacheprovider",
        *extra,
    ]


def with_workers(extra: list[str], workers: int) -> list[str]:
    """Adds pytest-xdist's -n unless the user chose (or one worker is asked for)."""
    if workers <= 1 or any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in extra):
        return extra
    return ["-n", str(workers), *extra]


def cmd_column(ns: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    platform = ns.platform or hardware.detect_platform()
    if platform not in PLATFORMS:
        raise UsageError(f"Unknown platform {platform!r}; kvrig knows {', '.join(PLATFORMS)}.")
    matrix = load(ns.matrix)  # refuse a bad matrix before pytest starts
    results = Path(ns.results or Path("results") / platform).resolve()
    try:
        check_results_folder(results)
    except ResultsFolderError as exc:
        raise UsageError(str(exc)) from None
    if ns.cold:
        extra = ["--kvrig-cold", *extra]
    if ns.rerun:
        extra = ["--kvrig-rerun", *extra]
    spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
    workers = spec.parallel if spec and importlib.util.find_spec("xdist") else 1
    args = column_args(
        platform, results, Path(ns.matrix).resolve(), with_workers(extra, workers), _tests_dir()
    )
    return int(pytest.main(args))


def cmd_cells(ns: argparse.Namespace) -> int:
    m = load(ns.matrix)
    for cell in expand(m, ns.platform):
        gate = " [gate]" if cell.case.gate else ""
        print(f"{cell.id:<45} {cell.expect.outcome:<12}{gate}")
    return 0


def cmd_validate(ns: argparse.Namespace) -> int:
    m = load(ns.matrix)
    n = sum(len(expand(m, p)) for p in m.platforms)
    print(f"{ns.matrix}: valid ({len(m.models)} models, {len(m.cases)} cases, {n} cells)")
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    rows_found = False
    for folder in ns.results:
        folder = Path(folder)
        rows = results_mod.read(folder)
        if not rows:
            print(f"{folder}: no results yet", file=sys.stderr)
            continue
        rows_found = True
        md, page = report.write(folder)
        print(report.terminal(rows))
        print(
            f"\nresults: {folder}/results.jsonl  records: {folder}/records/  logs: "
            f"{folder}/logs/\nreport: {md}  {page}"
        )
    if not rows_found:
        raise UsageError(
            f"No results in {', '.join(ns.results)}. Run a column first (nox -s local, or"
            " nox -s cpu|cuda|xpu), then report on its results folder."
        )
    return 0


def cmd_gate(ns: argparse.Namespace) -> int:
    m = load(ns.matrix)
    platforms = ns.platform or [p for p in m.platforms if (Path(ns.results) / p).is_dir()]
    res = gate_mod.evaluate(m, gate_mod.load_rows(Path(ns.results), platforms))
    print("\n".join(res.lines))
    print("gate: PASS" if res.passed else "gate: FAIL")
    return 0 if res.passed else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvrig", description=__doc__.splitlines()[0])
    p.add_argument("--matrix", default=str(DEFAULT_MATRIX), help="matrix file (matrix.yaml)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("column", help="run one platform's cells (extra args go to pytest)")
    c.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
    c.add_argument("--results", help="default: results/<platform>")
    c.add_argument(
        "--cold",
        action="store_true",
        help="a fresh interpreter per cell instead of forking a warm vLLM parent (slower)",
    )
    c.add_argument(
        "--rerun",
        action="store_true",
        help="run every cell again even if the last run was cut short (default: resume)",
    )
    cl = sub.add_parser("cells", help="list the cells of the matrix")
    cl.add_argument("--platform", choices=PLATFORMS)
    sub.add_parser("validate", help="check matrix.yaml and count its cells")
    r = sub.add_parser("report", help="print and write the report of results folders")
    r.add_argument("results", nargs="+")
    g = sub.add_parser("gate", help="exit 0 only if every gating cell passed")
    g.add_argument("--results", default="results")
    g.add_argument("--platform", action="append", choices=PLATFORMS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ns, extra = parser().parse_known_args(args)
    if extra and ns.command != "column":
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    if extra[:1] == ["--"]:
        extra = extra[1:]
    try:
        handler = {
            "cells": cmd_cells,
            "validate": cmd_validate,
            "report": cmd_report,
            "gate": cmd_gate,
        }.get(ns.command)
        return handler(ns) if handler else cmd_column(ns, extra)
    except (MatrixError, UsageError) as exc:
        print(f"kvrig: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
