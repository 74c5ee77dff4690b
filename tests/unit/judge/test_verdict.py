from __future__ import annotations

import copy
from typing import Any

import pytest

from kvrig.judge.verdict import early_error_backends, judge
from kvrig.run.record import ErrorInfo, KVGroup, Record

from ..builders import BASE, ROOT, cell_with
from ..records import HOOKS, alignment, failed, ran

EARLY = "Aligned KV cache block size 384 is not supported by attention backend(s): {}."


RUNS = {"outcome": "runs"}


def test_runs_passes_on_a_healthy_record() -> None:
    v = judge(cell_with(RUNS), ran())
    assert v.passed
    assert v.status == "pass"


def test_runs_fails_without_tokens() -> None:
    v = judge(cell_with(RUNS), ran(tokens_generated=0))
    assert not v.passed
    assert "no token generated" in v.reason


def test_runs_fails_when_a_backend_rejects_the_size() -> None:
    v = judge(cell_with(RUNS), ran(backends_accept={"CPU_ATTN": True, "X": False}))
    assert not v.passed
    assert "X rejects the chosen block size 384" in v.reason


def test_runs_fails_when_attention_page_is_smaller_than_mamba() -> None:
    groups = [
        KVGroup(
            kind="MambaSpec", block_size=128, page_size_bytes=32768, real_page_size_bytes=67840
        ),
        KVGroup(kind="FullAttentionSpec", block_size=128, page_size_bytes=32768),
    ]
    v = judge(cell_with(RUNS), ran(kv_cache_groups=groups))
    assert not v.passed
    assert "attention page 32768 B < mamba page 67840 B" in v.reason


def test_page_invariant_is_for_hybrids_only() -> None:
    v = judge(
        cell_with(RUNS, family="dense"),
        ran(
            family="dense",
            kv_cache_groups=[KVGroup(kind="FullAttentionSpec", block_size=128, page_size_bytes=1)],
        ),
    )
    assert v.passed


def test_runs_invariants() -> None:
    exp = {"outcome": "runs", "invariants": {"block_size": 288}}
    assert "block size 384, expected 288" in judge(cell_with(exp), ran()).reason
    exp = {"outcome": "runs", "invariants": {"kernel_block_sizes_include": [128]}}
    assert "lack 128" in judge(cell_with(exp), ran()).reason
    exp = {"outcome": "runs", "invariants": {"backends_include": ["KVRIG_SIBLING"]}}
    assert "no layer uses backend KVRIG_SIBLING" in judge(cell_with(exp), ran()).reason
    exp = {"outcome": "runs", "invariants": {"block_size_in": [256, 384]}}
    assert judge(cell_with(exp), ran()).passed


def test_rejected_by_control() -> None:
    exp = {"outcome": "runs", "invariants": {"rejected_by": ["S"]}}
    assert judge(cell_with(exp), ran(backends_accept={"CPU_ATTN": True, "S": False})).passed
    v = judge(cell_with(exp), ran(backends_accept={"CPU_ATTN": True, "S": True}))
    assert "S accepts block size 384, expected it to reject" in v.reason
    v = judge(cell_with(exp), ran())
    assert "not in the model" in v.reason


def test_runs_without_probe_data_fails() -> None:
    v = judge(cell_with(RUNS), ran(worker_block_size=None))
    assert "probe saw no block-size decision" in v.reason


def test_runs_fails_on_error_with_one_line_reason() -> None:
    v = judge(cell_with(RUNS), failed(EARLY.format("X"), "_check_aligned_block_size", False))
    assert not v.passed
    assert "\n" not in v.reason
    assert v.reason.startswith("expected the engine to run and generate; got ValueError")


EARLY_EXP = {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}


def test_early_error_passes() -> None:
    rec = failed(EARLY.format("KVRIG_SIBLING"), "_check_aligned_block_size", False)
    assert judge(cell_with(EARLY_EXP), rec).passed


def test_early_error_needs_exactly_the_named_backends() -> None:
    rec = failed(EARLY.format("KVRIG_SIBLING, CPU_ATTN"), "_check_aligned_block_size", False)
    v = judge(cell_with(EARLY_EXP), rec)
    assert "named KVRIG_SIBLING, CPU_ATTN instead of KVRIG_SIBLING" in v.reason


def test_early_error_that_came_late_fails() -> None:
    rec = failed(
        "No common block size for 384 (CPU_ATTN: [MultipleOf(32)]; KVRIG_SIBLING: [32]).",
        "select_common_block_size",
        True,
    )
    v = judge(cell_with(EARLY_EXP), rec)
    assert not v.passed
    assert "after KV-cache sizing" in v.reason
    assert "select_common_block_size" in v.reason


def test_early_error_that_never_came_fails() -> None:
    v = judge(cell_with(EARLY_EXP), ran())
    assert not v.passed
    assert "engine ran, generated 4 token(s)" in v.reason


def test_early_error_from_another_function_fails() -> None:
    rec = failed(EARLY.format("KVRIG_SIBLING"), "somewhere_else", False)
    assert "raised by somewhere_else" in judge(cell_with(EARLY_EXP), rec).reason


def test_late_error() -> None:
    exp = {"outcome": "late_error", "match": "No common block size for 128"}
    late = failed(
        "No common block size for 128 (A: [32]; B: [48]).", "select_common_block_size", True
    )
    assert judge(cell_with(exp), late).passed
    early = failed("No common block size for 128", "select_common_block_size", False)
    assert "before the KV cache was sized" in judge(cell_with(exp), early).reason
    fired = failed(EARLY.format("B"), "_check_aligned_block_size", False)
    assert "early check fired" in judge(cell_with(exp), fired).reason


def test_a_late_error_must_be_the_workers_check_at_exactly_that_size() -> None:
    exp = {"outcome": "late_error", "match": "No common block size for 128"}
    bigger = failed("No common block size for 1280 (A: [32]).", "select_common_block_size", True)
    v = judge(cell_with(exp), bigger)
    assert v.status == "fail"
    assert "message does not match" in v.reason
    other = failed(
        "No common block size for 128", "select_common_block_size", True, type_="RuntimeError"
    )
    assert "error type RuntimeError, not ValueError" in judge(cell_with(exp), other).reason
    elsewhere = failed("No common block size for 128", "allocate", True)
    assert (
        "raised by allocate, not select_common_block_size"
        in judge(cell_with(exp), elsewhere).reason
    )


def test_unsupported_pins_the_raising_function() -> None:
    exp = {
        "outcome": "unsupported",
        "error": "NotImplementedError",
        "match": "Sparse Attention is not supported on CPU",
        "function": "get_attn_backend_cls",
    }
    rec = failed("Sparse Attention is not supported on CPU.", "load_model", False)
    rec = rec.model_copy(update={"error": rec.error.model_copy(update={"type": exp["error"]})})
    v = judge(cell_with(exp), rec)
    assert "raised by load_model, not get_attn_backend_cls" in v.reason


def test_an_unsupported_expectation_without_its_raising_function_is_refused() -> None:
    # Otherwise an error from any function, even one after KV-cache sizing, would pass.
    with pytest.raises(ValueError, match="function"):
        cell_with({"outcome": "unsupported", "error": "ValueError", "match": "share no"})


def test_unsupported() -> None:
    exp = {
        "outcome": "unsupported",
        "error": "NotImplementedError",
        "match": "Sparse Attention is not supported on CPU",
        "function": "get_attn_backend_cls",
    }
    rec = failed(
        "Sparse Attention is not supported on CPU.",
        "get_attn_backend_cls",
        False,
        type_="NotImplementedError",
    )
    assert judge(cell_with(exp), rec).passed
    other = failed(
        "Sparse Attention is not supported on CPU.",
        "get_attn_backend_cls",
        False,
        type_="ValueError",
    )
    assert "error type ValueError" in judge(cell_with(exp), other).reason
    changed = failed(
        "Sparse Attention now works differently",
        "get_attn_backend_cls",
        False,
        type_="NotImplementedError",
    )
    assert "does not match" in judge(cell_with(exp), changed).reason


def test_crash_and_timeout_are_failures() -> None:
    crash = ran(outcome="crashed", tokens_generated=0, signal="SIGILL", note="died")
    v = judge(cell_with(RUNS), crash)
    assert not v.passed
    assert "crashed" in v.reason
    v = judge(cell_with(EARLY_EXP), ran(outcome="timeout", note="killed after 240 s"))
    assert not v.passed
    assert "timeout" in v.reason


def test_skip() -> None:
    v = judge(cell_with({"outcome": "skip", "reason": "needs AMX"}), ran(outcome="skipped"))
    assert v.status == "skip"
    assert v.reason == "needs AMX"


def test_early_error_parser() -> None:
    assert early_error_backends(EARLY.format("A, B")) == (384, ["A", "B"])
    assert early_error_backends("something else") is None


AVX512_BF16 = {"isa_class": "avx512_bf16"}


def hybrid_groups(size: int, mamba: int, per_token: int = 256) -> list[KVGroup]:
    """The KV-cache groups of a hybrid engine at `size`: the mamba state padded to exactly
    the attention page."""
    page = size * per_token
    return [
        KVGroup(
            kind="MambaSpec", block_size=size, page_size_bytes=page, real_page_size_bytes=mamba
        ),
        KVGroup(kind="FullAttentionSpec", block_size=size, page_size_bytes=page),
    ]


# The tiny granite below AVX512-BF16: a bf16 state of 35072 B, aligned to 256.
BF16_STATE_AT_256 = {
    "worker_block_size": 256,
    "kv_cache_groups": hybrid_groups(256, 35072),
    **alignment(256, 35072),
}


def test_a_size_other_than_the_computed_one_fails_with_both_sizes() -> None:
    # The tiny granite aligns to 384 on an AVX512-BF16 CPU; 416 runs, but is not vLLM's rule.
    v = judge(cell_with(RUNS), ran(worker_block_size=416, host=AVX512_BF16))
    assert v.status == "fail"
    assert "vLLM chose 416, expected 384" in v.reason
    assert judge(cell_with(RUNS), ran(host=AVX512_BF16)).expected_block_size == 384


def rejected_at_416() -> Record:
    """The early check firing at 416 on an AVX512-BF16 host, where 384 is computed."""
    msg = EARLY.replace("384", "416").format("KVRIG_SIBLING")
    return failed(msg, "_check_aligned_block_size", sized=False).model_copy(
        update={"host": AVX512_BF16}
    )


def test_the_early_error_size_is_compared_too() -> None:
    cell = cell_with({"outcome": "early_error", "backends": ["KVRIG_SIBLING"]})
    rec = rejected_at_416()
    v = judge(cell, rec)
    assert v.status == "fail"
    assert "vLLM raised at 416, expected 384" in v.reason


def test_the_size_follows_the_cpu_class_of_the_host_or_the_emulated_one() -> None:
    # Below AVX512-BF16 the SSM state stays bf16: the tiny granite aligns to 256.
    rec = ran(**BF16_STATE_AT_256, host={"isa_class": "avx2"})
    v = judge(cell_with(RUNS), rec)
    assert v.status == "pass"
    assert v.expected_block_size == 256
    # A cell run under an emulated class follows that class, whatever the host is.
    emulated = cell_with(RUNS).model_copy(update={"isa": "avx2", "emulated": True})
    assert judge(emulated, ran(**BF16_STATE_AT_256, host={"isa_class": "amx"})).passed
    assert judge(emulated, ran(host={"isa_class": "amx"})).status == "fail"


def test_a_size_that_cannot_be_computed_is_said_and_fails_a_gate_cell() -> None:
    # No ISA facts at all: the CPU class, and so the SSM state dtype, is unknown.
    v = judge(cell_with(RUNS), ran(worker_block_size=4096, host={}))
    assert v.status == "pass"
    assert "size not checked: the CPU class is unknown (no ISA facts in the record)" in v.reason
    gated = judge(cell_with(RUNS, gate=True), ran(worker_block_size=4096, host={}))
    assert gated.status == "fail"
    assert "size not checked: the CPU class is unknown" in gated.reason


def view(**kw: Any) -> dict[str, Any]:
    base = {
        "emulated_class": None,
        "avx512": False,
        "avx512_bf16": False,
        "amx": False,
        "kernel_libraries": ["_C_AVX2"],
        "mamba_ssm_cache_dtype": "auto",
    }
    return {**base, **kw}


def test_what_vllm_saw_of_the_cpu_must_be_its_class() -> None:
    avx2 = {"isa_class": "avx2"}
    ok = ran(**BF16_STATE_AT_256, host=avx2, isa_view=view())
    assert judge(cell_with(RUNS), ok).passed
    probes = ran(**BF16_STATE_AT_256, host=avx2, isa_view=view(avx512_bf16=True))
    v = judge(cell_with(RUNS), probes)
    assert v.status == "fail"
    assert "avx512_bf16 True (class avx2: False)" in v.reason
    library = ran(**BF16_STATE_AT_256, host=avx2, isa_view=view(kernel_libraries=["_C"]))
    v = judge(cell_with(RUNS), library)
    assert v.status == "fail"
    assert "not _C_AVX2, which the avx2 class loads" in v.reason


def test_an_emulated_cell_whose_worker_was_not_emulated_fails() -> None:
    cell = cell_with(RUNS).model_copy(update={"isa": "avx2", "emulated": True})
    host = {"isa_class": "avx2"}
    emulated = view(emulated_class="avx2")
    assert judge(cell, ran(**BF16_STATE_AT_256, host=host, isa_view=emulated)).passed
    v = judge(cell, ran(**BF16_STATE_AT_256, host=host, isa_view=view()))
    assert v.status == "fail"
    assert "the worker ran unemulated" in v.reason


DEFECT = {
    "reason": "rounds by the LCM",
    "shows": {"cpu": {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}},
}


def test_a_known_defect_showing_as_recorded_is_an_expected_failure() -> None:
    cell = cell_with(RUNS, known_defect=DEFECT)
    rec = failed(EARLY.format("KVRIG_SIBLING"), "_check_aligned_block_size", sized=False)
    v = judge(cell, rec)
    assert v.status == "xfail"
    assert v.passed
    assert "known vLLM defect: rounds by the LCM" in v.reason


def test_a_known_defect_at_another_size_is_not_the_recorded_defect() -> None:
    # The tiny granite's released alignment lands on 384 on an AVX512-BF16 class: a
    # rejection at 416 is some other behaviour, not the defect the matrix recorded.
    cell = cell_with(RUNS, known_defect=DEFECT)
    rec = rejected_at_416()
    v = judge(cell, rec)
    assert v.status == "fail"
    assert "nor does it show the known defect" in v.reason
    assert "vLLM raised at 416, expected 384" in v.reason


def test_a_known_defect_that_no_longer_shows_fails_the_cell() -> None:
    v = judge(cell_with(RUNS, known_defect=DEFECT), ran())
    assert v.status == "fail"
    assert "no longer shows" in v.reason


def test_a_known_defect_cell_failing_some_other_way_fails() -> None:
    cell = cell_with(RUNS, known_defect=DEFECT)
    rec = failed(EARLY.format("CPU_ATTN"), "_check_aligned_block_size", sized=False)
    v = judge(cell, rec)
    assert v.status == "fail"
    assert "nor does it show the known defect" in v.reason


def test_a_record_without_the_probes_hooks_fails_naming_the_missing_one() -> None:
    no_update = ran(probe_hooks=HOOKS[1:])
    v = judge(cell_with(RUNS), no_update)
    assert v.status == "fail"
    assert "probe not installed: update_block_size_for_backend" in v.reason
    no_sizing = failed("No common block size for 128", "select_common_block_size", True)
    no_sizing = no_sizing.model_copy(update={"probe_hooks": HOOKS[:1]})
    late = {"outcome": "late_error", "match": "No common block size for 128"}
    assert (
        "probe not installed: prepare_kernel_block_sizes"
        in judge(cell_with(late), no_sizing).reason
    )


def test_a_running_engine_whose_kv_cache_was_never_seen_sized_fails() -> None:
    v = judge(cell_with(RUNS), ran(kv_cache_sized_seen=False))
    assert v.status == "fail"
    assert "the probe never saw the KV cache sized" in v.reason


def _matrix_cell(cell_id: str):

    from kvrig.define.cells import expand
    from kvrig.define.matrix import load

    matrix = load(ROOT / "matrix.yaml")
    return next(c for c in expand(matrix, cell_id.split("-")[0]) if c.id == cell_id)


def _gpu_ran(cell, size: int, mamba: int = 35072, start: int = 16, **host: Any) -> Record:
    """A GPU engine at `size`, its pages and alignment as vLLM lays them out for the state."""
    groups = [g.model_copy(update={"real_page_size_bytes": None}) for g in hybrid_groups(size, 0)]
    return ran(
        **alignment(size, mamba, start=start),
        cell_id=cell.id,
        platform=cell.platform,
        worker_block_size=size,
        engine_block_size=size,
        backends_accept={"FLASH_ATTN": True},
        kv_cache_groups=groups,
        kernel_block_sizes=[size, size],
        layer_backends={"model.layers.1.self_attn.attn": "FLASH_ATTN"},
        host=host,
    )


def _gpu_cell(platform: str, **case: Any):
    """A granite cell on a GPU platform with the matrix's own platform spec."""

    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix, load

    shipped = load(ROOT / "matrix.yaml")
    data = copy.deepcopy(BASE)
    data["platforms"][platform] = shipped.platforms[platform].model_dump(exclude_none=True)
    data["cases"] = [{"id": "c", "model": "granite_hybrid", "expect": {platform: RUNS}, **case}]
    return expand(Matrix.model_validate(data), platform)[0]


def test_a_cuda_cell_at_another_size_fails_as_on_cpu() -> None:
    # The CUDA rules reproduce published CUDA engine logs
    # (tests/unit/rules/test_published_logs.py), so a CUDA engine choosing another size than
    # 16 x cdiv(35072, 16 x 256) = 144 (the bf16 state "auto" gives) fails, even where the
    # case's invariants name no size.
    cell = _gpu_cell("cuda")
    assert judge(cell, _gpu_ran(cell, 144)).status == "pass"
    wrong = judge(cell, _gpu_ran(cell, 272, mamba=67840))
    assert wrong.status == "fail"
    assert "vLLM chose 272, expected 144" in wrong.reason


def test_an_xpu_size_mismatch_stays_a_note_saying_why() -> None:
    cell = _gpu_cell("xpu")
    v = judge(cell, _gpu_ran(cell, 320, mamba=67840, start=64))
    assert v.status == "pass"
    assert "expected 192" in v.reason
    assert "no published log or run confirms the xpu rules" in v.reason


def test_a_cuda_gdn_cell_follows_the_gpu_the_record_names() -> None:
    # Prefix caching on: FlashInfer's GDN prefill on SM90 adds the 64-token checkpoint,
    # 64 x cdiv(35840, 64 x 4096) = 64 (so 192 with the bf16 state's 3 steps); Ampere's
    # Triton prefill does not: 16 x cdiv(35840, 4096) = 144.
    cell = _matrix_cell("cuda-qwen3_next-ssm_bf16")
    hopper = judge(cell, _gpu_ran(cell, 192, gpu_compute_capability="9.0"))
    ampere = judge(cell, _gpu_ran(cell, 144, gpu_compute_capability="8.0"))
    assert (hopper.expected_block_size, ampere.expected_block_size) == (192, 144)
    assert judge(cell, _gpu_ran(cell, 144, gpu_compute_capability="9.0")).status == "fail"


def test_the_right_size_with_other_pages_fails_with_both_figures() -> None:
    """vLLM chose 384 on an AVX512-BF16 CPU, but laid the pages out otherwise."""
    cell = cell_with(RUNS)
    assert judge(cell, ran(host=AVX512_BF16)).status == "pass"  # 384 x 256, state 67840
    state = ran(host=AVX512_BF16, kv_cache_groups=hybrid_groups(384, 35072))
    v = judge(cell, state)
    assert v.status == "fail"
    assert "mamba state page 35072 B, computed 67840 B" in v.reason
    groups = hybrid_groups(384, 67840)
    groups[0] = groups[0].model_copy(update={"page_size_bytes": 67840})
    v = judge(cell, ran(host=AVX512_BF16, kv_cache_groups=groups))
    assert v.status == "fail"
    assert "mamba page padded to 67840 B, computed 98304 B" in v.reason
    attention = hybrid_groups(384, 67840, per_token=512)
    attention[0] = attention[0].model_copy(update={"page_size_bytes": 98304})
    v = judge(cell, ran(host=AVX512_BF16, kv_cache_groups=attention))
    assert "attention page 196608 B, computed 98304 B (256 B/token x 384)" in v.reason


def test_an_error_is_named_by_type_then_function_then_message() -> None:
    from kvrig.judge.verdict import _raised_as

    err = ErrorInfo(type="ValueError", message="No common block size for 128", function="f")
    assert _raised_as(err, "ValueError", "f", "block size for 128") is None
    assert (
        _raised_as(err, "RuntimeError", "g", "nothing") == "error type ValueError, not RuntimeError"
    )
    assert _raised_as(err, "ValueError", "g", "nothing") == "raised by f, not g"
    assert _raised_as(err, "ValueError", "f", "for 12") == "message does not match"
