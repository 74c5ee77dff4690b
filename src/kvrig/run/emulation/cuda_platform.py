"""The CUDA platform of an emulated column: vLLM's own, with the device answered.

`NonNvmlCudaPlatform` is the class vLLM uses where NVML is absent; only the device
queries it sends to torch are answered here, from the architecture the process emulates,
read when asked (kvrig.run.emulation.chosen: the CUDA parent serves every architecture,
each cell forked from it takes on its own). Everything that decides a cell (the backend
priority list, each backend's validate_configuration, the kernel block sizes, the
block-size steps) stays vLLM's code, reading this capability.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch

from kvrig.define.gpus import Gpu
from kvrig.run.emulation import chosen, emulated_platform
from kvrig.run.emulation.answers import USER, DeviceAnswers
from kvrig.run.vllm_plugin.symbols import need

# vLLM's classes this platform is made of, named in every record if a release moves them.
NonNvmlCudaPlatform = need("vllm.platforms.cuda.NonNvmlCudaPlatform", USER)
DeviceCapability = need("vllm.platforms.interface.DeviceCapability", USER)

if emulated_platform() != "cuda":  # pragma: no cover - a misuse, said loud
    raise RuntimeError("kvrig's emulated CUDA platform was imported without KVRIG_EMULATE=cuda")


@functools.cache
def properties(device: Gpu) -> SimpleNamespace:
    """What torch.cuda would say of the device (one per device: a cache keyed by it is
    never another architecture's); backends that size their work by it (FlashInfer reads
    the multiprocessor count while a layer is built) get it without a driver."""
    return SimpleNamespace(**device.torch_properties())


def capability(device: Gpu) -> tuple[int, int]:
    assert device.capability is not None, f"{device.arch} is not a CUDA architecture"
    return device.capability


def get_device_properties(device: Any = None) -> SimpleNamespace:
    return properties(chosen.device())


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return capability(chosen.device())


def get_device_name(device: Any = None) -> str:
    return chosen.device().name


# torch.cuda's device queries, answered for the emulated device; torch.cuda itself stays
# unavailable (is_available() is False), so no kernel can start.
torch.cuda.get_device_properties = get_device_properties  # type: ignore[assignment]
torch.cuda.get_device_capability = get_device_capability  # type: ignore[assignment]
torch.cuda.get_device_name = get_device_name  # type: ignore[assignment]


class EmulatedCudaPlatform(DeviceAnswers, NonNvmlCudaPlatform):
    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        """The chosen device's, asked each time: vLLM's own is a functools cache, which a
        parent serving every architecture must not fill."""
        major, minor = capability(chosen.device())
        return DeviceCapability(major=major, minor=minor)

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return True
