"""Turns what a cell's processes left behind into its Record (pure: no I/O here).

Three sources, in order of trust: the probe's events from the process that chose the
block size, the front end's own summary, and the exit status the runner saw. The root
cause of an error is the probe's when there is one, because in the multiprocess engine
the front end only sees "Engine core initialization failed".
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvrig.define.cells import Cell
from kvrig.run.record import ErrorInfo, KVGroup, Outcome, Record

_EXC_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:\S+\s+)?([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$"
)
_FRAME_LINE = re.compile(r'^\s*File "[^"]+", line \d+, in (\w+)')
_WRAPPER_ERRORS = ("Engine core initialization failed", "WorkerProc initialization failed")


_ALIGNMENT = re.compile(
    r"((?:\[XPU\])?Setting attention block size to \d+ tokens .*"
    r"|Padding mamba page size by [\d.]+% .*)$"
)


def alignment_lines(log: str) -> list[str]:
    """vLLM's own lines about the alignment, without their logger prefixes, once each in
    the order first logged (every rank of an engine logs them)."""
    seen: dict[str, None] = {}
    for line in log.splitlines():
        m = _ALIGNMENT.search(line.strip())
        if m:
            seen.setdefault(m.group(1).strip(), None)
    return list(seen)


def parse_events(text: str) -> list[dict[str, Any]]:
    """Probe lines; a line cut short by a kill is dropped, not fatal."""
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def root_cause_from_log(log: str) -> ErrorInfo | None:
    """The first exception a child process printed, for errors the probe cannot see.

    A multiprocess engine that fails outside the probed functions (e.g. while loading the
    model) prints the real exception in the child and hands the caller a wrapper error.
    """
    lines = log.splitlines()
    function = None
    for line in lines:
        frame = _FRAME_LINE.match(line)
        if frame:
            function = frame.group(1)
            continue
        m = _EXC_LINE.match(line.strip())
        if m and not any(w in m.group(2) for w in _WRAPPER_ERRORS):
            return ErrorInfo(
                type=m.group(1).rsplit(".", 1)[-1],
                message=m.group(2),
                function=function,
                process="worker",
            )
    return None


def assemble(
    cell: Cell,
    *,
    frontend: dict[str, Any] | None,
    events: list[dict[str, Any]],
    exit_code: int | None,
    signal_name: str | None,
    ended_by: str | None,
    log_text: str = "",
) -> Record:
    """ended_by is "timeout" or "memory" when the runner killed the cell, else None."""
    front_pid = (frontend or {}).get("pid")
    rec: dict[str, Any] = {
        **cell.identity(),
        "multiprocessing": cell.multiprocessing,
        "exit_code": exit_code,
        "signal": signal_name,
    }
    root: ErrorInfo | None = None
    error_seen = False
    sized_before_error: bool | None = None
    sized = False
    groups: list[KVGroup] = []
    hooks: set[str] = set()
    by_pid: dict[str, list[str]] = {}
    for ev in events:
        kind = ev.get("event")
        if kind == "probe_installed":
            hooks.update(ev.get("hooks") or [])
            by_pid.setdefault(str(ev.get("pid")), []).extend(ev.get("hooks") or [])
        elif kind == "block_size_update":
            rec.setdefault("sizing_pid", ev.get("pid"))
            rec["block_size_before"] = ev.get("block_size_before")
            rec["user_specified_block_size"] = ev.get("user_specified_block_size")
            rec["layer_backends"] = ev.get("layer_backends") or {}
            rec["isa_view"] = ev.get("isa_view")
            if "block_size" in ev:
                rec["worker_block_size"] = ev["block_size"]
                rec["mamba_page_size_padded"] = ev.get("mamba_page_size_padded")
                rec["mamba_block_size"] = ev.get("mamba_block_size")
                rec["mamba_cache_mode"] = ev.get("mamba_cache_mode")
                rec["backends"] = ev.get("backends") or []
                rec["backends_accept"] = ev.get("accepts") or {}
                rec["backend_kernel_sizes"] = ev.get("backend_kernel_sizes") or {}
        elif kind == "kv_cache_sized":
            rec.setdefault("kv_sized_pid", ev.get("pid"))
            sized = True
            groups = [KVGroup.model_validate(g) for g in ev.get("groups", [])]
        elif kind == "kernel_block_sizes" and "kernel_block_sizes" in ev:
            rec["kernel_block_sizes"] = ev["kernel_block_sizes"]
            for group, size in zip(groups, ev["kernel_block_sizes"], strict=False):
                group.kernel_block_size = size
        if "error" in ev and not error_seen:
            error_seen = True
            process = "front end" if ev.get("pid") == front_pid else "worker"
            root = ErrorInfo.model_validate({**ev["error"], "process": process})
            sized_before_error = sized
    rec["kv_cache_groups"] = groups
    rec["probe_hooks"] = sorted(hooks)
    rec["probe_hooks_by_pid"] = by_pid
    rec["alignment_log"] = alignment_lines(log_text)
    rec["kv_cache_sized_seen"] = sized

    front = frontend or {}
    for key in (
        "engine_block_size",
        "tokens_generated",
        "timings",
        "vllm_version",
        "vllm_commit",
        "vllm_file",
        "torch_version",
        "emulation",
    ):
        if key in front:
            rec[key] = front[key]
    front_err = (
        ErrorInfo.model_validate(front["frontend_error"]) if front.get("frontend_error") else None
    )
    rec["frontend_error"] = front_err

    if front_err is not None and root is None:
        wrapped = any(w in front_err.message for w in _WRAPPER_ERRORS)
        root = (root_cause_from_log(log_text) if wrapped else None) or front_err
        # Not raised inside the probed functions: it came before the KV cache was sized
        # unless the probe saw the sizing happen.
        sized_before_error = sized
    rec["error"] = root
    rec["kv_cache_sized_before_error"] = sized_before_error if root else None

    outcome: Outcome
    if ended_by in ("timeout", "memory"):
        outcome = ended_by  # type: ignore[assignment]
    elif frontend is None:
        outcome = "crashed"
    elif root is not None:
        outcome = "error"
    elif front.get("configured"):
        outcome = "configured"
    else:
        outcome = "ran"
    rec["outcome"] = outcome
    return Record.model_validate(rec)
