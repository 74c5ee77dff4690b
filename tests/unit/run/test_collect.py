from __future__ import annotations

import json

from kvrig.run.collect import assemble, parse_events, root_cause_from_log

from ..builders import cell_with

EARLY_MSG = "Aligned KV cache block size 384 is not supported by attention backend(s): S."
CELL = cell_with({"outcome": "early_error", "backends": ["S"]})


def ev(event: str, pid: int = 20, **kw) -> dict:
    return {"event": event, "pid": pid, **kw}


def early_events(pid: int = 20) -> list[dict]:
    return [
        ev(
            "block_size_update",
            pid,
            block_size_before=128,
            layer_backends={"l3": "S"},
            error={
                "type": "ValueError",
                "message": EARLY_MSG,
                "function": "_check_aligned_block_size",
            },
        )
    ]


def test_mp_early_error_takes_the_worker_root_cause() -> None:
    front = {
        "pid": 10,
        "frontend_error": {
            "type": "RuntimeError",
            "function": "wait_for_engine_startup",
            "message": "Engine core initialization failed. See root cause above.",
        },
    }
    rec = assemble(
        CELL, frontend=front, events=early_events(), exit_code=0, signal_name=None, ended_by=None
    )
    assert rec.outcome == "error"
    assert rec.error.type == "ValueError"
    assert rec.error.process == "worker"
    assert rec.error.function == "_check_aligned_block_size"
    assert rec.frontend_error.type == "RuntimeError"
    assert rec.kv_cache_sized_before_error is False
    assert rec.layer_backends == {"l3": "S"}


def test_in_process_error_is_labelled_front_end() -> None:
    front = {"pid": 20, "frontend_error": {"type": "ValueError", "message": EARLY_MSG}}
    rec = assemble(
        CELL, frontend=front, events=early_events(20), exit_code=0, signal_name=None, ended_by=None
    )
    assert rec.error.process == "front end"


def test_run_collects_groups_and_kernel_sizes() -> None:
    events = [
        ev(
            "block_size_update",
            block_size_before=128,
            block_size=384,
            accepts={"A": True},
            backends=["A"],
            mamba_page_size_padded=98304,
        ),
        ev(
            "kv_cache_sized",
            groups=[
                {
                    "kind": "MambaSpec",
                    "block_size": 384,
                    "page_size_bytes": 98304,
                    "real_page_size_bytes": 67840,
                },
                {"kind": "FullAttentionSpec", "block_size": 384, "page_size_bytes": 98304},
            ],
        ),
        ev("kernel_block_sizes", kernel_block_sizes=[384, 128]),
    ]
    front = {
        "pid": 20,
        "tokens_generated": 4,
        "engine_block_size": 384,
        "vllm_version": "0.32.0",
        "timings": {"import_s": 8.0},
    }
    rec = assemble(
        CELL, frontend=front, events=events, exit_code=0, signal_name=None, ended_by=None
    )
    assert rec.outcome == "ran"
    assert rec.worker_block_size == 384
    assert [g.kernel_block_size for g in rec.kv_cache_groups] == [384, 128]
    assert rec.backends_accept == {"A": True}
    assert rec.vllm_version == "0.32.0"
    assert rec.vllm_overrides == []
    assert rec.error is None
    assert rec.kv_cache_sized_before_error is None


def test_late_error_is_after_sizing() -> None:
    events = [
        ev("block_size_update", block_size=128),
        ev("kv_cache_sized", groups=[]),
        ev(
            "kernel_block_sizes",
            error={
                "type": "ValueError",
                "message": "No common",
                "function": "select_common_block_size",
            },
        ),
    ]
    rec = assemble(
        CELL,
        frontend={"pid": 1, "frontend_error": {"type": "ValueError", "message": "No common"}},
        events=events,
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert rec.kv_cache_sized_before_error is True
    assert rec.error.function == "select_common_block_size"


def test_crash_timeout_memory() -> None:
    rec = assemble(
        CELL, frontend=None, events=[], exit_code=-4, signal_name="SIGILL", ended_by=None
    )
    assert rec.outcome == "crashed"
    assert rec.signal == "SIGILL"
    for reason in ("timeout", "memory"):
        rec = assemble(
            CELL, frontend=None, events=[], exit_code=-9, signal_name="SIGKILL", ended_by=reason
        )
        assert rec.outcome == reason


def test_wrapped_error_without_probe_uses_the_log() -> None:
    log = "\n".join(
        [
            "(EngineCore pid=5) Traceback (most recent call last):",
            '  File "/x/cpu.py", line 149, in get_attn_backend_cls',
            "(EngineCore pid=5) NotImplementedError: Sparse Attention is not supported on CPU.",
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )
    front = {
        "pid": 1,
        "frontend_error": {"type": "RuntimeError", "message": "Engine core initialization failed."},
    }
    rec = assemble(
        CELL, frontend=front, events=[], exit_code=0, signal_name=None, ended_by=None, log_text=log
    )
    assert rec.error.type == "NotImplementedError"
    assert rec.error.function == "get_attn_backend_cls"
    assert rec.kv_cache_sized_before_error is False


def test_root_cause_skips_wrapper_errors() -> None:
    assert root_cause_from_log("RuntimeError: Engine core initialization failed.") is None


def test_parse_events_drops_a_cut_line() -> None:
    text = json.dumps({"event": "a"}) + "\n" + '{"event": "b", "pi'
    assert parse_events(text) == [{"event": "a"}]


def test_a_kill_names_the_outcome_before_anything_the_cell_wrote() -> None:
    from kvrig.run.collect import _outcome
    from kvrig.run.record import ErrorInfo

    err = ErrorInfo(type="ValueError", message="m")
    summary = {"configured": True}
    assert _outcome("timeout", summary, err) == "timeout"
    assert _outcome("memory", None, None) == "memory"
    assert _outcome(None, None, err) == "crashed"  # no summary: whatever it logged
    assert _outcome(None, summary, err) == "error"
    assert _outcome(None, summary, None) == "configured"
    assert _outcome(None, {}, None) == "ran"


def test_the_environments_overrides_go_from_the_front_end_into_the_record() -> None:
    front = {"pid": 20, "vllm_version": "0.34.0", "vllm_overrides": ["flashinfer-python==0.7.4"]}
    rec = assemble(CELL, frontend=front, events=[], exit_code=0, signal_name=None, ended_by=None)
    assert rec.vllm_overrides == ["flashinfer-python==0.7.4"]


# --- where each fact was read ---------------------------------------------------------------

WRAPPED = {
    "type": "RuntimeError",
    "function": "wait_for_engine_startup",
    "message": "Engine core initialization failed. See root cause above.",
}


def test_each_fact_says_where_it_was_read() -> None:
    events = [
        ev("probe_installed", 20, hooks=["CpuPlatform.update_block_size_for_backend"]),
        ev("block_size_update", 20, block_size=384, backends=["A"], accepts={"A": True}),
        ev("kv_cache_sized", 20, groups=[]),
        ev("kernel_block_sizes", 20, kernel_block_sizes=[384]),
    ]
    log = "INFO Setting attention block size to 384 tokens to ensure that attention page size"
    front = {"pid": 10, "tokens_generated": 4, "engine_block_size": 384, "vllm_version": "0.32.0"}
    rec = assemble(
        CELL, frontend=front, events=events, exit_code=0, signal_name=None, ended_by=None,
        log_text=log,
    )  # fmt: skip
    assert rec.frontend_pid == 10
    assert rec.sources == {
        "worker_block_size": "probe:20",
        "kv_cache_groups": "probe:20",
        "kernel_block_sizes": "probe:20",
        "alignment_log": "log",
        "engine_block_size": "summary:10",
        "tokens_generated": "summary:10",
        "vllm_version": "summary:10",
    }


def test_an_error_says_whether_the_probe_the_log_or_the_summary_gave_it() -> None:
    probed = assemble(
        CELL,
        frontend={"pid": 10, "frontend_error": WRAPPED},
        events=early_events(20),
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert probed.error.source == "probe:20" and probed.error.source_pid() == "20"
    assert probed.frontend_error.source == "summary:10"
    assert probed.sources["error"] == "probe:20"
    log = "\n".join(
        [
            '  File "/v/interface.py", line 9, in _check_aligned_block_size',
            f"(EngineCore_DP0 pid=20) ValueError: {EARLY_MSG}",
        ]
    )
    read = assemble(
        CELL, frontend={"pid": 10, "frontend_error": WRAPPED}, events=[], exit_code=0,
        signal_name=None, ended_by=None, log_text=log,
    )  # fmt: skip
    assert (read.error.process, read.error.source) == ("worker", "log:20")
    unnamed = root_cause_from_log(f"ValueError: {EARLY_MSG}")
    assert unnamed is not None and unnamed.source == "log" and unnamed.source_pid() is None
    plain = assemble(
        CELL,
        frontend={"pid": 10, "frontend_error": {"type": "ValueError", "message": "bad knob"}},
        events=[],
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert (plain.error.process, plain.error.source) == ("front end", "summary:10")


def _update(pid: int, pp_rank: int, tp_rank: int, size: int) -> dict:
    return ev(
        "block_size_update",
        pid,
        pp_rank=pp_rank,
        tp_rank=tp_rank,
        block_size_before=64,
        block_size=size,
        layer_backends={f"l{pp_rank}": "FLASH_ATTN"},
    )


def test_each_pipeline_stage_s_block_is_kept_and_the_first_rank_s_is_the_record_s() -> None:
    # Stage 1's worker reports first; stage 0's rank 0 is still the record's own worker.
    events = [_update(31, 1, 0, 64), _update(30, 0, 1, 320), _update(29, 0, 0, 320)]
    front = {"pid": 29, "configured": True}
    rec = assemble(
        cell_with({"outcome": "runs"}),
        frontend=front,
        events=events,
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert rec.stage_block_sizes == [320, 64]
    assert (rec.worker_block_size, rec.sizing_pid, rec.layer_backends) == (
        320,
        29,
        {"l0": "FLASH_ATTN"},
    )


def test_one_stage_keeps_no_stage_list() -> None:
    rec = assemble(
        cell_with({"outcome": "runs"}),
        frontend={"pid": 29},
        events=[_update(29, 0, 0, 192), _update(30, 0, 1, 192)],
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert (rec.stage_block_sizes, rec.worker_block_size) == ([], 192)
