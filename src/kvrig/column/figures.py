"""Figures against their targets, as `kvrig bench` prints them, and how they are taken.

Shared machines are noisy, so these are figures to read, not assertions: a line says
whether its figure is within its target, and nothing fails on it.
"""

from __future__ import annotations

import subprocess
import threading
import time

from kvrig.run.platform_parent import serving
from kvrig.run.procs import pss_mb, tree_pids


class Sampler:
    """Peak memory of a process tree, sampled twice a second in the background."""

    def __init__(self, root: int) -> None:
        self.root, self.peak_mb = root, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak_mb = max(self.peak_mb, pss_mb(self.pids()))
            self._done.wait(0.5)

    def pids(self) -> list[int]:
        """The tree, and the platform parents its columns share (kvrig.run.platform_parent),
        which leave the tree when the column that started one ends."""
        pids = set(tree_pids(self.root))
        for parent in serving(self.root):
            pids.update(tree_pids(parent))
        return sorted(pids)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def run_sampled(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float, float]:
    """Runs cmd in the checkout (the working folder, as nox runs it); returns (exit
    status, seconds, peak MB over the process tree)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env)
    with Sampler(proc.pid) as sampler:
        code = proc.wait()
    return code, time.monotonic() - started, sampler.peak_mb


def line(name: str, value: float, target: float, unit: str) -> str:
    verdict = "within target" if value <= target else "OVER TARGET"
    return f"{name:<28} {value:8.1f} {unit:<3} (target <= {target:.0f} {unit})  {verdict}"


def ratio_line(name: str, value: float, target: float, at_most: bool) -> str:
    ok = value <= target if at_most else value >= target
    sign = "<=" if at_most else ">="
    verdict = "within target" if ok else "OFF TARGET"
    return f"{name:<28} {value:8.2f} x   (target {sign} {target:g} x)  {verdict}"
