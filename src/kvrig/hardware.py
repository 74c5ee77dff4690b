"""Which platform this host is, and a fingerprint of it for every record.

Block sizes depend on the host: the SSM state dtype follows avx512_bf16, CPU MLA follows
AMX, and kernels differ per GPU generation. A record without the fingerprint cannot be
compared with another host's, so every record carries one.
"""

from __future__ import annotations

import functools
import os
import platform as _platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
             "amx_bf16", "amx_int8", "amx_fp16", "sve", "asimd")


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


def detect_platform() -> str:
    """cuda if nvidia-smi lists a GPU, xpu if an Intel GPU answers, else cpu.

    KVRIG_PLATFORM overrides it, for a CI job that knows better than probing.
    """
    forced = os.environ.get("KVRIG_PLATFORM")
    if forced:
        return forced
    if has_nvidia_gpu():
        return "cuda"
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
    }


def gpu_info() -> dict[str, Any]:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    info: dict[str, Any] = {}
    if out:
        first = out.splitlines()[0].split(",")
        info["gpu_name"] = first[0].strip()
        info["gpu_driver"] = first[1].strip() if len(first) > 1 else None
        info["gpu_count"] = len(out.splitlines())
        smi = _run(["nvidia-smi"]) or ""
        for token in smi.split("CUDA Version:")[1:2]:
            info["cuda_version"] = token.split()[0]
    xpu = _run(["xpu-smi", "discovery", "--dump", "1,2,4"])
    if xpu:
        info["xpu"] = xpu.splitlines()[1:3]
    sycl = _run(["sycl-ls"])
    if sycl:
        info["sycl_devices"] = [ln for ln in sycl.splitlines() if "level_zero" in ln][:4]
    oneapi = os.environ.get("ONEAPI_ROOT")
    if oneapi:
        info["oneapi_root"] = oneapi
    return info


@functools.cache
def fingerprint() -> dict[str, Any]:
    """The host facts a record needs; cached because they do not change within a run."""
    fp: dict[str, Any] = {"hostname": _platform.node(), "python": _platform.python_version()}
    fp.update(cpu_info())
    fp.update(gpu_info())
    for env, key in (("KVRIG_IMAGE", "image"), ("KVRIG_IMAGE_DIGEST", "image_digest")):
        if os.environ.get(env):
            fp[key] = os.environ[env]
    return fp
