"""A column's name, made and read in one place.

Cell ids, results folders, the gate's required columns and the report's headings are all
built on these names (`cpu-avx2`, `cuda-sm90`, `cuda-sm90-emulated`), so they are parsed
here and nowhere else. A CUDA column carries the architecture because vLLM's CUDA code
picks backends and prefill kernels by compute capability: two architectures' runs of one
case are two cells.

Pure: names in, names out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrig.define import gpus
from kvrig.define.paths import column_name
from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import isa

BY_ARCH = gpus.BY_ARCH
# The platforms with a hardware column (a host's, or a container's with the device passed
# in): every one.
HARDWARE_PLATFORMS = PLATFORMS


@dataclass(frozen=True)
class Column:
    """What a column's name says: the platform, the CPU class the rig emulated, the GPU
    architecture, and whether that GPU is emulated."""

    platform: str
    isa: str | None = None
    gpu_arch: str | None = None
    device_emulated: bool = False

    @property
    def name(self) -> str:
        if self.gpu_arch and self.device_emulated:
            return gpus.emulated_column(self.platform, self.gpu_arch)
        if self.gpu_arch and self.platform in BY_ARCH:
            return gpus.device_column(self.platform, self.gpu_arch)
        return column_name(self.platform, self.isa)


def device_columns(platform: str) -> list[str]:
    """Every real device column kvrig knows on `platform` (none off BY_ARCH)."""
    if platform not in BY_ARCH:
        return []
    return [gpus.device_column(platform, a) for a in gpus.GPUS[platform]]


def parse(name: str) -> Column | None:
    """The column `name` is, or None for a name that is no column (a side run's folder)."""
    for platform, arch in gpus.EMULATED:
        if name == gpus.emulated_column(platform, arch):
            return Column(platform, gpu_arch=arch, device_emulated=True)
    for platform in BY_ARCH:
        for arch in gpus.GPUS[platform]:
            if name == gpus.device_column(platform, arch):
                return Column(platform, gpu_arch=arch)
    if name in HARDWARE_PLATFORMS:
        return Column(name)
    platform, _, cls = name.partition("-")
    if platform == "cpu" and cls in isa.CLASSES:
        return Column("cpu", isa=cls)
    return None


def platform_columns(platform: str) -> list[str]:
    """A platform's hardware columns, its CPU classes aside: `cuda-sm80` ... `cuda-sm120`
    on CUDA, `rocm-gfx942` ... on ROCm (a device's column always carries its
    architecture), the platform elsewhere."""
    return device_columns(platform) or [platform]


def hardware_columns() -> list[str]:
    """The columns whose results are hardware's: what the release gate reads."""
    out = [c for platform in HARDWARE_PLATFORMS for c in platform_columns(platform)]
    return [*out, *(f"cpu-{cls}" for cls in isa.CLASSES)]


def columns() -> list[str]:
    """Every column a results folder can hold: hardware's and the emulated devices'."""
    return [*hardware_columns(), *gpus.emulated_columns()]
