"""Fingerprint parsers for GPUs and XPUs, fed with the tools' real output formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.host import hardware as hw


def test_nvidia_query_rows() -> None:
    out = "NVIDIA H100 80GB HBM3, 580.65.06, 9.0\nNVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"
    assert hw.parse_nvidia_query(out) == {
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_driver": "580.65.06",
        "gpu_compute_capability": "9.0",
        "gpu_count": 2,
    }


def test_nvidia_query_without_compute_capability() -> None:
    info = hw.parse_nvidia_query("NVIDIA L4, 550.54.15\n")
    assert info["gpu_name"] == "NVIDIA L4"
    assert info["gpu_compute_capability"] is None
    assert hw.parse_nvidia_query("") == {}


def test_cuda_version_from_the_banner() -> None:
    banner = "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0     |"
    assert hw.parse_cuda_version(banner) == "13.0"
    assert hw.parse_cuda_version("no banner") is None


def test_sycl_ls_level_zero_gpus() -> None:
    out = (
        "[opencl:cpu][opencl:0] Intel(R) OpenCL, Intel(R) Xeon(R) 3.0 [2025.20.8.0.06_160000]\n"
        "[level_zero:gpu][level_zero:0] Intel(R) oneAPI Unified Runtime over Level-Zero,"
        " Intel(R) Arc(TM) B580 Graphics 20.1.0 [1.6.33276]\n"
        "[level_zero:gpu][level_zero:1] Intel(R) oneAPI Unified Runtime over Level-Zero,"
        " Intel(R) Data Center GPU Max 1100 12.60.7 [1.3.29735]\n"
    )
    assert hw.parse_sycl_ls(out) == [
        {"name": "Intel(R) Arc(TM) B580 Graphics", "driver": "1.6.33276"},
        {"name": "Intel(R) Data Center GPU Max 1100", "driver": "1.3.29735"},
    ]


def test_intel_gpus_from_sysfs(tmp_path: Path) -> None:
    for node, vendor in (("renderD128", "0x8086"), ("renderD129", "0x10de")):
        dev = tmp_path / node / "device"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "device").write_text("0xe20b\n")
    drivers = tmp_path / "drivers" / "xe"
    drivers.mkdir(parents=True)
    (tmp_path / "renderD128" / "device" / "driver").symlink_to(drivers)
    assert hw.intel_gpus(tmp_path) == [
        {"node": "renderD128", "pci_device": "0xe20b", "kernel_driver": "xe"}
    ]


def test_oneapi_version_from_the_compiler_link(tmp_path: Path) -> None:
    (tmp_path / "compiler" / "2025.3").mkdir(parents=True)
    (tmp_path / "compiler" / "latest").symlink_to(tmp_path / "compiler" / "2025.3")
    assert hw.oneapi_version(tmp_path) == "2025.3"
    assert hw.oneapi_version(tmp_path / "missing-2025.2") == "2025.2"


def test_package_versions_reads_metadata_without_importing() -> None:
    found = hw.package_versions(("pydantic", "surely-not-installed-kvrig-pkg"))
    assert set(found) == {"pydantic"}
    assert found["pydantic"][0].isdigit()


# --- ROCm: rocminfo's agents and amd-smi's GPUs ----------------------------------------------

ROCMINFO = """\
ROCk module version 6.10.5 is loaded
==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD Ryzen 9 9950X 16-Core Processor
  Marketing Name:          AMD Ryzen 9 9950X 16-Core Processor
  Vendor Name:             CPU
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1201
  Uuid:                    GPU-2f6a8b1c3d4e5f60
  Marketing Name:          AMD Radeon AI PRO R9700
  Vendor Name:             AMD
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1201
*** Done ***
"""
AMD_SMI_LIST = "GPU: 0\n    BDF: 0000:03:00.0\n    UUID: 75ff7551-0000-1000-8000-000000000000\n"
AMD_SMI_ASIC = (
    "GPU: 0\n    ASIC:\n        MARKET_NAME: AMD Instinct MI355X\n"
    "        NUM_COMPUTE_UNITS: 256\n        TARGET_GRAPHICS_VERSION: gfx950\n"
)


def test_rocminfo_gpu_agents_are_named_by_their_gfx_target() -> None:
    assert hw.parse_rocminfo(ROCMINFO) == ["gfx1201"]  # not the CPU, not the ISA triple
    assert hw.parse_rocminfo(ROCMINFO.replace("gfx1201\n", "gfx942:sramecc+:xnack-\n")) == [
        "gfx942"
    ]
    cpu_only = ROCMINFO.split("*******\nAgent 2")[0]
    assert hw.parse_rocminfo(cpu_only) == []


def test_amd_smi_asic_names_the_target() -> None:
    assert hw.parse_amd_smi_asic(AMD_SMI_ASIC) == "gfx950"
    assert hw.parse_amd_smi_asic("GPU: 0\n    ASIC:\n        MARKET_NAME: N/A\n") is None


def answering(monkeypatch: pytest.MonkeyPatch, answers: dict[str, str]) -> list[str]:
    """Tools that answer these command lines (others are absent or fail); what was asked."""
    asked: list[str] = []

    def run(cmd: list[str], timeout: float = 10) -> str | None:
        asked.append(" ".join(cmd))
        return answers.get(" ".join(cmd))

    monkeypatch.setattr(hw, "_run", run)
    monkeypatch.delenv("KVRIG_PLATFORM", raising=False)
    return asked


def test_an_amd_gpu_is_rocm_after_nvidia_and_before_intel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw, "has_intel_xpu", lambda: True)
    answering(monkeypatch, {"amd-smi list": AMD_SMI_LIST})
    assert hw.detect_platform() == "rocm"
    answering(monkeypatch, {"rocminfo": ROCMINFO})
    assert hw.detect_platform() == "rocm"
    answering(monkeypatch, {"rocminfo": ROCMINFO, "nvidia-smi -L": "GPU 0: NVIDIA L4 (UUID: x)"})
    assert hw.detect_platform() == "cuda"
    answering(monkeypatch, {"rocminfo": ROCMINFO.split("*******\nAgent 2")[0]})
    assert hw.detect_platform() == "xpu"  # rocminfo that shows only the CPU is no AMD GPU


def test_the_gfx_target_is_in_the_fingerprint_when_a_tool_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hw, "intel_gpus", lambda: [])
    monkeypatch.delenv("ONEAPI_ROOT", raising=False)
    monkeypatch.setattr(hw, "oneapi_version", lambda: None)
    answering(monkeypatch, {"rocminfo": ROCMINFO})
    assert hw.gpu_info() == {"gpu_gfx_target": "gfx1201"}
    asked = answering(monkeypatch, {"amd-smi static --asic": AMD_SMI_ASIC})
    assert hw.gpu_info() == {"gpu_gfx_target": "gfx950"}
    assert asked.index("rocminfo") < asked.index("amd-smi static --asic")
    answering(monkeypatch, {})
    assert "gpu_gfx_target" not in hw.gpu_info()
