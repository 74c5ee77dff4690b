"""Prints kvrig's speed and memory figures against their targets (no pass/fail asserts).

Memory is PSS summed over the run's processes, since forked cells share their parent's
pages and a sum of RSS would count them once per process. A column's floor is one
`import vllm` plus the engines' own time, divided by the cells run side by side: a serial
floor would flatter a 2-wide run.

    nox -s bench                 # kvrig bench: set-up + every class's column, uv's cache kept
    nox -s bench -- --no-cache   # a truly cold set-up (downloads everything)
    nox -s bench -- --no-cache --setup-only
    nox -s bench -- --skip-setup --python .nox/cpu_column/bin/python
    nox -s bench -- --skip-setup --isa native     # one class only
    nox -s bench -- --naive      # also the naive column (slow: about 25 minutes)
    nox -s bench -- --skip-setup --isa native --emulated .nox/emulated/bin/python
                                 # also every emulated GPU column, in nox -s emulated's env
    nox -s bench -- --skip-setup --setup-only --emulated .nox/release/bin/python --release-diff
                                 # the whole release diff (previous read release -> pin)

The emulated columns' figures, with their floors, are kvrig.column.bench_emulated's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvrig.column import bench_emulated
from kvrig.column.figures import line, ratio_line, run_sampled
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import load
from kvrig.host import hardware, isa
from kvrig.provision import install, uv, vllm_install

TARGETS = {
    "setup_s": 180.0,
    "column_s": 300.0,
    "peak_gb": 4.0,
    "ratio": 1.2,
    "speedup": 5.0,
}


def naive_cmd(py: str, results: Path, workers: int, select: list[str]) -> list[str]:
    """The naive column: a fresh interpreter per cell, vLLM's multiprocess engine."""
    return [py, "-m", "kvrig", "bench", "--naive-run", str(results), "--workers", str(workers),
            *select]  # fmt: skip


def naive_run(results: Path, workers: int, select: list[str]) -> int:
    """Body of the naive column, through the rig's own run-and-judge path so the two
    columns differ only in how cells are started."""
    from concurrent.futures import ThreadPoolExecutor

    from kvrig.column.one_cell import run_and_judge
    from kvrig.define.cells import expand

    own, _ = isa.resolve(isa.NATIVE, hardware.cpu_flags(), hardware.cpu_info()["arch"])
    cells = [
        c
        for c in expand(load(default_matrix()), "cpu", isa=own)
        if c.expect.outcome != "skip" and (not select or any(k in c.id for k in select))
    ]
    mp = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with ThreadPoolExecutor(max(1, workers)) as ex:
        list(ex.map(lambda c: run_and_judge(c, results, env_overrides=mp), cells))
    return 0


def import_seconds(py: str, env: dict[str, str]) -> float:
    """One warm parent's start under a class's environment: `import vllm` and the
    modules a cell needs."""
    code = (
        "import time; t = time.monotonic(); from kvrig.run import forkserver as f;"
        " f.import_preload(f.PRELOAD); print(time.monotonic() - t)"
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", **env}
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def class_env(py: str, cls: str) -> dict[str, str]:
    """The environment an emulated class's cells run under (none for the native one)."""
    if cls == "native":
        return {}
    code = (
        "import json, sys; from kvrig.host import isa; from kvrig.run.cell import ISA_BOOT;"
        " print(json.dumps({**isa.emulation_env(sys.argv[1]), 'PYTHONPATH': str(ISA_BOOT)}))"
    )
    out = subprocess.run([py, "-c", code, cls], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def classes() -> list[str]:
    """native, then each lesser class this host can emulate."""
    return [isa.NATIVE, *isa.lesser(hardware.cpu_flags(), hardware.cpu_info()["arch"])]


def engine_seconds(results: Path) -> tuple[int, float]:
    """Cells with a record, and the sum of their engines' own time (start + generate)."""
    n, total = 0, 0.0
    for path in (results / "records").glob("*.json"):
        t = json.loads(path.read_text()).get("timings", {})
        if "engine_start_s" in t:
            n += 1
            total += t["engine_start_s"] + t.get("generate_s", 0.0)
    return n, total


def workers_of() -> int:
    """The cells a CPU column runs side by side (matrix.yaml's parallel, at most the cores)."""
    return min(load(default_matrix()).platforms["cpu"].parallel, os.cpu_count() or 1)


def setup(venv: Path, no_cache: bool) -> tuple[int, float]:
    """A new environment with kvrig and the CPU vLLM, made as on a fresh machine (uv, the
    rig, then kvrig.provision.install's plan)."""
    uv_exe = uv.find()
    if uv_exe is None:
        sys.exit("benchmark: uv is needed (pip install 'nox[uv]')")
    started = time.monotonic()
    cache = ["--no-cache"] if no_cache else []
    subprocess.run([uv_exe, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    rig = ["-e", str(Path.cwd()), "pytest>=8", "pytest-xdist>=3.5"]
    subprocess.run([uv_exe, "pip", "install", "-q", *cache, "--python", py, *rig], check=True)
    plan = install.plan_for(load(default_matrix()), "cpu")
    command = vllm_install.command(uv_exe, py, plan)
    command[3:3] = ["-q", *cache]  # after `uv pip install`
    code = subprocess.run(command, env={**os.environ, **plan.env}, check=False).returncode
    return code, time.monotonic() - started


def column_figures(py: str, cls: str, tmp: Path, select: list[str], workers: int) -> list[str]:
    """One class's column: wall, floor per core, ratio, peak memory, slowest cell."""
    imp = import_seconds(py, class_env(py, cls))
    results = tmp / f"results-{cls}"
    picked = ["-k", " or ".join(select)] if select else []
    col = [py, "-m", "kvrig", "column", "--platform", "cpu", "--isa", cls]
    code, secs, peak = run_sampled([*col, "--results", str(results), "--", "-q", *picked])
    n, engine_s = engine_seconds(results)
    floor = (imp + engine_s) / workers
    out = [f"CPU class {cls}" + (f" (the column exited {code})" if code else "")]
    out.append(line("  rig column", secs, TARGETS["column_s"], "s"))
    out.append(
        f"{'  floor per core':<28} {floor:8.1f} s   (import {imp:.1f} s + engines"
        f" {engine_s:.1f} s, {n} cells, over {workers} side by side)"
    )
    out.append(ratio_line("  rig / floor per core", secs / floor, TARGETS["ratio"], True))
    out.append(line("  peak memory", peak / 1024, TARGETS["peak_gb"], "GB"))
    records = [json.loads(p.read_text()) for p in (results / "records").glob("*.json")]
    if records:
        slow = max(records, key=lambda r: r.get("timings", {}).get("wall_s", 0))
        out.append(
            f"{'  slowest cell':<28} {slow['timings'].get('wall_s', 0):8.1f} s   "
            f"({slow['cell_id']})"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvrig bench", description=__doc__.splitlines()[0])
    ap.add_argument("--no-cache", action="store_true", help="cold set-up without uv's cache")
    ap.add_argument("--skip-setup", action="store_true", help="reuse --python's environment")
    ap.add_argument("--python", help="interpreter with vLLM and kvrig (with --skip-setup)")
    ap.add_argument("--setup-only", action="store_true", help="time the set-up, run no cell")
    ap.add_argument("--isa", action="append", help="only these classes (default: all here)")
    ap.add_argument("--naive", action="store_true", help="also run the naive column")
    ap.add_argument("--workers", type=int, default=2, help="cells side by side, naive run")
    ap.add_argument("--naive-run", help=argparse.SUPPRESS)
    ap.add_argument("--import-seconds", help=argparse.SUPPRESS)
    ap.add_argument(
        "--emulated", metavar="PYTHON", help="also every emulated GPU column, with this Python"
    )
    ap.add_argument(
        "--release-diff",
        nargs="*",
        metavar="RELEASE",
        help="the whole kvrig release diff instead of the emulated columns (OLD NEW; default:"
        " previous read -> pin), with the Python of --emulated or this one",
    )
    ap.add_argument("select", nargs="*", help="only cells whose id contains one of these")
    ns = ap.parse_args(argv)
    if ns.naive_run:
        return naive_run(Path(ns.naive_run), ns.workers, ns.select)
    if ns.import_seconds:
        print(bench_emulated.measure_import(ns.import_seconds))
        return 0
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
        # The emulated figures when asked for, with or without the CPU column's.
        figures += bench_emulated.figures(ns.emulated, ns.release_diff)
        if ns.setup_only:
            print("\n".join(figures))
            return 0
        workers = workers_of()
        rig_native = None
        for cls in ns.isa or classes():
            started = time.monotonic()
            figures += column_figures(py, cls, Path(tmp), ns.select, workers)
            if cls == "native":
                rig_native = time.monotonic() - started
        if ns.naive:
            naive = Path(tmp) / "naive"
            _, naive_s, naive_peak = run_sampled(naive_cmd(py, naive, ns.workers, ns.select))
            figures.append(
                f"{'naive column':<28} {naive_s:8.1f} s   peak {naive_peak / 1024:.2f} GB"
            )
            if rig_native:
                figures.append(
                    ratio_line(
                        "speed-up over naive", naive_s / rig_native, TARGETS["speedup"], False
                    )
                )
    load1 = os.getloadavg()[0]
    print(
        f"\nkvrig benchmark ({os.uname().nodename}, {os.cpu_count()} cores, load {load1:.1f}:"
        " figures on a shared machine are noisy)"
    )
    print("\n".join(figures))
    return 0
