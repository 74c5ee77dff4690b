"""Fingerprint parsers for GPUs and XPUs, fed with the tools' real output formats."""

from __future__ import annotations

from pathlib import Path

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
