"""How the matrix names the GPU architectures a cell's outcome can depend on: columns,
`--only` devices and `expect_by_arch` keys (the GPUs themselves: kvrig.facts.gpus).

vLLM's CUDA code picks and validates attention backends and prefill kernels by compute
capability, and its ROCm code reads the gfx target (`_GCN_ARCH`), so one expectation can
be right on one GPU and wrong on another. Per-architecture expectations, the emulated
columns and a real runner's column all key by these names. XPU's code reads only the
device name, so it has one emulated device.

Pure: names in, facts out.
"""

from __future__ import annotations

from kvrig.facts.gpus import CUDA_GPUS, GPUS, ROCM_GPUS, XPU_GPUS, Gpu, parse_capability
from kvrig.facts.platforms import PLATFORMS

__all__ = ["CUDA_GPUS", "GPUS", "ROCM_GPUS", "XPU_GPUS", "Gpu"]  # the records, named here too

# The platforms whose emulated columns the matrix holds.
EMULATED_PLATFORMS = tuple(p.name for p in PLATFORMS.values() if p.emulated)
# The architectures `nox -s emulated` runs, in order.
EMULATED = (*((p, a) for p in EMULATED_PLATFORMS for a in GPUS[p]),)


class GpuError(ValueError):
    """A GPU architecture kvrig does not know; one paragraph for the user."""


def normalize(platform: str, arch: str) -> str:
    """An architecture as the matrix keys it: "9.0" for "sm90", "sm_90" or "9.0"; "gfx942"
    for the "gfx942:sramecc+:xnack-" torch's gcnArchName reports on ROCm."""
    text = arch.strip().lower()
    if platform == "rocm":
        return text.split(":", 1)[0]
    if platform == "cuda":
        cc = parse_capability(text)
        if cc is not None:
            return f"{cc[0]}.{cc[1]}"
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
TITLES = {p.name: p.title for p in PLATFORMS.values()}


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
ARCH_KEYED = tuple(p.name for p in PLATFORMS.values() if p.arch_word)


def arch_platform(arch: str) -> str:
    """Whose architecture an `expect_by_arch` key names: a gfx target is ROCm's, the rest
    (9.0, sm90) CUDA's."""
    return "rocm" if arch.strip().lower().startswith("gfx") else "cuda"


# The platforms whose real devices' columns carry the architecture (cuda-sm90,
# rocm-gfx942): vLLM's XPU code reads no architecture for the choices the matrix checks.
BY_ARCH = ARCH_KEYED
# Where the host's facts (kvrig.host.hardware.gpu_info, and every record's `host`) hold the
# architecture of its GPU on each of them, the tools that answer it there, and what it is
# called in messages.
HOST_ARCH_KEY = {p.name: p.host_arch_key for p in PLATFORMS.values() if p.host_arch_key}
HOST_ARCH_TOOLS = {p.name: p.host_arch_tools for p in PLATFORMS.values() if p.host_arch_tools}
ARCH_WORD = {p.name: p.arch_word for p in PLATFORMS.values() if p.arch_word}


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
