"""The commands that rerun one cell alone: on the host, and in its platform's container.

A failing cell is only actionable when whoever reads the report can rerun exactly it.
They are built from the cell's id, column and image alone, so they work where no
checkout is read.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvrig.containers import facts, plan
from kvrig.define import column_names
from kvrig.define.paths import results_folder
from kvrig.provision.overlay import Manifest


def selector(cell_id: str) -> list[str]:
    """Exactly this cell (pytest's -k would also pick the ids it is a part of)."""
    return ["--kvrig-cell", cell_id]


def _column_args(column: str) -> list[str]:
    """What names the column again: its CPU class, or its CUDA GPU's architecture (which
    the rerun's GPU must be)."""
    named = column_names.parse(column)
    if named is None or named.device_emulated:
        return []
    if named.isa:
        return ["--kvrig-isa", named.isa]
    return ["--gpu-arch", named.gpu_arch] if named.gpu_arch else []


def _overlay_args(overlay: Mapping[str, Any] | None) -> list[str]:
    """The arguments that rebuild the overlay the cell ran under (none for a release)."""
    return Manifest.of_summary(overlay).cli_args() if overlay else []


def host_command(cell_id: str, column: str, overlay: Mapping[str, Any] | None = None) -> str:
    args = [*_column_args(column), *_overlay_args(overlay), *selector(cell_id)]
    return shlex.join(["nox", "-s", "local", "--", *args])


def session_command(cell_id: str, column: str, overlay: Mapping[str, Any] | None = None) -> str:
    """Builds the image when needed, then runs the cell in it."""
    platform = column.split("-", 1)[0]
    args = [*_column_args(column), *_overlay_args(overlay), *selector(cell_id)]
    return shlex.join(["nox", "-s", platform, "--", *args])


def docker_command(cell_id: str, column: str, image: str | None = None) -> str:
    platform = column.split("-", 1)[0]
    tag = image or f"{plan.IMAGE_REPO.format(platform=platform)}:latest"
    argv = plan.run_command(
        "docker",
        platform,
        tag,
        "kvrig-repro",
        Path(results_folder(column)).resolve(),
        facts.host_facts("docker"),
        [*_column_args(column), *selector(cell_id)],
    )
    return shlex.join(argv)


def lines(
    cell_id: str,
    column: str | None = None,
    image: str | None = None,
    overlay: Mapping[str, Any] | None = None,
) -> list[str]:
    """Host and container commands; the `docker run` line writes to results/<column>.

    A cell that ran under an overlay is rerun under the same one: its image holds it."""
    column = column or cell_id.split("-", 1)[0]
    named = column_names.parse(column)
    if named is not None and named.device_emulated:
        # An emulated device runs on this host, in the emulated columns' environment.
        only = f"{named.platform}:{named.gpu_arch}"
        return [
            "host:      "
            + shlex.join(["nox", "-s", "emulated", "--", "--only", only, *selector(cell_id)])
        ]
    return [
        f"host:      {host_command(cell_id, column, overlay)}",
        f"container: {session_command(cell_id, column, overlay)}",
        f"           {docker_command(cell_id, column, image)}",
    ]
