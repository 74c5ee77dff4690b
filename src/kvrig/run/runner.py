"""Runs each cell in a fresh process session and saves its record the moment it ends.

vLLM on CPU can die with SIGILL, hang in shutdown or leave its engine-core and worker
processes behind; a cell therefore gets its own session (so every process it spawned can
be found and killed), a wall-clock timeout and a memory ceiling over the whole session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvrig.define.cells import Cell
from kvrig.host import hardware
from kvrig.provision import overlay
from kvrig.run import cell as cellmod
from kvrig.run import interrupts
from kvrig.run.collect import assemble, parse_events
from kvrig.run.forkserver import ForkServer, Pool, ServerError
from kvrig.run.procs import kill_session, rss_mb, session_pids
from kvrig.run.record import Record

POLL_S = 0.25
EXIT_GRACE_S = 15.0  # after the front end wrote its summary, how long it may take to exit
EXIT_REPORT_S = 10.0  # after the kill, how long the exit status may take to arrive
MIN_FREE_MB = 256  # records and logs are small; vLLM writes its caches elsewhere
LOG_TAIL_BYTES = 200_000


@dataclass(frozen=True)
class Paths:
    """Where one cell's files go under a platform's results folder."""

    results: Path
    cell_id: str

    @property
    def workdir(self) -> Path:
        return self.results / "cells" / self.cell_id

    @property
    def log(self) -> Path:
        return self.results / "logs" / f"{self.cell_id}.log"

    @property
    def record(self) -> Path:
        return self.results / "records" / f"{self.cell_id}.json"


class _Cell(Protocol):
    pid: int

    def wait(self, timeout: float) -> int | None: ...


class _Fresh:
    """A cell started here as a fresh interpreter."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class _Forked:
    """A cell forked by a server, which reports its end."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid

    def wait(self, timeout: float) -> int | None:
        return self.server.poll(self.pid, timeout)


def _start(pool: Pool | None, workdir: Path, env: dict[str, str], log: Path, python: str) -> _Cell:
    if pool is None:
        with open(log, "wb") as fh:
            return _Fresh(
                subprocess.Popen(
                    [python, "-m", "kvrig.run.cell", str(workdir)],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
    try:
        server = pool.get(env)
        return _Forked(server, server.spawn(workdir, env, log))
    except ServerError:
        server = pool.get(env)  # a server that died between cells is replaced once
        return _Forked(server, server.spawn(workdir, env, log))


def run_cell(
    cell: Cell,
    results: Path,
    *,
    timeout_s: float | None = None,
    memory_limit_gb: float | None = None,
    python: str = sys.executable,
    pool: Pool | None = None,
    env_overrides: dict[str, str] | None = None,
    keep: Callable[[Record], None] | None = None,
) -> Record:
    """Runs one cell to its end and returns (and saves) its record; never raises for the
    cell's own failures, which are the record's to report.

    With a pool the cell's process is forked by a warm server (see kvrig.run.forkserver);
    without one it is a fresh `python -m kvrig.run.cell`, started here. env_overrides change
    the cell's environment (the benchmark's naive run forces vLLM's multiprocess engine).
    `keep` is called with the saved record while Ctrl-C is held (see kvrig.run.interrupts),
    so what the caller writes from it is never cut apart from the record.
    """
    paths = Paths(results, cell.id)
    if cell.expect.outcome == "skip":
        rec = Record(
            **cell.identity(),
            outcome="skipped",
            skip_reason=cell.expect.reason,
            host=hardware.fingerprint(),
            vllm_overlay=overlay.named(os.environ),
        )
        return _save(rec, paths.record, keep)
    timeout_s = timeout_s or cell.platform_spec.timeout_s
    limit_mb = (memory_limit_gb or cell.platform_spec.memory_limit_gb) * 1024
    workdir = paths.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in (cellmod.FRONTEND_FILE, cellmod.PROBE_FILE):
        (workdir / stale).unlink(missing_ok=True)
    (workdir / cellmod.CELL_FILE).write_text(cell.model_dump_json(indent=2))
    paths.log.parent.mkdir(parents=True, exist_ok=True)
    env = {**cellmod.cell_env(cell, workdir), **(env_overrides or {})}

    proc = _start(pool, workdir, env, paths.log, python)  # may first start a warm server
    started = time.monotonic()
    ended_by: str | None = None
    peak_mb = 0.0
    frontend_done_at: float | None = None
    sid = proc.pid
    code: int | None = None
    try:
        while (code := proc.wait(POLL_S)) is None:
            now = time.monotonic()
            peak_mb = max(peak_mb, rss_mb(session_pids(sid)))
            if peak_mb > limit_mb:
                ended_by = "memory"
                break
            if now - started > timeout_s:
                ended_by = "timeout"
                break
            if (workdir / cellmod.FRONTEND_FILE).exists():
                frontend_done_at = frontend_done_at or now
                if now - frontend_done_at > EXIT_GRACE_S:
                    break
    finally:
        # Also on KeyboardInterrupt: no engine process outlives its cell.
        kill_session(sid)
        if code is None:
            code = proc.wait(EXIT_REPORT_S)
    elapsed = time.monotonic() - started

    frontend = None
    fe = workdir / cellmod.FRONTEND_FILE
    if fe.exists():
        frontend = json.loads(fe.read_text())
    probe = workdir / cellmod.PROBE_FILE
    events = parse_events(probe.read_text()) if probe.exists() else []
    log_text = _tail(paths.log)
    sig = signal.Signals(-code).name if code is not None and code < 0 else None
    if frontend is not None and sig == "SIGKILL" and ended_by is None:
        sig = None  # killed by us after it finished: not a crash
    rec = assemble(
        cell,
        frontend=frontend,
        events=events,
        exit_code=code,
        signal_name=sig,
        ended_by=ended_by,
        log_text=log_text,
    )
    rec.timings["wall_s"] = round(elapsed, 3)
    rec.peak_rss_mb = round(peak_mb, 1)
    rec.host = hardware.fingerprint()
    rec.vllm_overlay = overlay.named(env)
    rec.log = str(paths.log)
    if ended_by == "timeout":
        rec.note = f"killed after {timeout_s:.0f} s"
    elif ended_by == "memory":
        rec.note = f"killed at {peak_mb:.0f} MB (limit {limit_mb:.0f} MB)"
    elif rec.outcome == "crashed":
        rec.note = f"process ended with {sig or f'exit code {code}'} before writing its summary"
    return _save(rec, paths.record, keep)


def _save(rec: Record, path: Path, keep: Callable[[Record], None] | None) -> Record:
    with interrupts.held():
        rec.save(path)
        if keep is not None:
            keep(rec)
    return rec


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


class ResultsFolderError(Exception):
    """The results folder cannot take a column's records; the message says what to do."""


def check_results_folder(results: Path, min_free_mb: float = MIN_FREE_MB) -> None:
    """Fails before any cell runs if records could not be written, rather than losing
    the first record after minutes of engines."""
    advice = (
        " Free some space or choose another folder with --results (kvrig column --results"
        " DIR), then run the column again."
    )
    try:
        for sub in ("", "records", "logs", "cells"):
            (results / sub).mkdir(parents=True, exist_ok=True)
        probe = results / ".kvrig-write-check"
        with open(probe, "wb") as fh:
            fh.write(b"x" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as exc:
        raise ResultsFolderError(
            f"The results folder {results} cannot be written ({exc.strerror or exc}), so no"
            " cell's record could be kept." + advice
        ) from None
    free_mb = shutil.disk_usage(results).free / 2**20
    if free_mb < min_free_mb:
        raise ResultsFolderError(
            f"The results folder {results} has {free_mb:.0f} MB free, less than the"
            f" {min_free_mb:.0f} MB a column's records and logs need." + advice
        )
