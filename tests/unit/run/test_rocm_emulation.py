"""The emulated ROCm device's own logic: the gfx targets it fakes and what it answers for
them, the plugin's switch, the cell's environment, the record's fakes and the `aiter`
stand-in (no vLLM: vLLM's RocmPlatform itself runs in the emulated columns)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from kvrig.define import column_choice, column_names, gpus
from kvrig.rules import rocm
from kvrig.run import cell as cellmod
from kvrig.run import emulation
from kvrig.run.emulation import rocm_answers, standins, stub_modules

# --- the devices ------------------------------------------------------------------------


def test_the_rocm_devices_are_named_by_gfx_target_and_torch_s_full_name_is_read_as_one() -> None:
    assert list(gpus.ROCM_GPUS) == ["gfx942", "gfx950", "gfx1201"]
    assert gpus.gpu("rocm", "gfx942:sramecc+:xnack-").arch == "gfx942"
    assert gpus.gpu("rocm", "GFX1201").name == "AMD_Radeon_R9700"
    assert gpus.emulated_column("rocm", "gfx950") == "rocm-gfx950-emulated"
    with pytest.raises(gpus.GpuError, match=r"'gfx90a' is not a rocm architecture.*gfx942"):
        gpus.gpu("rocm", "gfx90a")


def test_rocm_runs_emulated_only_until_its_real_column_is_built() -> None:
    assert [c for c in gpus.emulated_columns() if c.startswith("rocm")] == [
        "rocm-gfx942-emulated",
        "rocm-gfx950-emulated",
        "rocm-gfx1201-emulated",
    ]
    assert "rocm" not in column_names.HARDWARE_PLATFORMS
    assert not [c for c in column_names.hardware_columns() if c.startswith("rocm")]
    assert "kvrig column --platform rocm --emulate gfx942" in column_names.emulated_only("rocm")


@pytest.mark.parametrize(
    ("arch", "capability", "warp"),
    # vLLM's _capability_from_gcn_arch: gfx942 -> (9, 4), gfx950 -> (9, 5), gfx1201 -> (12, 0)
    [("gfx942", (9, 4), 64), ("gfx950", (9, 5), 64), ("gfx1201", (12, 0), 32)],
)
def test_torch_s_answers_are_the_ones_vllm_derives_from_the_target(
    arch: str, capability: tuple[int, int], warp: int
) -> None:
    device = gpus.gpu("rocm", arch)
    props = rocm_answers.properties(device)
    assert (props.major, props.minor) == rocm_answers.capability(arch) == capability
    assert props.warp_size == warp
    # rocm.py tests substrings of gcnArchName: the target must be in it, and no other one
    assert props.gcnArchName.split(":")[0] == arch
    others = [a for a in gpus.ROCM_GPUS if a != arch]
    assert not [a for a in others if a in props.gcnArchName]
    assert props.total_memory == device.memory_gib << 30
    assert props.multi_processor_count == device.sm_count


# --- the plugin, the environment, the record --------------------------------------------


def test_the_plugin_answers_rocm_s_class_only_when_a_cell_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(emulation.EMULATE_ENV, raising=False)
    assert emulation.platform_plugin() is None
    monkeypatch.setenv(emulation.EMULATE_ENV, emulation.spec("rocm", "gfx942:sramecc+"))
    assert emulation.platform_plugin() == ("kvrig.run.emulation.rocm_platform.EmulatedRocmPlatform")


def _cell(platform: str, arch: str) -> Any:
    return SimpleNamespace(platform=platform, gpu_arch=arch, device_emulated=True)


def test_a_rocm_cell_hides_its_devices_from_triton_the_way_rocm_reads_them() -> None:
    env = cellmod.device_env(_cell("rocm", "gfx942"), {"LD_LIBRARY_PATH": "/x"})
    assert env[emulation.EMULATE_ENV] == "rocm:gfx942"
    assert env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == ""
    assert "HIP_VISIBLE_DEVICES" not in cellmod.device_env(_cell("cuda", "9.0"), {})


def test_every_rocm_fake_is_named_for_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rocm.AITER_ENV, raising=False)
    device = gpus.gpu("rocm", "gfx1201")
    text = " ".join(emulation.fakes(device, 17))
    for fake in (
        "EmulatedRocmPlatform",
        "gfx target gfx1201",
        "amdsmi: unimportable",
        "gcnArchName 'gfx1201'",
        "HIP_VISIBLE_DEVICES empty",
        "17 driver symbols",
        "torch.cuda.Stream",  # ROCm's layers take CUDA objects as CUDA's do
        "vllm._rocm_C: absent",
        "aiter: not installed",
    ):
        assert fake in text
    assert "vllm_xpu_kernels" not in text
    monkeypatch.setenv(rocm.AITER_ENV, "1")
    assert "aiter and every submodule: empty stand-ins" in " ".join(emulation.fakes(device))
    assert "gcnArchName" not in " ".join(emulation.fakes(gpus.gpu("cuda", "9.0")))


def test_the_stand_ins_a_model_is_built_with_serve_rocm_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(Stream=None, Event=None)  # type: ignore[attr-defined]
    torch.accelerator = SimpleNamespace(current_device_index=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    with standins.while_built(gpus.gpu("rocm", "gfx942")):
        assert torch.cuda.Stream is standins.InertStream  # type: ignore[attr-defined]
    assert torch.cuda.Stream is None  # type: ignore[attr-defined]


# --- the aiter stand-in -----------------------------------------------------------------


@pytest.fixture
def stub_aiter(monkeypatch: pytest.MonkeyPatch) -> str:
    """A package name no host has, stubbed for the test only."""
    name = "kvrig_test_aiter"
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for module in [m for m in sys.modules if m.startswith(name)]:
        monkeypatch.delitem(sys.modules, module)
    stub_modules.install(name, "a kernel was called (test)")
    return name


def test_a_stubbed_package_is_found_as_vllm_looks_for_aiter(stub_aiter: str) -> None:
    """vllm/_aiter_ops.py: IS_AITER_FOUND = find_spec("aiter") is not None."""
    assert importlib.util.find_spec(stub_aiter) is not None
    assert importlib.util.find_spec(f"{stub_aiter}.ops.triton") is not None
    module = importlib.import_module(f"{stub_aiter}.ops")
    kernel = module.some_kernel
    assert isinstance(kernel, type)
    with pytest.raises(RuntimeError, match=rf"{stub_aiter}\.ops\.some_kernel: a kernel was"):
        kernel()


def test_aiter_is_installed_only_where_the_environment_says_so() -> None:
    assert not rocm.aiter_installed({})
    assert not rocm.aiter_installed({rocm.AITER_ENV: "0"})
    assert rocm.aiter_installed({rocm.AITER_ENV: "1"})
    assert rocm.aiter_of({rocm.AITER_ENV: "1"}) == rocm.Aiter(found=True)
    on = rocm.aiter_of({rocm.AITER_ENV: "1", "VLLM_ROCM_USE_AITER": "True"})
    assert on.enabled and on.mha
    assert not rocm.aiter_of({"VLLM_ROCM_USE_AITER_MHA": "0"}).mha


# --- the rocm platform of the matrix ---------------------------------------------------------


def _rocm_matrix(**case: Any) -> dict[str, Any]:
    from ..builders import gpu_matrix

    data = gpu_matrix(**case)
    data["platforms"]["cuda"]["vllm"]["version"] = "0.34.0"
    data["platforms"]["rocm"] = {
        "vllm": {"kind": "image", "image": "vllm/vllm-openai-rocm:v0.34.0"},
        "base_image": "rocm/dev-ubuntu-24.04:7.0-complete",
        "default_backend": "ROCM_ATTN",
        "crafted_route": "custom",
    }
    data["cases"][0]["expect"]["rocm"] = {"outcome": "runs"}
    return data


def test_a_gfx_target_refines_the_rocm_expectation_and_only_it() -> None:
    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix

    late = {"outcome": "late_error", "match": "No common block size for 64"}
    matrix = Matrix.model_validate(
        _rocm_matrix(expect_by_arch={"gfx1201": {"why": "TRITON_ATTN first", "expect": late}})
    )
    outcome = {
        arch: expand(matrix, "rocm", gpu_arch=arch, device_emulated=True)[0].expect.outcome
        for arch in gpus.ROCM_GPUS
    }
    assert outcome == {"gfx942": "runs", "gfx950": "runs", "gfx1201": "late_error"}
    # The CUDA cells keep their own expectation.
    assert expand(matrix, "cuda", gpu_arch="9.0")[0].expect.outcome == "runs"


def test_an_unknown_gfx_target_or_a_rocm_key_without_rocm_cells_is_refused() -> None:
    from kvrig.define.matrix import Matrix

    entry = {"why": "w", "expect": {"outcome": "runs"}}
    with pytest.raises(ValueError, match=r"'gfx90a' is not a ROCM architecture kvrig knows"):
        Matrix.model_validate(_rocm_matrix(expect_by_arch={"gfx90a": entry}))
    data = _rocm_matrix(expect_by_arch={"gfx942": entry})
    del data["cases"][0]["expect"]["rocm"]
    with pytest.raises(ValueError, match="has no rocm expectation for its architectures"):
        Matrix.model_validate(data)


def test_a_real_rocm_column_is_refused_in_one_paragraph_naming_the_emulated_one() -> None:
    from kvrig.containers import args as container_args
    from kvrig.containers.plan import UsageError

    with pytest.raises(column_choice.ChoiceError, match="--platform rocm --emulate gfx942"):
        column_choice.requested("rocm")
    choice = column_choice.requested("rocm", emulate="gfx1201")
    assert choice.column == "rocm-gfx1201-emulated"
    with pytest.raises(UsageError, match="a real rocm GPU's column is not built yet"):
        container_args.parse_args(["rocm"], {})


def test_the_mutation_check_reads_a_device_as_kvrig_emulated_names_it() -> None:
    from kvrig.publish import mutation_check

    assert mutation_check.emulated_device("9.0") == ("cuda", "9.0")
    assert mutation_check.emulated_device("rocm:gfx942") == ("rocm", "gfx942")
    assert mutation_check.emulated_device("gfx950") == ("rocm", "gfx950")
    assert gpus.device_parts("xpu:bmg") == ("xpu", "bmg")
    assert gpus.device_parts("gfx942:sramecc+:xnack-") == ("rocm", "gfx942:sramecc+:xnack-")
    assert emulation.target({"KVRIG_EMULATE": "rocm:gfx1201"}).arch == "gfx1201"
    opts = mutation_check.Options(emulate="rocm:gfx942")
    assert mutation_check.results_of(opts).name == "rocm-gfx942-emulated-mutation"
    command = mutation_check.column_command(opts, mutation_check.results_of(opts))
    assert command[command.index("--platform") + 1 : command.index("--platform") + 4] == [
        "rocm",
        "--emulate",
        "gfx942",
    ]
