"""Checks a column run inside a container against the matrix and the host's own run.

    kvrig check container [pytest args]     # the CPU column in its container, then this
    kvrig check container --emulate 9.0     # the emulated CUDA column in the CUDA image

A container run can fail quietly in ways a host run cannot: results that never reach the
host's folder, a column that stopped early, an image that is not the one the records name.
So every cell must have a passing row naming its image and digest, and judge as the host's
own run did.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvrig.containers import launch
from kvrig.define.cells import Cell, expand, skipped_for_needs
from kvrig.define.gpus import emulated_column
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import Matrix
from kvrig.define.matrix import load as load_matrix
from kvrig.define.paths import CONTAINER, results_folder
from kvrig.judge.verdict import PASSING, Status
from kvrig.publish import results as results_mod

# What must agree between a host row and a container row of the same cell.
SAME_AS_HOST = ("status", "outcome", "worker_block_size", "engine_block_size", "kernel_block_sizes")


def check(
    cells: Sequence[Cell],
    rows: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    host_rows: Sequence[Mapping[str, Any]] = (),
    image_repo: str = "",
) -> list[str]:
    """The problems, one line each; none means the container run is as good as the host's."""
    problems: list[str] = []
    by_id = {r["cell_id"]: r for r in rows}
    host_by_id = {r["cell_id"]: r for r in host_rows}
    if not rows:
        return ["no results came back from the container (results.jsonl is missing or empty)"]
    for cell in cells:
        row = by_id.get(cell.id)
        if row is None:
            problems.append(f"{cell.id}: no result came back from the container")
            continue
        # As the verdict counts it: a pass, a known defect showing as recorded (xfail), or
        # a skip the matrix asks for.
        # A model that needs what the image may lack (torchvision's CPU build) is skipped
        # there with that reason; the host's run, when there is one, must agree.
        unmet = bool(cell.model.needs) and skipped_for_needs(row.get("reason"))
        may_skip = cell.expect.outcome == "skip" or unmet
        allowed = (*PASSING, Status.SKIP) if may_skip else PASSING
        if row["status"] not in allowed:
            problems.append(f"{cell.id}: {row['status']} in the container: {row.get('reason')}")
        host = records.get(cell.id, {}).get("host", {})
        image, digest = host.get("image") or "", host.get("image_digest") or ""
        # The image's own name, whatever registry it was pulled from (REG/kvrig-cuda:...).
        if not image.rsplit("/", 1)[-1].startswith(image_repo) or not digest:
            problems.append(
                f"{cell.id}: its record does not name the image it ran in"
                f" (image={image!r}, image_digest={digest!r})"
            )
        other = host_by_id.get(cell.id)
        if other is not None:
            diffs = [k for k in SAME_AS_HOST if other.get(k) != row.get(k)]
            if diffs:
                problems.append(
                    f"{cell.id}: differs from the host's run in "
                    + ", ".join(f"{k} ({other.get(k)!r} on the host)" for k in diffs)
                )
    return problems


def read_records(folder: Path) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for path in sorted((folder / "records").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "cell_id" in data:
            records[data["cell_id"]] = data
    return records


def _compared(
    cells: Sequence[Cell], host_rows: Sequence[Mapping[str, Any]], host: Path | None
) -> str:
    """What the host's run covered, said even when it covered nothing: a comparison that
    could not be made must not read as one that passed."""
    if host is None:
        return "; not compared with a host run (none asked for)"
    on_host = {r["cell_id"] for r in host_rows} & {c.id for c in cells}
    if not on_host:
        return f"; NOT compared with a host run: {host} holds none of these cells' results"
    left = len(cells) - len(on_host)
    unrun = f" ({left} not run on the host, so not compared)" if left else ""
    return f", the same as the host's run in {host} for {len(on_host)} of them{unrun}"


def check_folder(
    results: Path,
    matrix: Matrix,
    host: Path | None = None,
    platform: str = "cpu",
    partial: bool = False,
    emulate: str | None = None,
) -> int:
    """Prints the problems of a container run's results folder; 1 when there are any.
    `partial`: only the cells that ran are held to it, as pytest arguments chose them."""
    if emulate:
        cells = expand(matrix, platform, gpu_arch=emulate, device_emulated=True)
    else:
        cells = expand(matrix, platform)
    host_rows = results_mod.read(host) if host and (host / "results.jsonl").is_file() else []
    rows = results_mod.read(results)
    if partial:
        ran = {r["cell_id"] for r in rows}
        cells = [c for c in cells if c.id in ran]
    problems = check(cells, rows, read_records(results), host_rows, f"kvrig-{platform}:")
    for line in problems:
        print(f"FAIL {line}")
    compared = _compared(cells, host_rows, host)
    if problems:
        print(
            f"kvrig container check: {len(problems)} problem(s) in {results} ({len(cells)}"
            " cells). The container's logs are under its logs/ folder.",
            file=sys.stderr,
        )
        return 1
    print(
        f"container results ok: {len(cells)} {platform} cells passed in the container,"
        f" records name the image and its digest{compared}"
    )
    return 0


Launch = Callable[[Sequence[str]], int]


def in_container(
    pytest_args: Sequence[str] = (),
    matrix: Path | None = None,
    run: Launch = launch.main,
    emulate: str | None = None,
) -> int:
    """A column in its container, then checked against the host's own run where there is
    one. `emulate` runs an emulated CUDA device's column in the CUDA image with no device,
    so the image's vLLM, torch and pins are proven without a GPU."""
    platform = "cuda" if emulate else "cpu"
    column = emulated_column(platform, emulate) if emulate else "cpu"
    folder = results_folder(f"{column}-container" if emulate else CONTAINER).resolve()
    # A fresh folder: rows of an earlier run must not stand in for cells that did not run.
    shutil.rmtree(folder, ignore_errors=True)
    given = ["--matrix", str(matrix)] if matrix else []
    # The CUDA image from the release's wheels, on a local Debian base where no registry
    # answers: the same vLLM, torch and pins the host's emulated run installs.
    device = ["--emulate", emulate, "--from-wheels"] if emulate else []
    code = run([platform, *given, *device, "--results", str(folder), *pytest_args])
    if code != 0:
        return code
    host = results_folder(column)
    return check_folder(
        folder,
        load_matrix(matrix or default_matrix()),
        host,
        platform,
        partial=bool(pytest_args),
        emulate=emulate,
    )
