"""The CUDA platform of an emulated column: vLLM's own, with a fixed device.

`NonNvmlCudaPlatform` is the class vLLM uses where NVML is absent; only the device
queries it sends to torch are answered here, from the architecture the cell emulates
(fixed for the process, as a GPU is). Everything that decides a cell (the backend
priority list, each backend's validate_configuration, the kernel block sizes, the
block-size steps) stays vLLM's code, reading this capability.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from kvrig.run.emulation import target
from kvrig.run.emulation.answers import USER, DeviceAnswers
from kvrig.run.vllm_plugin.symbols import need

# vLLM's classes this platform is made of, named in every record if a release moves them.
NonNvmlCudaPlatform = need("vllm.platforms.cuda.NonNvmlCudaPlatform", USER)
DeviceCapability = need("vllm.platforms.interface.DeviceCapability", USER)

_DEVICE = target()
if _DEVICE is None or _DEVICE.capability is None:  # pragma: no cover - a misuse, said loud
    raise RuntimeError("kvrig's emulated CUDA platform was imported without KVRIG_EMULATE=cuda:*")
_MAJOR, _MINOR = _DEVICE.capability
# What torch.cuda would say of the device; backends that size their work by it (FlashInfer
# reads the multiprocessor count while a layer is built) get it without a driver.
PROPERTIES = SimpleNamespace(
    name=_DEVICE.name,
    major=_MAJOR,
    minor=_MINOR,
    total_memory=_DEVICE.memory_gib << 30,
    multi_processor_count=_DEVICE.sm_count,
    warp_size=32,
    max_threads_per_multi_processor=2048 if _MAJOR in (8, 9, 10) and _MINOR == 0 else 1536,
    is_integrated=False,
    is_multi_gpu_board=False,
    uuid="kvrig-emulated",
)


def get_device_properties(device: Any = None) -> SimpleNamespace:
    return PROPERTIES


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return _MAJOR, _MINOR


def get_device_name(device: Any = None) -> str:
    return _DEVICE.name


# torch.cuda's device queries, answered for the one emulated device; torch.cuda itself
# stays unavailable (is_available() is False), so no kernel can start.
torch.cuda.get_device_properties = get_device_properties  # type: ignore[assignment]
torch.cuda.get_device_capability = get_device_capability  # type: ignore[assignment]
torch.cuda.get_device_name = get_device_name  # type: ignore[assignment]


class EmulatedCudaPlatform(DeviceAnswers, NonNvmlCudaPlatform):
    device = _DEVICE

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(major=_MAJOR, minor=_MINOR)

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return True
