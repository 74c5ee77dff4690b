"""Which column a run is: its platform, the CPU class its cells follow, the GPU it fakes.

`kvrig column` asks before pytest starts (to name the results folder and refuse at once),
kvrig's pytest plugin when pytest is started on a matrix directly, `kvrig cells` to list a
column, and `kvrig container` to name the host's results folder. Deciding it here alone
means a column is named, and refused, the same way on every path; each caller turns
ChoiceError into its own exit (exit 2, pytest's usage error).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

from kvrig.define import gpus
from kvrig.define.column_names import Column
from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import hardware, isa


class ChoiceError(Exception):
    """A column this host cannot run, or that cannot exist; one paragraph."""


@dataclass(frozen=True)
class Choice:
    platform: str
    # The CPU class the cells follow: the host's own (emulated False) or a lesser one
    # (emulated True); None off the CPU, and for a class named without a host to read.
    isa: str | None = None
    emulated: bool = False
    # The GPU architecture an emulated device fakes (None: real hardware).
    device: str | None = None
    # A real CUDA or ROCm device's architecture, which names its column (cuda-sm90,
    # rocm-gfx942) and picks its expectations; None off those, and for a column named
    # without a host to read.
    arch: str | None = None

    @property
    def column(self) -> str:
        return Column(
            self.platform,
            isa=self.isa if self.emulated else None,
            gpu_arch=self.device or self.arch,
            device_emulated=self.device is not None,
        ).name


class Host(Protocol):
    """The facts of the host a choice reads."""

    @property
    def platform(self) -> str: ...
    @property
    def flags(self) -> set[str]: ...
    @property
    def arch(self) -> str: ...
    @property
    def gpu_arch(self) -> str | None: ...


class ThisHost:
    """This host, each fact probed when first read (nvidia-smi, amd-smi or rocminfo only
    when a choice needs the platform)."""

    @functools.cached_property
    def platform(self) -> str:
        return hardware.detect_platform()

    @functools.cached_property
    def flags(self) -> set[str]:
        return hardware.cpu_flags()

    @functools.cached_property
    def arch(self) -> str:
        return str(hardware.cpu_info()["arch"])

    @functools.cached_property
    def gpu_arch(self) -> str | None:
        key = gpus.HOST_ARCH_KEY.get(self.platform)
        return hardware.gpu_info().get(key) if key else None


def requested(
    platform: str | None,
    cls: str = isa.NATIVE,
    emulate: str | None = None,
    gpu_arch: str | None = None,
) -> Choice:
    """The column a command line names, checked as far as no host is needed: a known CPU
    class on the CPU only, a known GPU architecture on a GPU platform only. A named class
    is emulated (the host's own is `native`); platform None is every platform's cells;
    `gpu_arch` the real CUDA or ROCm device's architecture the column is for (--gpu-arch)."""
    if platform is not None and platform not in PLATFORMS:
        raise ChoiceError(
            f"Unknown platform {platform!r}; kvrig knows {', '.join(PLATFORMS)}"
            " (KVRIG_PLATFORM, if set, overrides the host probe and must name one too)."
        )
    if gpu_arch:
        return _device(platform, cls, emulate, gpu_arch)
    if emulate:
        return _emulated(platform, cls, emulate)
    if cls == isa.NATIVE:
        return Choice(platform or "cpu")
    if platform not in (None, "cpu"):
        raise ChoiceError(
            f"--isa {cls} names a CPU class, and the {platform} column has none; leave it out."
        )
    try:
        isa.check_known(cls)
    except isa.IsaError as exc:
        raise ChoiceError(str(exc)) from None
    return Choice("cpu", cls, emulated=True)


def _emulated(platform: str | None, cls: str, emulate: str) -> Choice:
    """An emulated GPU's column: a known architecture of a GPU platform, no CPU class."""
    if platform not in gpus.GPUS:
        raise ChoiceError(
            f"--emulate fakes a GPU ({emulate}), so name its platform: --platform cuda,"
            " --platform xpu or --platform rocm (pytest: --kvrig-platform). The cpu column"
            " runs on this host's own CPU, and --isa emulates a lesser CPU class."
        )
    if cls != isa.NATIVE:
        raise ChoiceError(f"--isa names a CPU class, and an emulated {platform} device has none.")
    try:
        device = gpus.gpu(platform, emulate)
    except gpus.GpuError as exc:
        raise ChoiceError(str(exc)) from None
    return Choice(platform, device=device.arch)


def _device(platform: str | None, cls: str, emulate: str | None, gpu_arch: str) -> Choice:
    """A real CUDA or ROCm device's column, named by its architecture."""
    if platform not in gpus.BY_ARCH or emulate or cls != isa.NATIVE:
        raise ChoiceError(
            f"--gpu-arch {gpu_arch} names the architecture of a real CUDA or ROCm GPU, the"
            " column's device (cuda-sm90 for 9.0, rocm-gfx942 for gfx942): give it with"
            " --platform cuda or --platform rocm only, without --isa or --emulate (an"
            " emulated device's architecture is --emulate's)."
        )
    try:
        device = gpus.gpu(platform, gpu_arch)
    except gpus.GpuError as exc:
        raise ChoiceError(
            f"{exc} kvrig's {gpus.TITLES[platform]} expectations are kept per architecture,"
            " each confirmed by its emulated column; an architecture it does not list needs"
            " an entry in kvrig.define.gpus and its emulated column green before its runners"
            " can gate."
        ) from None
    return Choice(platform, arch=device.arch)


# How each platform's driver is asked for the GPU's architecture, for a host that does
# not answer.
_ARCH_UNREAD = {
    "cuda": (
        "nvidia-smi does not say this GPU's compute capability (`nvidia-smi"
        " --query-gpu=compute_cap` answers none), and kvrig's CUDA column is kept per"
        " architecture. Install a driver that answers it (every driver vLLM's CUDA builds"
        " need does), and check the GPU is visible to this process."
    ),
    "rocm": (
        "Neither rocminfo nor amd-smi says this GPU's gfx target (rocminfo lists no gfx"
        " agent, `amd-smi static --asic` no TARGET_GRAPHICS_VERSION), and kvrig's ROCm"
        " column is kept per gfx target. Check the amdgpu driver and ROCm with `rocminfo`,"
        " and that this user may open /dev/kfd (the video and render groups)."
    ),
}
# The runner label that names each platform's architecture (docs/gating.md).
_LABEL = {"cuda": "sm label (sm90)", "rocm": "gfx label (gfx942)"}


def _on_device(named: Choice, label: str | None, host: Host) -> Choice:
    """A CUDA or ROCm column on this host's GPU: its architecture names the column, and
    one named (--gpu-arch, from the runner's label) must be the GPU's."""
    seen = host.gpu_arch
    if seen is None:
        raise ChoiceError(_ARCH_UNREAD[named.platform])
    device = _device(named.platform, isa.NATIVE, None, seen)
    if label is not None and gpus.normalize(named.platform, label) != device.arch:
        word = gpus.ARCH_WORD[named.platform]
        raise ChoiceError(
            f"This host's GPU has {word} {device.arch}, and the column was asked"
            f" for {gpus.normalize(named.platform, label)} (--gpu-arch, from the runner's"
            " labels in CI): the runner is labelled for another GPU. Fix the runner's labels"
            f" (one {_LABEL[named.platform]} per architecture, docs/gating.md), or run"
            " without --gpu-arch to take the GPU's own."
        )
    return device


# What each hardware column needs of the host, for a host that lacks it.
_NEEDS = {
    "cuda": "an NVIDIA GPU (nvidia-smi lists none here)",
    "xpu": "an Intel XPU (no render node in /dev/dri answering xpu-smi or sycl-ls here)",
    "rocm": "an AMD GPU (neither amd-smi nor rocminfo lists one here)",
}


def choose(
    platform: str | None,
    cls: str = isa.NATIVE,
    emulate: str | None = None,
    host: Host | None = None,
    gpu_arch: str | None = None,
) -> Choice:
    """The column to run on this host: the host's platform unless one is named, a
    hardware platform only where its device is (on CUDA and ROCm, named by the GPU's
    architecture, which `gpu_arch` must match when given), the CPU class resolved against
    the host's flags (its own, or a lesser one it can emulate)."""
    host = host or ThisHost()
    platform = platform or host.platform
    named = requested(platform, cls, emulate, gpu_arch)
    if emulate:
        return named
    if platform != "cpu":
        if platform != host.platform:
            needs = _NEEDS[platform]
            raise ChoiceError(
                f"The {platform} column needs {needs}, and this host offers only"
                f" {host.platform}. Run the {host.platform} column here (nox -s local), or"
                f" run nox -s {platform} on a host that has the hardware."
            )
        return _on_device(named, gpu_arch, host) if platform in gpus.BY_ARCH else named
    try:
        found, emulated = isa.resolve(cls, host.flags, host.arch)
    except isa.IsaError as exc:
        raise ChoiceError(str(exc)) from None
    return Choice("cpu", found, emulated)
