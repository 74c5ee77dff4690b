"""The emulated columns' and the release diff's figures, each against its target and floor.

A floor is what no scheduling can beat on this host: one import of vLLM per platform (and
release) plus the cells' own times, over the cells run side by side; the ratio to it is
what the rig spends beyond that.

    kvrig bench --skip-setup --setup-only --emulated .nox/emulated/bin/python
    kvrig bench --skip-setup --setup-only --emulated .nox/release/bin/python --release-diff
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvrig.column.figures import line, ratio_line, run_sampled
from kvrig.define import gpus

TARGETS = {
    "emulated_s": 240.0,  # every emulated device (six CUDA architectures, XPU, three ROCm)
    "release_diff_s": 480.0,  # kvrig release diff OLD NEW: both releases, every device
    "emulated_ratio": 1.5,  # columns' own start, collection and report are not in the floor
    "peak_gb": 4.0,
}
SIDE_BY_SIDE = 2  # cells run at once: two columns, a worker each (kvrig.cli.in_turn)


@dataclass(frozen=True)
class Floor:
    """One import per platform (and release), plus every cell's own time, side by side."""

    imports: dict[str, float]
    cells: int
    cells_s: float
    releases: int = 1

    @property
    def seconds(self) -> float:
        return (self.releases * sum(self.imports.values()) + self.cells_s) / SIDE_BY_SIDE

    def lines(self, wall_s: float) -> list[str]:
        each = ", ".join(f"{p} {s:.1f} s" for p, s in self.imports.items())
        times = f"{self.releases} x " if self.releases > 1 else ""
        return [
            f"{'  floor':<28} {self.seconds:8.1f} s   (imports {times}[{each}] + cells"
            f" {self.cells_s:.1f} s, {self.cells} cells, over {SIDE_BY_SIDE} side by side)",
            ratio_line("  rig / floor", wall_s / self.seconds, TARGETS["emulated_ratio"], True),
        ]


def cells_seconds(folders: Iterable[Path]) -> tuple[int, float]:
    """Cells with a record in the folders, and the sum of their own times."""
    n, total = 0, 0.0
    for folder in folders:
        for path in (folder / "records").glob("*.json"):
            timings = json.loads(path.read_text()).get("timings") or {}
            if "cell_s" in timings:
                n += 1
                total += float(timings["cell_s"])
    return n, total


def import_seconds(py: str, platform: str) -> float:
    """One import of what an emulated platform's cells need (`kvrig bench --import-seconds
    PLATFORM` in the environment under test: its first device's environment)."""
    out = subprocess.run(
        [py, "-m", "kvrig", "bench", "--import-seconds", platform],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def measure_import(platform: str) -> float:
    """Body of --import-seconds: a fresh interpreter imports the platform's emulated preload
    under its cells' environment, as their warm parent does."""
    from kvrig.define.cells import expand
    from kvrig.define.loader import default_matrix
    from kvrig.define.matrix import load
    from kvrig.provision import libcuda_stub
    from kvrig.run.cell import STUB_ENV, STUB_SYMBOLS_ENV, cell_env
    from kvrig.run.forkserver import server_env

    folder, symbols = libcuda_stub.ensure()
    os.environ.update({STUB_ENV: str(folder), STUB_SYMBOLS_ENV: str(symbols)})
    arch = next(a for p, a in gpus.EMULATED if p == platform)
    cell = expand(load(default_matrix()), platform, gpu_arch=arch, device_emulated=True)[0]
    with tempfile.TemporaryDirectory() as tmp:
        env = server_env(cell_env(cell, Path(tmp)))
    code = (
        "import time, sys; t = time.monotonic(); from kvrig.run import forkserver as f;"
        " f.import_preload(f.preload_for(sys.argv[1], emulated=True));"
        " print(time.monotonic() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, platform], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def platforms() -> list[str]:
    return list(dict.fromkeys(p for p, _ in gpus.EMULATED))


def emulated_figures(py: str) -> list[str]:
    """Every emulated column, as nox -s emulated runs them: the wall time, the floor, the
    cells and the peak memory."""
    imports = {p: import_seconds(py, p) for p in platforms()}
    code, secs, peak = run_sampled([py, "-m", "kvrig", "emulated", "--rerun", "--", "-q"])
    n, cells_s = cells_seconds(Path("results").glob("*-emulated"))
    head = "emulated GPU columns" + (f" (exited {code})" if code else "")
    return [
        head,
        line("  all devices", secs, TARGETS["emulated_s"], "s"),
        *Floor(imports, n, cells_s).lines(secs),
        f"{'  cells':<28} {n:8d}     ({len(gpus.EMULATED)} devices: CUDA, XPU, ROCm)",
        line("  peak memory", peak / 1024, TARGETS["peak_gb"], "GB"),
    ]


def release_diff_figures(py: str, releases: list[str]) -> list[str]:
    """The whole release diff as `nox -s release_diff` runs it on a warm cache, its
    environments made before the timing starts so only the diff is timed."""
    imports = {p: import_seconds(py, p) for p in platforms()}
    base = [py, "-m", "kvrig", "release", "diff", *releases]
    # Warm: each release's environment made and its wheels in uv's cache, nothing timed.
    subprocess.run([*base, "--only", "cuda:9.0"], check=False, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="kvrig-bench-diff-") as tmp:
        code, secs, peak = run_sampled([*base, "--rerun", "--results", tmp])
        n, cells_s = cells_seconds(Path(tmp).glob("*/*-emulated"))
    head = "release diff " + " ".join(releases or ["(previous read release -> pin)"])
    return [
        head + (f" (exited {code}: moves unexplained or a side missing)" if code else ""),
        line("  every device, both sides", secs, TARGETS["release_diff_s"], "s"),
        *Floor(imports, n, cells_s, releases=2).lines(secs),
        line("  peak memory", peak / 1024, TARGETS["peak_gb"], "GB"),
    ]


def figures(emulated: str | None, release_diff: list[str] | None) -> list[str]:
    """The release diff's figures when asked for, else the emulated columns' when asked
    for: one or the other, as each run rewrites the same results folders."""
    if release_diff is not None:
        return release_diff_figures(emulated or sys.executable, release_diff)
    return emulated_figures(emulated) if emulated else []
