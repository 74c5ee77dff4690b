"""The GPU architectures a CUDA, XPU or ROCm cell's outcome can depend on, and their names.

vLLM's CUDA code picks attention backends, validates them and chooses prefill kernels by
compute capability, so one CUDA expectation can be right on an H100 and wrong on an A100.
The matrix therefore keys per-architecture expectations by these names, the emulated
columns fake exactly these devices, and a real CUDA runner reads its own capability into
the same key. XPU code reads no architecture for these choices (only the device name,
for an A770's bfloat16 refusal), so it has one emulated device. vLLM's ROCm code reads
the gfx target (`_GCN_ARCH`): its backend order differs on RDNA4 (gfx1201) from the
Instinct boards (gfx942, gfx950), and AITER's kernels need CDNA 3 or newer.

Pure: names in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    """One architecture as vLLM sees it: what `get_device_capability()` (or, on XPU, the
    device name) answers, and what the emulated device reports beside it."""

    platform: str
    # "9.0" (a CUDA compute capability), "bmg" (an Intel GPU family) or "gfx942" (an AMD
    # gfx target, as amd-smi and rocminfo print it without its features)
    arch: str
    label: str  # the column's part: sm90, bmg, gfx942
    name: str  # what get_device_name() answers on the emulated device
    memory_gib: int
    examples: str  # the boards users run it as
    # Streaming multiprocessors (CUDA) or compute units (ROCm), which some kernels size by
    sm_count: int = 0

    @property
    def capability(self) -> tuple[int, int] | None:
        if self.platform != "cuda":
            return None
        major, minor = self.arch.split(".")
        return int(major), int(minor)


CUDA_GPUS: dict[str, Gpu] = {
    g.arch: g
    for g in (
        Gpu("cuda", "8.0", "sm80", "NVIDIA A100-SXM4-80GB", 80, "A100", 108),
        Gpu("cuda", "8.6", "sm86", "NVIDIA A10G", 24, "A10G, A10, A40, RTX A6000, RTX 3090", 80),
        Gpu("cuda", "8.9", "sm89", "NVIDIA L40S", 48, "L40S, L4", 142),
        Gpu("cuda", "9.0", "sm90", "NVIDIA H100 80GB HBM3", 80, "H100, H200", 132),
        Gpu("cuda", "10.0", "sm100", "NVIDIA B200", 180, "B200", 148),
        Gpu(
            "cuda",
            "12.0",
            "sm120",
            "NVIDIA RTX PRO 6000 Blackwell",
            96,
            "RTX PRO 6000, RTX 5090",
            188,
        ),
    )
}
XPU_GPUS: dict[str, Gpu] = {
    "bmg": Gpu(
        "xpu", "bmg", "bmg", "Intel(R) Arc(TM) Pro B60 Graphics", 24, "Arc Pro B60, Arc B580"
    ),
}
# One board per gfx target whose choices vLLM's ROCm code can tell apart. `name` is what
# RocmPlatform.get_device_name answers on the board (its _ROCM_DEVICE_ID_NAME_MAP by PCI
# id, else amd-smi's market name); `sm_count` holds the compute units.
ROCM_GPUS: dict[str, Gpu] = {
    g.arch: g
    for g in (
        Gpu("rocm", "gfx942", "gfx942", "AMD_Instinct_MI300X", 192, "MI300X, MI325X", 304),
        Gpu("rocm", "gfx950", "gfx950", "AMD Instinct MI355X", 288, "MI355X, MI350X", 256),
        Gpu("rocm", "gfx1201", "gfx1201", "AMD_Radeon_R9700", 32, "Radeon AI PRO R9700", 64),
    )
}
GPUS: dict[str, dict[str, Gpu]] = {"cuda": CUDA_GPUS, "xpu": XPU_GPUS, "rocm": ROCM_GPUS}
# The platforms whose emulated columns the matrix holds.
EMULATED_PLATFORMS = ("cuda", "xpu", "rocm")
# The architectures `nox -s emulated` runs, in order.
EMULATED = (*((p, a) for p in EMULATED_PLATFORMS for a in GPUS[p]),)


class GpuError(ValueError):
    """A GPU architecture kvrig does not know; one paragraph for the user."""


_SM = re.compile(r"^sm_?(\d+?)(\d)$")


def normalize(platform: str, arch: str) -> str:
    """An architecture as the matrix keys it: "9.0" for "sm90", "sm_90" or "9.0"; "gfx942"
    for the "gfx942:sramecc+:xnack-" torch's gcnArchName reports on ROCm."""
    text = arch.strip().lower()
    if platform == "rocm":
        return text.split(":", 1)[0]
    if platform == "cuda":
        m = _SM.match(text)
        if m:
            text = f"{int(m.group(1))}.{m.group(2)}"
        elif re.fullmatch(r"\d+", text):
            text = f"{text}.0"
    return text


def gpu(platform: str, arch: str) -> Gpu:
    """The known architecture `arch` names on `platform`, or GpuError saying which exist."""
    known = GPUS.get(platform)
    if not known:
        raise GpuError(
            f"The {platform} platform has no GPU architecture to emulate; kvrig knows the"
            f" architectures of {', '.join(GPUS)}."
        )
    key = normalize(platform, arch)
    if key not in known:
        listed = ", ".join(f"{g.arch} ({g.label}: {g.examples})" for g in known.values())
        raise GpuError(
            f"{arch!r} is not a {platform} architecture kvrig knows; give one of {listed}."
        )
    return known[key]


# How messages name each platform.
TITLES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "rocm": "ROCm"}


def device_parts(text: str) -> tuple[str, str]:
    """The (platform, architecture) a device is written as: `cuda:9.0`, `xpu:bmg`,
    `rocm:gfx942` (KVRIG_EMULATE, `--only`), or a bare CUDA or ROCm architecture (9.0,
    gfx942), whose platform it tells by itself."""
    head, colon, tail = text.partition(":")
    if colon and head in GPUS:
        return head, tail
    return arch_platform(text), text  # gfx942:sramecc+:xnack- is a bare target too


# The platforms whose expectations a case refines per architecture (`expect_by_arch`):
# CUDA by compute capability, ROCm by gfx target; XPU's code reads none.
ARCH_KEYED = ("cuda", "rocm")


def arch_platform(arch: str) -> str:
    """Whose architecture an `expect_by_arch` key names: a gfx target is ROCm's, the rest
    (9.0, sm90) CUDA's."""
    return "rocm" if arch.strip().lower().startswith("gfx") else "cuda"


# The platforms whose real devices' columns carry the architecture (cuda-sm90,
# rocm-gfx942): vLLM's XPU code reads no architecture for the choices the matrix checks.
BY_ARCH = ("cuda", "rocm")
# Where the host's facts (kvrig.host.hardware.gpu_info, and every record's `host`) hold the
# architecture of its GPU on each of them: nvidia-smi's compute capability, the gfx target
# rocminfo or amd-smi names.
HOST_ARCH_KEY = {"cuda": "gpu_compute_capability", "rocm": "gpu_gfx_target"}
# The tools that answer it there (kvrig.host.hardware.gpu_info).
HOST_ARCH_TOOLS = {"cuda": "nvidia-smi", "rocm": "rocminfo and amd-smi"}
# What a device's architecture is called in messages.
ARCH_WORD = {"cuda": "compute capability", "rocm": "gfx target"}


def device_column(platform: str, arch: str) -> str:
    """A real GPU's results column: `cuda-sm90` for a compute capability 9.0 device,
    `rocm-gfx942` for an MI300X."""
    return f"{platform}-{gpu(platform, arch).label}"


def emulated_column(platform: str, arch: str) -> str:
    """The results column of an emulated device: `cuda-sm90-emulated`, `xpu-bmg-emulated`,
    named so that nobody takes its results for a real GPU's."""
    return f"{platform}-{gpu(platform, arch).label}-emulated"


def chosen_devices(only: list[str] | None) -> list[tuple[str, str]]:
    """The emulated devices `--only` names (a device, cuda:9.0, or a platform, rocm), in
    EMULATED's order; all of them without it. GpuError names what it does not know."""
    known = [f"{p}:{a}" for p, a in EMULATED]
    unknown = [o for o in only or [] if o not in known and o not in EMULATED_PLATFORMS]
    if unknown:
        raise GpuError(
            f"--only {', '.join(unknown)}: not an emulated device; give one of"
            f" {', '.join(known)} (or a platform: {', '.join(EMULATED_PLATFORMS)})."
        )
    return [(p, a) for p, a in EMULATED if not only or f"{p}:{a}" in only or p in only]


def emulated_columns() -> list[str]:
    return [emulated_column(p, a) for p, a in EMULATED]
