"""Columns run one after another (or two side by side), each in a `kvrig column` process
of its own, so a column that breaks costs only itself.

Two emulated columns side by side, one worker each, keep both cores busy through each
other's start and report; lanes of groups make the two vLLM imports overlap at the start.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kvrig.run import prefixed
from kvrig.run.platform_parent import Parents, parents_for

Run = Callable[[Sequence[str]], int]
Beside = Callable[..., int]
# Emulated columns run this many at a time, each with one worker (-n 0: its cells in the
# pytest process, beside one warm parent).
SIDE_BY_SIDE = 2
ONE_WORKER = ["-n", "0"]


def declare_emulated(parser: argparse.ArgumentParser) -> None:
    """`--only DEVICE` and `--rerun`, declared once so `kvrig emulated` and `kvrig release
    diff` choose devices and resume alike, in the same words."""
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


def run_each(
    columns: Sequence[tuple[str, list[str]]],
    run: Run = _run,
    at_once: int = 1,
    beside: Beside = prefixed.run,
    groups: Sequence[str] | None = None,
) -> list[tuple[str, int]]:
    """Each (column, command) run, in turn or `at_once` side by side; each column's exit
    code, in the order given. With `groups`, a group's columns share its platform parents."""
    if at_once <= 1:
        outcome = []
        for column, command in columns:
            print(f"kvrig: the {column} column", file=sys.stderr, flush=True)
            outcome.append((column, run(command)))
        return outcome
    order = lanes(groups) if groups is not None else list(range(len(columns)))
    left = Counter(groups or ())
    counting = threading.Lock()

    def one(index: int, parents: Parents | None) -> int:
        column, command = columns[index]
        with prefixed.PRINTING:
            print(f"kvrig: the {column} column", file=sys.stderr, flush=True)
        if parents is None or groups is None:
            return beside(column, command)
        code = beside(column, command, parents.env(groups[index]))
        with counting:
            left[groups[index]] -= 1
            done = not left[groups[index]]
        if done:
            parents.stop(groups[index])
        return code

    codes: dict[int, int] = {}
    with (
        parents_for(list(groups) if groups is not None else None) as parents,
        ThreadPoolExecutor(at_once) as pool,
    ):
        for index, code in zip(order, pool.map(lambda i: one(i, parents), order), strict=True):
            codes[index] = code
    return [(column, codes[i]) for i, (column, _) in enumerate(columns)]


def lanes(groups: Sequence[str], count: int = SIDE_BY_SIDE) -> list[int]:
    """The order to run grouped columns in (indices into `groups`), so the first columns side
    by side start different groups' parents and the two imports overlap."""
    members: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    dealt: list[list[int]] = [[] for _ in range(max(1, count))]
    for group in sorted(members, key=lambda g: -len(members[g])):
        min(dealt, key=len).extend(members[group])
    order = []
    for turn in range(max(len(lane) for lane in dealt)):
        order += [lane[turn] for lane in dealt if turn < len(lane)]
    return order


def run_columns(
    columns: Sequence[tuple[str, list[str]]],
    title: str,
    run: Run = _run,
    at_once: int = 1,
    groups: Sequence[str] | None = None,
) -> int:
    """Runs each (column, command), in turn or `at_once` side by side, then prints one line
    per column; 1 if any column failed or was refused, else 0."""
    outcome = run_each(columns, run, at_once, groups=groups)
    print(f"\nkvrig: {title}")
    for column, code in outcome:
        word = {0: "passed", 2: "refused"}.get(code, "FAILED")
        print(f"  {word:<7} {column}  (results/{column})")
    return 1 if any(code for _, code in outcome) else 0
