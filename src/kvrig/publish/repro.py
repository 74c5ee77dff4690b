"""The commands that rerun one cell alone: on the host, and in its platform's container.

A failing cell is only actionable when whoever reads the report can rerun exactly it, so
report, gate and the failing test all print these lines. They are built from the cell's
id, column and image alone (no checkout is read): the `docker run` line is the one
kvrig.containers runs, on the image the cell ran in, or the platform's latest build.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from kvrig.containers import plan
from kvrig.define.paths import results_folder


def selector(cell_id: str) -> list[str]:
    """Exactly this cell (pytest's -k would also pick the ids it is a part of)."""
    return ["--kvrig-cell", cell_id]


def _column_args(column: str) -> list[str]:
    platform, _, cls = column.partition("-")
    return ["--kvrig-isa", cls] if platform == "cpu" and cls else []


def host_command(cell_id: str, column: str) -> str:
    return shlex.join(["nox", "-s", "local", "--", *_column_args(column), *selector(cell_id)])


def session_command(cell_id: str, column: str) -> str:
    """Builds the image when needed, then runs the cell in it."""
    platform = column.split("-", 1)[0]
    return shlex.join(["nox", "-s", platform, "--", *_column_args(column), *selector(cell_id)])


def docker_command(cell_id: str, column: str, image: str | None = None) -> str:
    platform = column.split("-", 1)[0]
    tag = image or f"{plan.IMAGE_REPO.format(platform=platform)}:latest"
    argv = plan.run_command(
        "docker",
        platform,
        tag,
        "kvrig-repro",
        Path(results_folder(column)).resolve(),
        plan.host_facts("docker"),
        [*_column_args(column), *selector(cell_id)],
    )
    return shlex.join(argv)


def lines(cell_id: str, column: str | None = None, image: str | None = None) -> list[str]:
    """Host and container commands; the `docker run` line writes to results/<column>."""
    column = column or cell_id.split("-", 1)[0]
    return [
        f"host:      {host_command(cell_id, column)}",
        f"container: {session_command(cell_id, column)}",
        f"           {docker_command(cell_id, column, image)}",
    ]
