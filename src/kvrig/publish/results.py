"""A platform's results folder: one JSON line per judged cell, appended as each ends.

The file is append-only so a crash loses nothing already judged and concurrent pytest
workers can share it; readers take the last line per cell, so a rerun supersedes.

Each row carries what is needed to trust it away from the machine that wrote it (the
host's fingerprint, vLLM's version and commit, the rig's version, start and end times),
because report and gate merge folders from several machines: cell ids start with the
platform, so columns never clash, and a cell found in two folders keeps its newest row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kvrig.define.cells import Cell, judged_under
from kvrig.judge.verdict import Verdict
from kvrig.provision.overlay import Manifest
from kvrig.run.record import Record

RESULTS_FILE = "results.jsonl"
PREVIOUS_FILE = "previous-" + RESULTS_FILE


def rig_version() -> str:
    try:
        return metadata.version("kvrig")
    except metadata.PackageNotFoundError:
        return "0"


def block_text(row: dict[str, Any]) -> str:
    """The chosen block size as people read it: the worker's, and the core's if it differs."""
    w, e = row.get("worker_block_size"), row.get("engine_block_size")
    if w is None:
        return "-"
    return str(w) if e in (None, w) else f"{w} (core {e})"


def host_id(host: dict[str, Any]) -> str:
    """A short stable name for a hardware fingerprint, to tell machines apart at a glance."""
    stable = {k: v for k, v in host.items() if k != "hostname"}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]


def _times(wall_s: float | None, ended: dt.datetime) -> dict[str, str | None]:
    started = ended - dt.timedelta(seconds=wall_s) if wall_s is not None else None
    iso = "%Y-%m-%dT%H:%M:%SZ"
    return {
        "started_at": started.strftime(iso) if started else None,
        "ended_at": ended.strftime(iso),
    }


def row(
    cell: Cell, rec: Record, verdict: Verdict, ended: dt.datetime | None = None
) -> dict[str, Any]:
    """The result line of a judged cell; `ended` defaults to now (the row is written then)."""
    ended = ended or dt.datetime.now(dt.timezone.utc)
    return {
        **cell.identity(),
        # What the matrix said of the cell when it was judged (kvrig.define.cells).
        "judged_under": judged_under(cell),
        "host_isa": rec.host.get("isa_class"),
        "gate": cell.case.gate,
        "expected": cell.expect.outcome,
        "status": verdict.status.value,
        "reason": verdict.reason,
        "outcome": rec.outcome,
        "worker_block_size": rec.worker_block_size,
        "expected_block_size": verdict.expected_block_size,
        "engine_block_size": rec.engine_block_size,
        "kernel_block_sizes": rec.kernel_block_sizes,
        "error": rec.error.one_line() if rec.error else None,
        "wall_s": rec.timings.get("wall_s"),
        "peak_rss_mb": rec.peak_rss_mb,
        "vllm_version": rec.vllm_version,
        "vllm_commit": rec.vllm_commit,
        "vllm_overlay": rec.vllm_overlay,
        "rig_version": rig_version(),
        "host": rec.host,
        "host_id": host_id(rec.host),
        "image": os.environ.get("KVRIG_IMAGE") or None,
        **_times(rec.timings.get("wall_s"), ended),
        "log": rec.log,
    }


def append(results: Path, entry: dict[str, Any]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(results / RESULTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read(results: Path) -> list[dict[str, Any]]:
    """The latest row per cell, in the order cells first appeared."""
    path = results / RESULTS_FILE
    return _read_file(path) if path.exists() else []


def read_file(path: Path) -> list[dict[str, Any]]:
    """The latest row per cell of one results file (see `read`)."""
    return _read_file(path)


def _read_file(path: Path) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if isinstance(entry, dict) and "cell_id" in entry:
            latest[entry["cell_id"]] = entry
    return list(latest.values())


def files(paths: list[Path], name: str = RESULTS_FILE) -> list[Path]:
    """The results files under `paths`: a folder's own file, else every one beneath it."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif (path / name).is_file():
            found.append(path / name)
        elif path.is_dir():
            found.extend(sorted(path.rglob(name)))
    return found


@dataclass
class Merged:
    """Rows of several results files, one per cell, and the cells that came more than once."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, Path] = field(default_factory=dict)
    clashes: list[str] = field(default_factory=list)


def merge(sources: list[tuple[Path, list[dict[str, Any]]]]) -> Merged:
    """One row per cell; where two files hold a cell the later-ended row wins, said aloud."""
    out = Merged()
    by_id: dict[str, dict[str, Any]] = {}
    for path, rows in sources:
        for r in rows:
            cid = r["cell_id"]
            old = by_id.get(cid)
            if old is not None:
                keep_new = (r.get("ended_at") or "") >= (old.get("ended_at") or "")
                kept, dropped = (path, out.sources[cid]) if keep_new else (out.sources[cid], path)
                out.clashes.append(f"{cid} is in both {dropped} and {kept}; kept {kept} (newer)")
                if not keep_new:
                    continue
            by_id[cid] = r
            out.sources[cid] = path
    out.rows = list(by_id.values())
    return out


def collect(paths: list[Path], name: str = RESULTS_FILE) -> Merged:
    """The merged rows of every results file found under `paths` (see `files`)."""
    return merge([(f, _read_file(f)) for f in files(paths, name)])


def overlays_of(rows: list[dict[str, Any]]) -> list[str]:
    """The overlays the rows ran under, described: the Python under test is not the
    release's, and a report that said only "vLLM 0.32.0" would hide it."""
    seen: dict[str, str] = {}
    for r in rows:
        o = r.get("vllm_overlay")
        if o:
            m = Manifest.of_summary(o)
            more = f" and {len(m.files) - 8} more" if len(m.files) > 8 else ""
            files = ", ".join(m.files[:8]) + more
            seen[m.digest] = f"{m.describe()} ({files or 'none'}; overlay {m.digest})"
    return sorted(seen.values())
