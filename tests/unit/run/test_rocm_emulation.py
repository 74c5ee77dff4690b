"""The emulated ROCm device's own logic: the gfx targets it fakes and what it answers for
them, the plugin's switch, the cell's environment, the record's fakes and the `aiter`
stand-in (no vLLM: vLLM's RocmPlatform itself runs in the emulated columns)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from kvrig.define import gpus
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


def test_rocm_columns_wait_for_the_matrix_s_rocm_platform() -> None:
    """Phase 1: the devices emulate, but `nox -s emulated` runs only the matrix's columns."""
    assert "rocm" not in gpus.EMULATED_PLATFORMS
    assert not [c for c in gpus.emulated_columns() if c.startswith("rocm")]


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
