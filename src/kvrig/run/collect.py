"""Turns what a cell's processes left behind into its Record (pure: no I/O here).

Three sources, in order of trust: the probe's events from the process that chose the
block size, the front end's own summary, and the exit status the runner saw. The root
cause of an error is the probe's when there is one, because in the multiprocess engine
the front end only sees "Engine core initialization failed". Each fact says where it was
read (`sources`, `error.source`): a worker's error read from the log is text, not the
worker's own probe, and the verdict weighs it so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kvrig.define.cells import Cell
from kvrig.run.record import ErrorInfo, KVGroup, Outcome, Record

_EXC_LINE = re.compile(
    r"^(?:\(\w+ pid=(?P<pid>\d+)\)\s*)?(?:\S+\s+)?([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$"
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
    Its source is the log ("log:<pid>" when the line names its process): text, not the
    worker's probe, so the verdict trusts it only where that worker reported its hooks.
    """
    lines = log.splitlines()
    function = None
    for line in lines:
        frame = _FRAME_LINE.match(line)
        if frame:
            function = frame.group(1)
            continue
        m = _EXC_LINE.match(line.strip())
        if m and not any(w in m.group(3) for w in _WRAPPER_ERRORS):
            return ErrorInfo(
                type=m.group(2).rsplit(".", 1)[-1],
                message=m.group(3),
                function=function,
                process="worker",
                source=f"log:{m['pid']}" if m["pid"] else "log",
            )
    return None


_FRONTEND_FIELDS = (
    "engine_block_size",
    "tokens_generated",
    "timings",
    "vllm_version",
    "vllm_commit",
    "vllm_file",
    "vllm_overrides",
    "torch_version",
    "emulation",
)


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
    front = frontend or {}
    probed = _Probed(front_pid=front.get("pid"))
    for ev in events:
        probed.read(ev)
    summary = f"summary:{front.get('pid')}" if front.get("pid") is not None else "summary"
    front_err = (
        ErrorInfo.model_validate({**front["frontend_error"], "source": summary})
        if front.get("frontend_error")
        else None
    )
    root, sized_before_error = _root_cause(probed, front_err, log_text)
    alignment = alignment_lines(log_text)
    by_stage = probed.fields.pop("stage_block_sizes_by_rank", {})
    if len(by_stage) > 1:
        probed.fields["stage_block_sizes"] = [by_stage.get(i) for i in range(max(by_stage) + 1)]
    rec: dict[str, Any] = {
        **cell.identity(),
        "multiprocessing": cell.multiprocessing,
        "exit_code": exit_code,
        "signal": signal_name,
        **probed.fields,
        "kv_cache_groups": probed.groups,
        "probe_hooks": sorted(probed.hooks),
        "probe_hooks_by_pid": probed.by_pid,
        "frontend_pid": front.get("pid"),
        "alignment_log": alignment,
        "kv_cache_sized_seen": probed.sized,
        **{key: front[key] for key in _FRONTEND_FIELDS if key in front},
        "frontend_error": front_err,
        "error": root,
        "kv_cache_sized_before_error": sized_before_error if root else None,
        "outcome": _outcome(ended_by, frontend, root),
    }
    rec["sources"] = _sources(rec, probed, summary if frontend else None, root, bool(alignment))
    return Record.model_validate(rec)


_SUMMARY_FACTS = ("engine_block_size", "tokens_generated", "vllm_version", "frontend_error")


def _sources(
    rec: dict[str, Any],
    probed: _Probed,
    summary: str | None,
    root: ErrorInfo | None,
    logged: bool,
) -> dict[str, str]:
    """Where each fact of the record was read: the probe of which process, the front end's
    summary, or the log. A fact read from the log or from another process than the one it
    is about is said so, and the verdict weighs it so."""
    out: dict[str, str] = {}
    if probed.fields.get("sizing_pid") is not None:
        out["worker_block_size"] = f"probe:{probed.fields['sizing_pid']}"
    if probed.fields.get("kv_sized_pid") is not None:
        out["kv_cache_groups"] = f"probe:{probed.fields['kv_sized_pid']}"
    if probed.kernel_pid is not None:
        out["kernel_block_sizes"] = f"probe:{probed.kernel_pid}"
    if logged:
        out["alignment_log"] = "log"
    if summary is not None:
        out.update({k: summary for k in _SUMMARY_FACTS if rec.get(k) is not None})
    if root is not None and root.source:
        out["error"] = root.source
    return out


@dataclass
class _Probed:
    """What the probe's events say, read in the order they were logged: the first error
    is the root cause, and whether the KV cache had been sized by then tells an error at
    configuration from one after it."""

    front_pid: Any
    fields: dict[str, Any] = field(default_factory=dict)
    groups: list[KVGroup] = field(default_factory=list)
    hooks: set[str] = field(default_factory=set)
    by_pid: dict[str, list[str]] = field(default_factory=dict)
    sized: bool = False
    error: ErrorInfo | None = None
    sized_before_error: bool | None = None
    kernel_pid: Any = None

    def read(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "probe_installed":
            self._installed(ev)
        elif kind == "block_size_update":
            self._block_size_update(ev)
        elif kind == "kv_cache_sized":
            self._kv_cache_sized(ev)
        elif kind == "kernel_block_sizes" and "kernel_block_sizes" in ev:
            self._kernel_block_sizes(ev)
        if "error" in ev and self.error is None:
            process = "front end" if ev.get("pid") == self.front_pid else "worker"
            source = f"probe:{ev.get('pid')}"
            self.error = ErrorInfo.model_validate(
                {**ev["error"], "process": process, "source": source}
            )
            self.sized_before_error = self.sized

    def _installed(self, ev: dict[str, Any]) -> None:
        self.hooks.update(ev.get("hooks") or [])
        self.by_pid.setdefault(str(ev.get("pid")), []).extend(ev.get("hooks") or [])
        # A hook the release gave no place for, with the vLLM name it lacks.
        self.fields.setdefault("probe_missing", {}).update(ev.get("missing") or {})

    def _block_size_update(self, ev: dict[str, Any]) -> None:
        f = self.fields
        stage = ev.get("pp_rank")
        if stage is not None and "block_size" in ev:
            f.setdefault("stage_block_sizes_by_rank", {})[stage] = ev["block_size"]
        if (stage or 0) > 0 or (ev.get("tp_rank") or 0) > 0:
            return  # another rank's choice: the record's own fields are the first rank's
        f.setdefault("sizing_pid", ev.get("pid"))
        f["block_size_before"] = ev.get("block_size_before")
        f["user_specified_block_size"] = ev.get("user_specified_block_size")
        f["layer_backends"] = ev.get("layer_backends") or {}
        f["isa_view"] = ev.get("isa_view")
        if "block_size" in ev:  # absent when the update raised before choosing
            f["worker_block_size"] = ev["block_size"]
            f["mamba_page_size_padded"] = ev.get("mamba_page_size_padded")
            f["mamba_block_size"] = ev.get("mamba_block_size")
            f["mamba_cache_mode"] = ev.get("mamba_cache_mode")
            f["backends"] = ev.get("backends") or []
            f["backends_accept"] = ev.get("accepts") or {}
            f["backend_kernel_sizes"] = ev.get("backend_kernel_sizes") or {}

    def _kv_cache_sized(self, ev: dict[str, Any]) -> None:
        self.fields.setdefault("kv_sized_pid", ev.get("pid"))
        self.sized = True
        self.groups = [KVGroup.model_validate(g) for g in ev.get("groups", [])]

    def _kernel_block_sizes(self, ev: dict[str, Any]) -> None:
        self.kernel_pid = ev.get("pid")
        self.fields["kernel_block_sizes"] = ev["kernel_block_sizes"]
        for group, size in zip(self.groups, ev["kernel_block_sizes"], strict=False):
            group.kernel_block_size = size


def _root_cause(
    probed: _Probed, front_err: ErrorInfo | None, log_text: str
) -> tuple[ErrorInfo | None, bool | None]:
    """The error to report and whether the KV cache was sized before it. The probe's error
    wins; without one, a front end error that only wraps a child's (the multiprocess
    engine's) is replaced by the child's own exception from the log."""
    if front_err is None or probed.error is not None:
        return probed.error, probed.sized_before_error
    wrapped = any(w in front_err.message for w in _WRAPPER_ERRORS)
    root = (root_cause_from_log(log_text) if wrapped else None) or front_err
    # Not raised inside the probed functions: it came before the KV cache was sized unless
    # the probe saw the sizing happen.
    return root, probed.sized


def _outcome(
    ended_by: str | None, frontend: dict[str, Any] | None, root: ErrorInfo | None
) -> Outcome:
    """A kill by the runner names the outcome first: what the cell wrote before it is
    not its end. Without a summary the cell crashed, whatever it logged."""
    if ended_by in ("timeout", "memory"):
        return ended_by  # type: ignore[return-value]
    if frontend is None:
        return "crashed"
    if root is not None:
        return "error"
    return "configured" if frontend.get("configured") else "ran"
