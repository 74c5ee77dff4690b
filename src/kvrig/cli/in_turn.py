"""Columns run one after another, each in a `kvrig column` process of its own.

`kvrig cpu-classes` and `kvrig emulated` run several columns; one that breaks (a crash, a
refusal) must cost only itself, and the end must say which passed, so each is its own
process and the outcome is one line per column, red if any column is.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Sequence

Run = Callable[[Sequence[str]], int]


def declare_emulated(parser: argparse.ArgumentParser) -> None:
    """`--only DEVICE` and `--rerun`, as every command that runs the emulated columns in
    turn takes them (`kvrig emulated`, `kvrig release diff`): declared once, so the two
    choose devices and resume alike and say so in the same words."""
    parser.add_argument(
        "--only",
        action="append",
        metavar="DEVICE",
        help="only this device (cuda:9.0, xpu:bmg) or platform (cuda); repeatable",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run every cell again (default: resume)"
    )


def kvrig_command(matrix: str | None, *args: str) -> list[str]:
    """`kvrig [--matrix M] ARGS` in this interpreter (the one with the column's vLLM)."""
    return [sys.executable, "-m", "kvrig", *(["--matrix", matrix] if matrix else []), *args]


def _run(command: Sequence[str]) -> int:
    return subprocess.run(list(command), check=False).returncode


def run_columns(columns: Sequence[tuple[str, list[str]]], title: str, run: Run = _run) -> int:
    """Runs each (column, command) in turn, then prints one line per column; 1 if any
    column failed or was refused, else 0."""
    outcome = []
    for column, command in columns:
        print(f"kvrig: the {column} column", file=sys.stderr, flush=True)
        outcome.append((column, run(command)))
    print(f"\nkvrig: {title}")
    for column, code in outcome:
        word = {0: "passed", 2: "refused"}.get(code, "FAILED")
        print(f"  {word:<7} {column}  (results/{column})")
    return 1 if any(code for _, code in outcome) else 0
