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
from kvrig.facts.gpus import gfx_capability
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


def test_rocm_s_columns_emulated_and_real_are_named_by_gfx_target() -> None:
    assert [c for c in gpus.emulated_columns() if c.startswith("rocm")] == [
        "rocm-gfx942-emulated",
        "rocm-gfx950-emulated",
        "rocm-gfx1201-emulated",
    ]
    # The gate reads the real ones as hardware, never the emulated ones.
    hardware = column_names.hardware_columns()
    assert [c for c in hardware if c.startswith("rocm")] == [
        "rocm-gfx942",
        "rocm-gfx950",
        "rocm-gfx1201",
    ]
    assert not [c for c in hardware if c.endswith("-emulated")]
    assert column_names.parse("rocm-gfx950") == column_names.Column("rocm", gpu_arch="gfx950")


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
    assert (props.major, props.minor) == gfx_capability(arch) == capability
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


AITER_ON = {rocm.AITER_ENV: "1", "VLLM_ROCM_USE_AITER": "1"}


def _rocm_only(**case: Any) -> dict[str, Any]:
    data = _rocm_matrix(**case)
    data["cases"][0]["expect"] = {"rocm": {"outcome": "runs"}}
    return data


def test_a_case_with_aiter_on_reaches_the_engine_and_the_rules_alike(tmp_path: Any) -> None:
    from kvrig.define.cells import expand
    from kvrig.define.matrix import Matrix
    from kvrig.rules import blocksize

    matrix = Matrix.model_validate(_rocm_only(env=AITER_ON))
    cells = {
        arch: expand(matrix, "rocm", gpu_arch=arch, device_emulated=True)[0]
        for arch in gpus.ROCM_GPUS
    }
    for arch, cell in cells.items():
        assert cell.env["VLLM_ROCM_USE_AITER"] == "1"
        env = cellmod.cell_env(cell, tmp_path, base={})
        assert env[rocm.AITER_ENV] == "1" and env["VLLM_ROCM_USE_AITER"] == "1"
        chosen = blocksize.layer_backends(cell, cell.config)[0].name
        assert chosen == ("ROCM_AITER_UNIFIED_ATTN" if arch == "gfx1201" else "ROCM_ATTN")
    # Without the case's env, gfx1201 keeps 0.34.0's TRITON_ATTN.
    plain = expand(Matrix.model_validate(_rocm_only()), "rocm", gpu_arch="gfx1201")[0]
    assert blocksize.layer_backends(plain, plain.config)[0].name == "TRITON_ATTN"


def test_a_case_sets_only_rocm_s_aiter_switches_and_on_rocm_only() -> None:
    from kvrig.define.matrix import Matrix

    with pytest.raises(ValueError, match="VLLM_ATTENTION_BACKEND: a case sets only the variables"):
        Matrix.model_validate(_rocm_only(env={"VLLM_ATTENTION_BACKEND": "X"}))
    with pytest.raises(ValueError, match="the case expects on cuda too"):
        Matrix.model_validate(_rocm_matrix(env=AITER_ON))


def test_a_real_rocm_column_is_named_by_the_gpu_s_gfx_target() -> None:
    from kvrig.containers import args as container_args
    from kvrig.containers.plan import UsageError

    host = SimpleNamespace(platform="rocm", flags=set(), arch="x86_64", gpu_arch="gfx942")
    assert column_choice.choose("rocm", host=host).column == "rocm-gfx942"
    assert column_choice.choose("rocm", host=host, gpu_arch="gfx942").column == "rocm-gfx942"
    with pytest.raises(column_choice.ChoiceError, match=r"gfx target gfx942.*asked for gfx950"):
        column_choice.choose("rocm", host=host, gpu_arch="gfx950")
    unread = SimpleNamespace(platform="rocm", flags=set(), arch="x86_64", gpu_arch=None)
    with pytest.raises(column_choice.ChoiceError, match="Neither rocminfo nor amd-smi"):
        column_choice.choose("rocm", host=unread)
    cpu_host = SimpleNamespace(platform="cpu", flags=set(), arch="x86_64", gpu_arch=None)
    with pytest.raises(column_choice.ChoiceError, match="needs an AMD GPU"):
        column_choice.choose("rocm", host=cpu_host)
    choice = column_choice.requested("rocm", emulate="gfx1201")
    assert choice.column == "rocm-gfx1201-emulated"
    assert container_args.parse_args(["rocm", "--gpu-arch", "gfx942"], {}).gpu_arch == "gfx942"
    with pytest.raises(UsageError, match="serves only CUDA's build of vLLM"):
        container_args.parse_args(["rocm", "--from-wheels"], {})
    with pytest.raises(UsageError, match="the xpu column has none"):
        container_args.parse_args(["xpu", "--gpu-arch", "gfx942"], {})


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
