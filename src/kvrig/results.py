"""A platform's results folder: one JSON line per judged cell, appended as each ends.

The file is append-only so a crash loses nothing already judged and concurrent pytest
workers can share it; readers take the last line per cell, so a rerun supersedes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvrig.matrix import Cell
from kvrig.record import Record
from kvrig.verdict import Verdict

RESULTS_FILE = "results.jsonl"


def row(cell: Cell, rec: Record, verdict: Verdict) -> dict[str, Any]:
    return {
        "cell_id": cell.id,
        "platform": cell.platform,
        "model": cell.model_name,
        "case": cell.case.id,
        "family": cell.model.family,
        "gate": cell.case.gate,
        "expected": cell.expect.outcome,
        "status": verdict.status,
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
    if not path.exists():
        return []
    latest: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        latest[entry["cell_id"]] = entry
    return list(latest.values())
