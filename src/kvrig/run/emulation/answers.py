"""What an emulated device answers to the queries vLLM's platforms send to torch.

vLLM's CUDA and XPU platforms ask torch for the device's name, memory and count, the
current ordinal, and pick a communicator for the device's collectives; without a device
each of those would fail or initialise a driver. Both emulated platforms answer them the
same way, from the device the cell emulates (kvrig.define.gpus), fixed for the process.
"""

from __future__ import annotations

from kvrig.run.emulation import chosen
from kvrig.run.vllm_plugin.symbols import need

USER = "kvrig's emulated platform"
COMMUNICATOR = (
    "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"
)


class DeviceAnswers:
    """Mixed in before vLLM's platform class, so these answers take its place."""

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return chosen.device().name

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return chosen.device().memory_gib << 30

    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def current_device(cls) -> int:
        """The ordinal torch would answer; layers that allocate on it get the meta device
        (kvrig.run.emulation.meta) instead of initialising a driver."""
        return 0

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        """vLLM's base communicator, over the gloo group: the ranks of a tensor-parallel
        cell only meet to build their groups, and NCCL/oneCCL would need the device. Looked
        up here, so a release that moved it names it rather than failing to import it."""
        need(COMMUNICATOR, USER)
        return COMMUNICATOR
