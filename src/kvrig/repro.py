"""The commands that rerun one cell alone: on the host, and in its platform's container.

A failing cell is only actionable when whoever reads the report can rerun exactly it, so
report, gate and the failing test all print these lines. The container line is the very
`docker run` kvrig.containers would execute (built by its functions, from this checkout).
"""

from __future__ import annotations

import functools
import os
import shlex
from pathlib import Path

from kvrig import containers


def selector(cell_id: str) -> list[str]:
    """pytest's -k for exactly this cell: `-k <id>` alone also picks ids it prefixes."""
    return ["-k", f"test_cell[{cell_id}]"]


def host_command(cell_id: str) -> str:
    return shlex.join(["nox", "-s", "local", "--", *selector(cell_id)])


def session_command(platform: str, cell_id: str) -> str:
    """Builds the image when needed, then runs the cell in it."""
    return shlex.join(["nox", "-s", platform, "--", *selector(cell_id)])


@functools.lru_cache(maxsize=8)
def _plan(platform: str, root: Path) -> containers.Plan | None:
    args = containers.Args(platform, True, "docker", None, None, False, [])
    try:
        return containers.make_plan(
            args, root, containers.host_facts("docker"), "docker", dict(os.environ), "kvrig-repro"
        )
    except (containers.UsageError, OSError):
        return None


def docker_command(platform: str, cell_id: str, image: str | None = None) -> str | None:
    """The `docker run` line, or None outside a kvrig checkout (no image to name)."""
    try:
        root = containers.find_root(Path.cwd())
    except containers.UsageError:
        return None
    plan = _plan(platform, root)
    if plan is None:
        return None
    argv = [*plan.run, *selector(cell_id)]
    if image and image != plan.image:  # the image the cell ran in, not this checkout's
        argv = [image if a == plan.image else a.replace(plan.image, image) for a in argv]
    return shlex.join(argv)


def lines(platform: str, cell_id: str, image: str | None = None) -> list[str]:
    """Host and container commands; the `docker run` line writes to results/<platform>."""
    out = [
        f"host:      {host_command(cell_id)}",
        f"container: {session_command(platform, cell_id)}",
    ]
    docker = docker_command(platform, cell_id, image)
    if docker:
        out.append(f"           {docker}")
    return out
