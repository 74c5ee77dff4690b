"""Commands whose command line is their own module's: `kvrig container` and `kvrig bench`.

kvrig hands them everything after the command's name, so what `container --dry-run`
prints is what runs and pytest arguments pass through exactly as given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from kvrig.column import bench
from kvrig.containers import launch


def _container(argv: Sequence[str], matrix: str | None) -> int:
    return launch.main([*(["--matrix", matrix] if matrix else []), *argv])


def _bench(argv: Sequence[str], matrix: str | None) -> int:
    if matrix:  # read by every process the benchmark starts (kvrig.define.loader)
        os.environ["KVRIG_MATRIX"] = matrix
    return bench.main(list(argv))


COMMANDS: dict[str, tuple[Callable[[Sequence[str], str | None], int], str]] = {
    "container": (
        _container,
        "build a platform's image and run its column inside it (kvrig container cpu"
        " --help; extra args go to the column's pytest)",
    ),
    "bench": (_bench, "speed and memory figures against their targets (kvrig bench --help)"),
}


def split(argv: Sequence[str]) -> tuple[str | None, str, list[str]] | None:
    """(the global --matrix, the command, its arguments) when argv names one of these
    commands (after kvrig's own options, --matrix alone), else None."""
    matrix, i = None, 0
    while i < len(argv):
        if argv[i] == "--matrix" and i + 1 < len(argv):
            matrix, i = argv[i + 1], i + 2
        elif argv[i].startswith("--matrix="):
            matrix, i = argv[i].split("=", 1)[1], i + 1
        else:
            break
    if i < len(argv) and argv[i] in COMMANDS:
        return matrix, argv[i], list(argv[i + 1 :])
    return None


def run(argv: Sequence[str]) -> int | None:
    """The delegated command's exit status, or None when argv names none of them; the
    global --matrix is handed on."""
    found = split(argv)
    if found is None:
        return None
    matrix, name, rest = found
    handler, _ = COMMANDS[name]
    return handler(rest, matrix)


def register(sub: Any) -> None:
    """Listed in `kvrig --help` with the others; their own --help says the rest. `run`
    reads them before kvrig's parser does, so these parsers take nothing themselves."""
    for name, (handler, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False).set_defaults(
            run=lambda ns, extra, handler=handler: handler(extra, ns.matrix), pytest_args=True
        )
