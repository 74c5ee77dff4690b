"""The ROCm platform of an emulated column: vLLM's own RocmPlatform, with its GPU answered.

vLLM's ROCm code ships in the same PyPI wheel as its CUDA code, so its selector, backends
and block-size steps run here unchanged. What an AMD host would answer is answered through
hooks vLLM reads, fixed for the process (kvrig.run.emulation.rocm_answers):

- the gfx target, which rocm.py reads once at import into `_GCN_ARCH` (amd-smi first,
  then torch): amdsmi is made unimportable and torch answers the device's `gcnArchName`
  before rocm.py is imported, and a rocm.py imported earlier with another target is
  refused;
- RocmPlatform's amd-smi queries (name, memory, count, topology, uuid, NUMA nodes);
- AITER, only where the cell says AMD's aiter is installed (kvrig.define.case_spec.AITER_ENV):
  empty stand-ins, so that vLLM finds it as on its ROCm image.

torch stays the CUDA wheel's (`torch.version.hip` None): claiming a HIP runtime would send
vLLM's RCCL and Triton code after one that is not there.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any

import torch

from kvrig.define.gpus import Gpu
from kvrig.rules.rocm import aiter_installed
from kvrig.run.emulation import rocm_answers, stub_modules, target
from kvrig.run.emulation.answers import USER, DeviceAnswers
from kvrig.run.vllm_plugin.symbols import need

ROCM_MODULE = "vllm.platforms.rocm"
AITER_WHY = (
    "an AITER kernel was called in an emulated ROCm column (aiter is kvrig's stand-in"
    " there: no device)"
)


class RocmEmulationError(RuntimeError):
    """The emulated ROCm platform cannot answer for its device; says why in one paragraph."""


def _device() -> Gpu:
    device = target()
    if device is None or device.platform != "rocm":  # pragma: no cover - a misuse, said loud
        raise RocmEmulationError(
            "kvrig's emulated ROCm platform was imported without KVRIG_EMULATE=rocm:*"
        )
    return device


def _answer_torch(device: Gpu) -> None:
    """torch.cuda's device queries answered for the one emulated device; torch.cuda itself
    stays unavailable, so no kernel can start."""
    props = rocm_answers.properties(device)
    capability = (props.major, props.minor)

    def get_device_properties(_device: Any = None) -> SimpleNamespace:
        return props

    def get_device_capability(_device: Any = None) -> tuple[int, int]:
        return capability

    def get_device_name(_device: Any = None) -> str:
        return device.name

    torch.cuda.get_device_properties = get_device_properties  # type: ignore[assignment]
    torch.cuda.get_device_capability = get_device_capability  # type: ignore[assignment]
    torch.cuda.get_device_name = get_device_name  # type: ignore[assignment]


def _import_rocm(device: Gpu) -> Any:
    """vllm.platforms.rocm, imported once its import-time reads are answered; if something
    imported it first, the target it read must be this device's."""
    early = ROCM_MODULE in sys.modules
    module = need(ROCM_MODULE, USER)
    wanted = device.gcn_arch_name
    read = getattr(module, "_GCN_ARCH", None)
    if read != wanted:
        raise RocmEmulationError(
            f"vLLM's rocm.py read the gfx target {read!r}, not the emulated {wanted!r}"
            + (" (it was imported before kvrig's emulated ROCm platform)" if early else "")
            + "; every on_gfx* answer and the device capability would be another GPU's."
            " Nothing may import vLLM's ROCm code before vLLM resolves its platform."
        )
    return module


_DEVICE = _device()
# amd-smi unimportable for the process: rocm.py's queries fail as on a host without the
# driver, and rocm.py falls back to torch's answer for the target.
sys.modules["amdsmi"] = None  # type: ignore[assignment]
if aiter_installed(os.environ):  # before vllm._aiter_ops looks for it
    stub_modules.install("aiter", AITER_WHY)
_answer_torch(_DEVICE)
_import_rocm(_DEVICE)
RocmPlatform = need(f"{ROCM_MODULE}.RocmPlatform", USER)


class EmulatedRocmPlatform(DeviceAnswers, RocmPlatform):  # type: ignore[misc, valid-type]
    """RocmPlatform with amd-smi's answers given by the emulated device; the capability
    stays vLLM's own, derived from _GCN_ARCH."""

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return True

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return "kvrig-emulated"

    @classmethod
    def get_all_device_numa_nodes(cls) -> list[int] | None:
        """None, as vLLM answers when amd-smi cannot say: no NUMA binding is attempted."""
        return None
