"""Prints kvrig's speed and memory figures against their targets (no pass/fail asserts).

Measures, on this host: the cold set-up (a new environment with the CPU vLLM and kvrig),
the CPU column's wall time after install, and the peak memory of the whole run (every
process under the column, sampled). Shared CI machines are noisy, so these are figures to
read, not assertions; the exit status is 0 unless the run itself could not be made.

    nox -s bench                 # set-up + column, uv's download cache kept
    nox -s bench -- --no-cache   # a truly cold set-up (downloads everything)
    nox -s bench -- --no-cache --setup-only
    nox -s bench -- --skip-setup --python .nox/tests/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvrig.runner import session_rss_mb

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"setup_s": 180.0, "column_s": 300.0, "peak_gb": 8.0}


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def run_sampled(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float, float]:
    """Runs cmd; returns (exit status, seconds, peak MB over the process tree)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, session_rss_mb(descendants(proc.pid)))
            time.sleep(0.5)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    code = proc.wait()
    done.set()
    t.join()
    return code, time.monotonic() - started, peak


def setup(venv: Path, no_cache: bool) -> tuple[int, float]:
    uv = shutil.which("uv")
    if uv is None:
        sys.exit("benchmark: uv is needed (pip install 'nox[uv]')")
    started = time.monotonic()
    cache = ["--no-cache"] if no_cache else []
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            *cache,
            "--python",
            py,
            "-e",
            str(ROOT),
            "pytest>=8",
            "pytest-xdist>=3.5",
        ],
        check=True,
    )
    plan = subprocess.run(
        [py, "-m", "kvrig.install", "cpu"], check=True, capture_output=True, text=True, cwd=ROOT
    )
    spec = json.loads(plan.stdout.strip().splitlines()[-1])
    code = subprocess.run(
        [uv, "pip", "install", "-q", *cache, "--python", py, *spec["args"]],
        env={**os.environ, **spec["env"]},
    ).returncode
    return code, time.monotonic() - started


def line(name: str, value: float, target: float, unit: str) -> str:
    verdict = "within target" if value <= target else "OVER TARGET"
    return f"{name:<28} {value:8.1f} {unit:<3} (target <= {target:.0f} {unit})  {verdict}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cache", action="store_true", help="cold set-up without uv's cache")
    ap.add_argument("--skip-setup", action="store_true", help="reuse --python's environment")
    ap.add_argument("--python", help="interpreter with vLLM and kvrig (with --skip-setup)")
    ap.add_argument("--setup-only", action="store_true", help="time the set-up, run no cell")
    ap.add_argument("pytest_args", nargs="*", help="passed to the column, e.g. -n 2")
    ns = ap.parse_args()
    figures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvrig-bench-") as tmp:
        if ns.skip_setup:
            py = ns.python or sys.executable
        else:
            venv = Path(tmp) / "venv"
            code, secs = setup(venv, ns.no_cache)
            if code:
                print(f"benchmark: set-up failed (exit {code})", file=sys.stderr)
                return 1
            py = str(venv / "bin" / "python")
            figures.append(line("cold set-up", secs, TARGETS["setup_s"], "s"))
        if ns.setup_only:
            print("\n".join(figures))
            return 0
        results = Path(tmp) / "results"
        code, secs, peak = run_sampled(
            [
                py,
                "-m",
                "kvrig",
                "column",
                "--platform",
                "cpu",
                "--results",
                str(results),
                "-q",
                *ns.pytest_args,
            ]
        )
        figures.append(line("CPU column (after install)", secs, TARGETS["column_s"], "s"))
        figures.append(line("peak memory of the run", peak / 1024, TARGETS["peak_gb"], "GB"))
        records = [json.loads(p.read_text()) for p in (results / "records").glob("*.json")]
        if records:
            slow = max(records, key=lambda r: r.get("timings", {}).get("wall_s", 0))
            biggest = max(records, key=lambda r: r.get("peak_rss_mb") or 0)
            figures.append(f"{'cells':<28} {len(records):8d}")
            figures.append(
                f"{'slowest cell':<28} {slow['timings'].get('wall_s', 0):8.1f} s   "
                f"({slow['cell_id']})"
            )
            figures.append(
                f"{'largest cell':<28} {(biggest.get('peak_rss_mb') or 0) / 1024:8.2f}"
                f" GB  ({biggest['cell_id']})"
            )
    print("\nkvrig benchmark (" + os.uname().nodename + f", {os.cpu_count()} cores)")
    print("\n".join(figures))
    if code not in (0, 1):
        print(f"note: the column exited {code}; figures cover what ran", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
