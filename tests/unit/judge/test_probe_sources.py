"""A worker's error is trusted only from the worker.

In a multiprocess engine the front end (pid 10) sees only "Engine core initialization
failed"; the worker (pid 20) either reports its own probe and error, or only prints the
error in the log, which the front end must not vouch for.
"""

from __future__ import annotations

from typing import Any

from kvrig.judge.verdict import Status, judge
from kvrig.run.collect import assemble
from kvrig.run.record import Record

from ..builders import cell_with
from ..records import HOOKS

FRONT, WORKER = 10, 20
EARLY = "Aligned KV cache block size 384 is not supported by attention backend(s): KVRIG_SIBLING."
LATE = "No common block size for 128 (CPU_ATTN: [MultipleOf(32)]; KVRIG_SIBLING: [48])."
EARLY_CELL = cell_with({"outcome": "early_error", "backends": ["KVRIG_SIBLING"]})
SIBLING_48 = {"siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.1.", "sizes": [48]}]}
LATE_CELL = cell_with(
    {"outcome": "late_error", "match": "No common block size for 128"},
    family="dense",
    crafted=SIBLING_48,
)
WRAPPED = {
    "pid": FRONT,
    "frontend_error": {
        "type": "RuntimeError",
        "function": "wait_for_engine_startup",
        "message": "Engine core initialization failed. See root cause above.",
    },
}


def installed(pid: int) -> dict[str, Any]:
    return {"event": "probe_installed", "pid": pid, "hooks": HOOKS}


def logged(message: str, function: str, pid: int | None = WORKER) -> str:
    """What the worker printed when it failed: its traceback's last frame and the error."""
    prefix = f"(EngineCore_DP0 pid={pid}) " if pid is not None else ""
    return "\n".join(
        [
            f"{prefix}Traceback (most recent call last):",
            f'  File "/site-packages/vllm/x.py", line 9, in {function}',
            f"{prefix}ValueError: {message}",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )


def record(events: list[dict[str, Any]], log: str = "", cell: Any = EARLY_CELL) -> Record:
    return assemble(
        cell, frontend=WRAPPED, events=events, exit_code=0, signal_name=None, ended_by=None,
        log_text=log,
    )  # fmt: skip


def test_the_workers_early_error_from_its_own_probe_passes() -> None:
    error = {"type": "ValueError", "message": EARLY, "function": "_check_aligned_block_size"}
    events = [
        installed(FRONT),
        installed(WORKER),
        {"event": "block_size_update", "pid": WORKER, "block_size_before": 128, "error": error},
    ]
    rec = record(events)
    assert rec.error.source == f"probe:{WORKER}"
    assert judge(EARLY_CELL, rec).passed


def test_a_front_end_probe_does_not_vouch_for_an_early_error_the_worker_only_printed() -> None:
    rec = record([installed(FRONT)], logged(EARLY, "_check_aligned_block_size"))
    assert (rec.error.process, rec.error.source) == ("worker", f"log:{WORKER}")
    v = judge(EARLY_CELL, rec)
    assert v.status is Status.FAIL
    assert (
        f"the worker's error was read from the log's text of pid {WORKER}, and pid {WORKER} did"
        f" not report the probe's hooks (only pid {FRONT} (front end) did)"
    ) in v.reason
    # With the worker's own hooks recorded, the same log line is that worker's word.
    log = logged(EARLY, "_check_aligned_block_size")
    assert judge(EARLY_CELL, record([installed(FRONT), installed(WORKER)], log)).passed


def test_a_log_line_that_names_no_process_needs_some_worker_with_its_hooks() -> None:
    log = logged(EARLY, "_check_aligned_block_size", pid=None)
    v = judge(EARLY_CELL, record([installed(FRONT)], log))
    assert v.status is Status.FAIL
    assert "read from the log's text, and no process besides the front end reported" in v.reason
    assert judge(EARLY_CELL, record([installed(FRONT), installed(WORKER)], log)).passed


def test_no_probe_at_all_is_still_refused_as_before() -> None:
    v = judge(EARLY_CELL, record([], logged(EARLY, "_check_aligned_block_size")))
    assert v.status is Status.FAIL and "probe not installed" in v.reason


def test_a_late_error_the_worker_only_printed_does_not_pass_on_the_front_ends_sizing() -> None:
    """The KV cache seen sized by the front end's probe (an in-process engine's place), and
    the worker's late error only in the log: the error is not the sized process's word."""
    sized = {"event": "kv_cache_sized", "pid": FRONT, "groups": []}
    log = logged(LATE, "select_common_block_size")
    rec = record([installed(FRONT), sized], log, LATE_CELL)
    assert rec.kv_cache_sized_before_error is True and rec.error.source == f"log:{WORKER}"
    v = judge(LATE_CELL, rec)
    assert v.status is Status.FAIL
    assert f"pid {WORKER} did not report the probe's hooks" in v.reason


def test_an_error_event_from_a_process_that_never_reported_its_hooks_is_refused() -> None:
    """A probe line from pid 30, which never said its probe was installed."""
    error = {"type": "ValueError", "message": LATE, "function": "select_common_block_size"}
    events = [
        installed(FRONT),
        installed(WORKER),
        {"event": "kv_cache_sized", "pid": WORKER, "groups": []},
        {"event": "kernel_block_sizes", "pid": 30, "error": error},
    ]
    rec = record(events, cell=LATE_CELL)
    assert rec.error.source == "probe:30"
    v = judge(LATE_CELL, rec)
    assert v.status is Status.FAIL
    assert "read from the probe of pid 30, and pid 30 did not report the probe's hooks" in v.reason
    events[-1] = {**events[-1], "pid": WORKER}
    assert judge(LATE_CELL, record(events, cell=LATE_CELL)).passed


def test_an_error_whose_source_went_unsaid_is_still_weighed_by_its_process() -> None:
    rec = record([installed(FRONT)], logged(EARLY, "_check_aligned_block_size"))
    unsaid = rec.model_copy(update={"error": rec.error.model_copy(update={"source": None})})
    v = judge(EARLY_CELL, unsaid)
    assert v.status is Status.FAIL
    assert "a source the record does not name, and no process besides the front end" in v.reason


def test_kernel_block_sizes_from_a_process_without_the_hook_are_not_trusted() -> None:
    events = [
        installed(FRONT),
        {"event": "kernel_block_sizes", "pid": 30, "kernel_block_sizes": [128]},
    ]
    rec = record(events)
    assert rec.sources["kernel_block_sizes"] == "probe:30"
    v = judge(EARLY_CELL, rec)
    assert "probe not installed in the process that chose the kernel block sizes (pid 30)" in (
        v.reason
    )
