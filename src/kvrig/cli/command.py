"""The `kvrig` command: its subcommands, and the one way a user's mistake ends.

Every failure a user can cause ends with one paragraph on stderr and exit status 2, never
a traceback: each layer raises its own error, and they are caught here.
"""

from __future__ import annotations

import argparse
import sys

from kvrig.cli import (
    check,
    columns,
    delegated,
    gate,
    host,
    matrix,
    predict,
    release,
    results,
    setup,
)
from kvrig.cli.usage import UsageError
from kvrig.containers.plan import UsageError as ContainerUsageError
from kvrig.define.column_choice import ChoiceError
from kvrig.define.matrix import MatrixError
from kvrig.publish.pipeline import ShardError

DESCRIPTION = (
    "kvrig: run a column of matrix.yaml on real vLLM engines (here, in its container, or"
    " on an emulated GPU), list and validate the matrix, report, compare and gate results,"
    " predict a checkpoint's block size; and the steps the nox sessions are made of"
    " (setup, check)."
)
# The order `kvrig --help` lists them in: running, reading, then the sessions' steps.
GROUPS = (columns, delegated, matrix, host, predict, results, release, gate, setup, check)
USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    MatrixError,
    ChoiceError,
    ShardError,
    ContainerUsageError,
    *setup.USER_ERRORS,
    *check.USER_ERRORS,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvrig", description=DESCRIPTION)
    p.add_argument("--matrix", default=None, help="matrix file (default: ./matrix.yaml)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        code = delegated.run(args)
        if code is not None:
            return code
        p = parser()
        ns, extra = p.parse_known_args(args)
        if extra and not getattr(ns, "pytest_args", False):
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        if extra[:1] == ["--"]:
            extra = extra[1:]
        ns.argv = list(args)  # a command re-run elsewhere (a release's environment) as given
        return int(ns.run(ns, extra))
    except USER_ERRORS as exc:
        print(f"kvrig: {exc}", file=sys.stderr)
        return 2
