"""Runs each cell in a fresh process session and turns what it left behind into its record.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvrig.define.cells import Cell
from kvrig.host import hardware
from kvrig.provision import overlay, stamp
from kvrig.run import cell as cellmod
from kvrig.run import holds as holds_mod
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
) -> Record:
    """Runs one cell and returns its record, saved, for a caller that writes nothing that
    must stay with the record; one that does (the results row) takes `run_unsaved` and
    saves both under one held Ctrl-C (see kvrig.column.one_cell)."""
    rec = run_unsaved(
        cell,
        results,
        timeout_s=timeout_s,
        memory_limit_gb=memory_limit_gb,
        python=python,
        pool=pool,
        env_overrides=env_overrides,
    )
    rec.save(Paths(results, cell.id).record)
    return rec


def run_unsaved(
    cell: Cell,
    results: Path,
    *,
    timeout_s: float | None = None,
    memory_limit_gb: float | None = None,
    python: str = sys.executable,
    pool: Pool | None = None,
    env_overrides: dict[str, str] | None = None,
) -> Record:
    """Runs one cell to its end and returns its record unsaved, so the caller decides what
    is written with it and under which held Ctrl-C; never raises for the cell's own
    failures, which are the record's to report.

    With a pool the cell's process is forked by a warm server (see kvrig.run.forkserver);
    without one it is a fresh `python -m kvrig.run.cell`, started here. env_overrides change
    the cell's environment (the benchmark's naive run forces vLLM's multiprocess engine).
    """
    if cell.expect.outcome == "skip":
        return _skipped(cell)
    paths = Paths(results, cell.id)
    limits = _Limits(
        timeout_s=timeout_s or cell.platform_spec.timeout_s,
        memory_mb=(memory_limit_gb or cell.platform_spec.memory_limit_gb) * 1024,
    )
    env = _prepare(cell, paths, env_overrides)
    proc = _start(pool, paths.workdir, env, paths.log, python)  # may first start a warm server
    ending = _watch(proc, paths.workdir, limits)
    return _record(cell, paths, env, ending, limits)


@dataclass(frozen=True)
class _Limits:
    """What a cell may take before the runner kills it."""

    timeout_s: float
    memory_mb: float


@dataclass(frozen=True)
class _Ending:
    """How a cell's process ended, as the runner watching it saw it."""

    code: int | None  # None when the exit status never arrived after the kill
    ended_by: str | None  # "timeout" or "memory" when the runner killed it for that
    peak_mb: float
    elapsed_s: float


def _skipped(cell: Cell) -> Record:
    """A skipped cell's record: no process is started for it, and it still names the host
    and the vLLM overlay, as a run's record does, so a skip is compared like a run."""
    return Record(
        **cell.identity(),
        outcome="skipped",
        skip_reason=cell.expect.reason,
        host=hardware.fingerprint(),
        vllm_overlay=overlay.named(os.environ),
        vllm_overrides=stamp.overrides_in_force(stamp.read()),
    )


def _prepare(cell: Cell, paths: Paths, env_overrides: dict[str, str] | None) -> dict[str, str]:
    """Writes the cell's definition into its workdir and returns its environment; removes
    the summary and probe files an earlier run of the cell left, which would otherwise be
    read as this run's."""
    workdir = paths.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in (cellmod.FRONTEND_FILE, cellmod.PROBE_FILE):
        (workdir / stale).unlink(missing_ok=True)
    (workdir / cellmod.CELL_FILE).write_text(cell.model_dump_json(indent=2))
    paths.log.parent.mkdir(parents=True, exist_ok=True)
    return {**cellmod.cell_env(cell, workdir), **(env_overrides or {})}


def _over_limit(peak_mb: float, elapsed_s: float, limits: _Limits) -> str | None:
    """Which limit a running cell has passed, or None while it is within both; a cell over
    both is reported for its memory, the limit that can take the host down with it."""
    if peak_mb > limits.memory_mb:
        return "memory"
    if elapsed_s > limits.timeout_s:
        return "timeout"
    return None


def _watch(proc: _Cell, workdir: Path, limits: _Limits) -> _Ending:
    """Waits for the cell to exit, to pass a limit, or to linger past EXIT_GRACE_S after
    writing its summary, then kills its whole session on every way out (a Ctrl-C too), so
    no engine process outlives its cell."""
    started = time.monotonic()
    ended_by: str | None = None
    peak_mb = 0.0
    frontend_done_at: float | None = None
    code: int | None = None
    try:
        while (code := proc.wait(POLL_S)) is None:
            now = time.monotonic()
            peak_mb = max(peak_mb, rss_mb(session_pids(proc.pid)))
            ended_by = _over_limit(peak_mb, now - started, limits)
            if ended_by is not None:
                break
            if (workdir / cellmod.FRONTEND_FILE).exists():
                frontend_done_at = frontend_done_at or now
                if now - frontend_done_at > EXIT_GRACE_S:
                    break
    finally:
        kill_session(proc.pid)
        if code is None:
            code = proc.wait(EXIT_REPORT_S)
    return _Ending(code, ended_by, peak_mb, time.monotonic() - started)


def _record(
    cell: Cell, paths: Paths, env: dict[str, str], ending: _Ending, limits: _Limits
) -> Record:
    """The cell's record from what its processes left in the workdir and log, with what
    only the runner knows (wall time, peak memory, host, why it was killed)."""
    frontend = _read_frontend(paths.workdir)
    sig = _signal_name(ending.code, finished=frontend is not None, ended_by=ending.ended_by)
    rec = assemble(
        cell,
        frontend=frontend,
        events=_read_events(paths.workdir),
        exit_code=ending.code,
        signal_name=sig,
        ended_by=ending.ended_by,
        log_text=_tail(paths.log),
    )
    rec.timings["wall_s"] = round(ending.elapsed_s, 3)
    rec.peak_rss_mb = round(ending.peak_mb, 1)
    rec.host = hardware.fingerprint()
    rec.vllm_overlay = overlay.named(env)
    # A cell that crashed before it read the environment's stamp still ran in it.
    rec.vllm_overrides = rec.vllm_overrides or stamp.overrides_in_force(stamp.read())
    rec.log = str(paths.log)
    note = _ending_note(ending, limits, rec.outcome, sig)
    if note is not None:
        rec.note = note
    return rec


def _read_frontend(workdir: Path) -> dict[str, Any] | None:
    fe = workdir / cellmod.FRONTEND_FILE
    return json.loads(fe.read_text()) if fe.exists() else None


def _read_events(workdir: Path) -> list[dict[str, Any]]:
    probe = workdir / cellmod.PROBE_FILE
    return parse_events(probe.read_text()) if probe.exists() else []


def _signal_name(code: int | None, *, finished: bool, ended_by: str | None) -> str | None:
    """The signal that ended the cell; None for the runner's cleanup kill of a cell that had
    already written its summary (`finished`) and passed no limit, which is not a crash."""
    sig = signal.Signals(-code).name if code is not None and code < 0 else None
    if finished and sig == "SIGKILL" and ended_by is None:
        return None
    return sig


def _ending_note(ending: _Ending, limits: _Limits, outcome: str, sig: str | None) -> str | None:
    """The record's note on how the process ended, when that is what the reader needs first
    (a kill by the runner, or a crash before the summary); None leaves the note as it is."""
    if ending.ended_by == "timeout":
        return f"killed after {limits.timeout_s:.0f} s"
    if ending.ended_by == "memory":
        return f"killed at {ending.peak_mb:.0f} MB (limit {limits.memory_mb:.0f} MB)"
    if outcome == "crashed":
        return f"process ended with {sig or f'exit code {ending.code}'} before writing its summary"
    return None


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


def check_results_folder(
    results: Path, min_free_mb: float = MIN_FREE_MB, holds: holds_mod.Holds | None = None
) -> None:
    """Fails before any cell runs if records could not be written, rather than losing
    the first record after minutes of engines; and, given what the run will hold, if the
    folder is another kind of run's (kvrig.run.holds), then records it there."""
    if holds is not None:
        try:
            holds_mod.check(results, holds)
        except holds_mod.HoldsError as exc:
            raise ResultsFolderError(str(exc)) from None
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
    if holds is not None:
        holds_mod.write(results, holds)
