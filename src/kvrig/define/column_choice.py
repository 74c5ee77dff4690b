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
from kvrig.define.matrix import PLATFORMS
from kvrig.define.paths import column_name
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

    @property
    def column(self) -> str:
        if self.device:
            return gpus.emulated_column(self.platform, self.device)
        return column_name(self.platform, self.isa if self.emulated else None)


class Host(Protocol):
    """The facts of the host a choice reads."""

    @property
    def platform(self) -> str: ...
    @property
    def flags(self) -> set[str]: ...
    @property
    def arch(self) -> str: ...


class ThisHost:
    """This host, each fact probed when first read (nvidia-smi only when a choice needs
    the platform)."""

    @functools.cached_property
    def platform(self) -> str:
        return hardware.detect_platform()

    @functools.cached_property
    def flags(self) -> set[str]:
        return hardware.cpu_flags()

    @functools.cached_property
    def arch(self) -> str:
        return str(hardware.cpu_info()["arch"])


def requested(platform: str | None, cls: str = isa.NATIVE, emulate: str | None = None) -> Choice:
    """The column a command line names, checked as far as no host is needed: a known CPU
    class on the CPU only, a known GPU architecture on a GPU platform only. A named class
    is emulated (the host's own is `native`); platform None is every platform's cells."""
    if platform is not None and platform not in PLATFORMS:
        raise ChoiceError(
            f"Unknown platform {platform!r}; kvrig knows {', '.join(PLATFORMS)}"
            " (KVRIG_PLATFORM, if set, overrides the host probe and must name one too)."
        )
    if emulate:
        if platform not in gpus.GPUS:
            raise ChoiceError(
                f"--emulate fakes a GPU ({emulate}), so name its platform: --platform cuda or"
                " --platform xpu (pytest: --kvrig-platform). The cpu column runs on this"
                " host's own CPU, and --isa emulates a lesser CPU class."
            )
        if cls != isa.NATIVE:
            raise ChoiceError(
                f"--isa names a CPU class, and an emulated {platform} device has none."
            )
        try:
            device = gpus.gpu(platform, emulate)
        except gpus.GpuError as exc:
            raise ChoiceError(str(exc)) from None
        return Choice(platform, device=device.arch)
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


def choose(
    platform: str | None,
    cls: str = isa.NATIVE,
    emulate: str | None = None,
    host: Host | None = None,
) -> Choice:
    """The column to run on this host: the host's platform unless one is named, a
    hardware platform only where its device is, the CPU class resolved against the
    host's flags (its own, or a lesser one it can emulate)."""
    host = host or ThisHost()
    platform = platform or host.platform
    named = requested(platform, cls, emulate)
    if emulate:
        return named
    if platform != "cpu":
        if platform != host.platform:
            needs = (
                "an NVIDIA GPU (nvidia-smi lists none here)"
                if platform == "cuda"
                else "an Intel XPU (no render node in /dev/dri answering xpu-smi or sycl-ls here)"
            )
            raise ChoiceError(
                f"The {platform} column needs {needs}, and this host offers only"
                f" {host.platform}. Run the {host.platform} column here (nox -s local), or"
                f" run nox -s {platform} on a host that has the hardware."
            )
        return named
    try:
        found, emulated = isa.resolve(cls, host.flags, host.arch)
    except isa.IsaError as exc:
        raise ChoiceError(str(exc)) from None
    return Choice("cpu", found, emulated)
