"""A platform's results folder: one JSON line per judged cell, appended as each ends.

Append-only, so a crash loses nothing already judged and concurrent pytest workers can
share it; readers take the newest row per cell by its end time, so lines joined out of
order cannot put an older verdict over a newer one. Each row carries what is needed to
trust it away from the machine that wrote it, as report and gate merge several machines'.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kvrig.define.cells import Cell, judged_under
from kvrig.define.platform_spec import EXACT_PIN, package_key
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


# What a verdict is made by, besides the matrix (judged_under) and vLLM: the code that
# expands cells (define), computes the size (rules), judges (judge), and turns what the
# processes left into the facts judged (the record, its assembly, the probe).
JUDGING_CODE = ("define", "rules", "judge", "run/record.py", "run/collect.py", "run/vllm_plugin")


def code_digest(root: Path, parts: Iterable[str] = JUDGING_CODE) -> str:
    """A sha256 of the Python files of `parts` under `root`, by relative path and content:
    the same source installed anywhere gives the same digest, any change another."""
    h = hashlib.sha256()
    for part in parts:
        base = root / part
        found = [base] if base.is_file() else sorted(base.rglob("*.py")) if base.is_dir() else []
        for path in found:
            if "__pycache__" in path.parts:
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def judged_by() -> str:
    """This kvrig's digest of its judging code, as results rows carry it: a verdict written
    by other rules or another judge is not this one's, and the gate refuses it."""
    return code_digest(Path(__file__).resolve().parents[1])


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
        # What judged it: kvrig's rules, judge and matrix code (`judged_by`).
        "judged_by": judged_by(),
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
        "vllm_overrides": rec.vllm_overrides,
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
    """The newest row per cell (`newer`), in the order cells first appeared."""
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
        # A line without a cell id as text is no row of kvrig's (nothing could name it).
        if not isinstance(entry, dict) or not isinstance(entry.get("cell_id"), str):
            continue
        old = latest.get(entry["cell_id"])
        if old is None or newer(entry, old):
            latest[entry["cell_id"]] = entry
    return list(latest.values())


def ended(row: dict[str, Any]) -> dt.datetime | None:
    """When the row's cell ended, or None where it names no readable time."""
    text = row.get("ended_at")
    try:
        when = dt.datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when


def newer(row: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether `row`, read after `than`, supersedes it: it ended no earlier, or either
    names no time (then the later written wins)."""
    a, b = ended(row), ended(than)
    return a is None or b is None or a >= b


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
                keep_new = newer(r, old)
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


def overlay_of(row: dict[str, Any]) -> dict[str, Any] | None:
    """The overlay a row names, where it names one as kvrig writes it (a mapping): what
    rebuilds it for a repro line. Anything else there is said by `overlays_of`."""
    o = row.get("vllm_overlay")
    return o if isinstance(o, dict) and o else None


def listed(value: Any) -> list[str]:
    """A row's list of strings (its overrides), read as such however it was written."""
    return [str(x) for x in value] if isinstance(value, list) else [str(value)]


def pin_key(requirement: str) -> str:
    """An exact pin as indexes compare it (flashinfer_python==0.7.4 is
    flashinfer-python==0.7.4); any other requirement as written."""
    m = EXACT_PIN.match(requirement)
    return f"{package_key(m['name'])}=={m['version']}" if m else requirement.strip()


def undeclared(overrides: Iterable[str], declared: Collection[str]) -> list[str]:
    """The overrides that are none of the `declared` pins (a platform's pin_overrides)."""
    keys = {pin_key(d) for d in declared}
    return [o for o in overrides if pin_key(o) not in keys]


def overrides_text(rows: list[dict[str, Any]], declared: Collection[str] = ()) -> str:
    """What follows "vLLM 0.34.0" for rows whose environment overrode the release's
    requirements; "" when none did. A report that said only the version would pass the
    environment off as the release's."""
    ran = [r for r in rows if r.get("vllm_version")]
    marked = [r for r in ran if r.get("vllm_overrides")]
    if not marked:
        return ""
    named = sorted({x for r in marked for x in listed(r["vllm_overrides"])})
    some = f"in {len(marked)} of {len(ran)} cells; " if len(marked) < len(ran) else ""
    ours = "; matrix.yaml's pin_overrides declares them" if not undeclared(named, declared) else ""
    return f" with overrides {', '.join(named)} ({some}not the release's own environment{ours})"


def overrides_of(rows: list[dict[str, Any]], declared: Collection[str] = ()) -> list[str]:
    """The vLLM versions that ran with overrides, each with them: "vLLM 0.34.0 with
    overrides flashinfer-python==0.7.4 (not the release's own environment)"."""
    by_version: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("vllm_version"):
            by_version.setdefault(str(r["vllm_version"]), []).append(r)
    return [
        f"vLLM {version}{text}"
        for version, rs in sorted(by_version.items())
        if (text := overrides_text(rs, declared))
    ]


def overlays_of(rows: list[dict[str, Any]]) -> list[str]:
    """The overlays the rows ran under, described: the Python under test is not the
    release's, and a report that said only "vLLM 0.32.0" would hide it."""
    seen: dict[str, str] = {}
    for r in rows:
        o = r.get("vllm_overlay")
        if not o:
            continue
        try:
            m = Manifest.of_summary(o)
            more = f" and {len(m.files) - 8} more" if len(m.files) > 8 else ""
            files = ", ".join(m.files[:8]) + more
            seen[str(m.digest)] = f"{m.describe()} ({files or 'none'}; overlay {m.digest})"
        except (TypeError, ValueError, AttributeError):
            # Not as kvrig writes an overlay: said as found, never taken for the release.
            seen[repr(o)] = f"an overlay the row does not describe as kvrig does ({o!r})"
    return sorted(seen.values())
