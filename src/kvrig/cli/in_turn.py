"""Columns run one after another (or two side by side), each in a `kvrig column` process
of its own.

`kvrig cpu-classes`, `kvrig emulated` and `kvrig release diff` run several columns; one
that breaks (a crash, a refusal) must cost only itself, and the end must say which passed,
so each is its own process and the outcome is one line per column, red if any column is.
An emulated column is one warm vLLM parent and a core's worth of cells, so two of them side
by side, one worker each, keep both cores busy through each other's start, collection and
report, where one column with two workers starts two parents and leaves a core idle
between cells; their lines are printed as they come, each prefixed with its column.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

Run = Callable[[Sequence[str]], int]
# Emulated columns run this many at a time, each with one worker (-n 0: its cells in the
# pytest process, beside one warm parent).
SIDE_BY_SIDE = 2
ONE_WORKER = ["-n", "0"]


def declare_emulated(parser: argparse.ArgumentParser) -> None:
    """`--only DEVICE` and `--rerun`, as every command that runs the emulated columns in
    turn takes them (`kvrig emulated`, `kvrig release diff`): declared once, so the two
    choose devices and resume alike and say so in the same words."""
    parser.add_argument(
        "--only",
        action="append",
        metavar="DEVICE",
        help="only this device (cuda:9.0, xpu:bmg, rocm:gfx942) or platform (cuda, rocm);"
        " repeatable",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run every cell again (default: resume)"
    )


def kvrig_command(matrix: str | None, *args: str) -> list[str]:
    """`kvrig [--matrix M] ARGS` in this interpreter (the one with the column's vLLM)."""
    return [sys.executable, "-m", "kvrig", *(["--matrix", matrix] if matrix else []), *args]


def _run(command: Sequence[str]) -> int:
    return subprocess.run(list(command), check=False).returncode


_PRINTING = threading.Lock()


def _run_prefixed(column: str, command: Sequence[str]) -> int:
    """The column's process with each line it prints prefixed by the column, as it comes."""
    proc = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        with _PRINTING:
            sys.stdout.write(f"[{column}] {line}")
            sys.stdout.flush()
    return proc.wait()


def run_each(
    columns: Sequence[tuple[str, list[str]]],
    run: Run = _run,
    at_once: int = 1,
    beside: Callable[[str, Sequence[str]], int] = _run_prefixed,
) -> list[tuple[str, int]]:
    """Each (column, command) run, in turn or `at_once` side by side; each column's exit
    code, in the order given."""
    if at_once <= 1:
        outcome = []
        for column, command in columns:
            print(f"kvrig: the {column} column", file=sys.stderr, flush=True)
            outcome.append((column, run(command)))
        return outcome

    def one(job: tuple[str, list[str]]) -> int:
        with _PRINTING:
            print(f"kvrig: the {job[0]} column", file=sys.stderr, flush=True)
        return beside(*job)

    with ThreadPoolExecutor(at_once) as pool:
        codes = list(pool.map(one, columns))
    return [(column, code) for (column, _), code in zip(columns, codes, strict=True)]


def run_columns(
    columns: Sequence[tuple[str, list[str]]],
    title: str,
    run: Run = _run,
    at_once: int = 1,
) -> int:
    """Runs each (column, command), in turn or `at_once` side by side, then prints one line
    per column; 1 if any column failed or was refused, else 0."""
    outcome = run_each(columns, run, at_once)
    print(f"\nkvrig: {title}")
    for column, code in outcome:
        word = {0: "passed", 2: "refused"}.get(code, "FAILED")
        print(f"  {word:<7} {column}  (results/{column})")
    return 1 if any(code for _, code in outcome) else 0
