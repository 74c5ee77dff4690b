"""Emulated GPU columns: vLLM's own CUDA, XPU or ROCm platform code, run on a CPU host.

A cell of an emulated column runs vLLM's configuration phase for one GPU architecture, up
to the worker's kernel block sizes. The device is faked only through hooks vLLM offers (a
platform plugin, an empty device list for Triton, a stub driver library, stub kernel
modules, the gfx target), so nothing of vLLM is edited; every record names what was faked
(`fakes()`), and no emulated result counts as hardware.

This module is kvrig's platform plugin (entry point group `vllm.platform_plugins`), loaded
in every process: it answers only when a cell sets KVRIG_EMULATE, so installing kvrig
beside vLLM changes no real engine's platform.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from kvrig.define.gpus import Gpu, device_parts, gpu

EMULATE_ENV = "KVRIG_EMULATE"
PLATFORM_CLASSES = {
    "cuda": "kvrig.run.emulation.cuda_platform.EmulatedCudaPlatform",
    "xpu": "kvrig.run.emulation.xpu_platform.EmulatedXpuPlatform",
    "rocm": "kvrig.run.emulation.rocm_platform.EmulatedRocmPlatform",
}
# Platforms whose device torch reaches through torch.cuda (vLLM's device_type "cuda").
CUDA_ALIKE = ("cuda", "rocm")
# What vLLM is given instead of a device when a cell is emulated, in the words records use.
KV_CACHE_BYTES = 1 << 30


def spec(platform: str, arch: str) -> str:
    """The KVRIG_EMULATE value for a device: `cuda:9.0`, `xpu:bmg`."""
    return f"{platform}:{gpu(platform, arch).arch}"


def target(env: Mapping[str, str] | None = None) -> Gpu | None:
    """The device this process emulates; None in a real engine's process, and in a
    platform's parent, where KVRIG_EMULATE names the platform alone (kvrig.run.emulation.
    chosen: each process forked from it chooses its architecture)."""
    value = (os.environ if env is None else env).get(EMULATE_ENV)
    if not value or value in PLATFORM_CLASSES:
        return None
    return _device(value)


@functools.cache
def _device(value: str) -> Gpu:
    """A KVRIG_EMULATE value read once per value (vLLM asks for the device often)."""
    return gpu(*device_parts(value))


def emulated_platform(env: Mapping[str, str] | None = None) -> str | None:
    """The platform this process emulates, with or without its device chosen: `cuda` for
    a cell's `cuda:9.0` and for the `cuda` of a parent serving every CUDA architecture."""
    value = (os.environ if env is None else env).get(EMULATE_ENV)
    if not value:
        return None
    return value if value in PLATFORM_CLASSES else _device(value).platform


def platform_plugin() -> str | None:
    """vLLM's platform plugin hook: the emulated platform's class path, or None."""
    platform = emulated_platform()
    return PLATFORM_CLASSES[platform] if platform else None


def fakes(device: Gpu, stub_symbols: int | None = None) -> list[str]:
    """What an emulated cell's vLLM was given instead of a device, for its record."""
    return [
        _platform_line(device),
        *_device_lines(device),
        "libcuda.so.1: kvrig's stub"
        + (f" ({stub_symbols} driver symbols" if stub_symbols else " (driver symbols")
        + ", each answering CUDA_ERROR_NO_DEVICE), so the CUDA wheel's extensions load",
        "CUDA_VISIBLE_DEVICES empty: Triton keeps its backend without an active driver",
        "HUMMING_DISABLE_PARALLEL_BUILD=1: no background build of humming's CUDA launcher",
        "VLLM_DISABLE_SHARED_EXPERTS_STREAM=1: MoE layers open no CUDA stream",
        "the model built on the meta device: real layers, no weights, no kernels run;"
        " tensors a layer asks for on the GPU by name are made on the meta device too",
        *(
            [
                "while the model is built: torch.cuda.Stream and torch.cuda.Event are kvrig's"
                " inert stand-ins (made freely, any use raises: the cell is then undecided),"
                " so vllm.utils.torch_utils.aux_stream() and the layers' events need no"
                " driver; torch.accelerator.current_device_index() answers 0, whose"
                " properties are the emulated device's"
            ]
            if device.platform in CUDA_ALIKE
            else []
        ),
        "torch.distributed on gloo (a forked process per tensor-parallel rank), with vLLM's"
        " base device communicator instead of NCCL, RCCL or oneCCL",
        f"KV-cache memory fixed at {KV_CACHE_BYTES >> 20} MiB, not profiled",
        *_kernel_lines(device),
    ]


def _platform_line(device: Gpu) -> str:
    name = PLATFORM_CLASSES[device.platform].rsplit(".", 1)[-1]
    facts = {
        "cuda": f", compute capability {device.arch}",
        "rocm": f", gfx target {device.arch}; is_rocm() comes from vLLM's RocmPlatform, the"
        " class it extends (vllm/platforms/rocm.py of the CUDA wheel)",
    }
    return (
        f"vLLM's platform: {name} through kvrig's platform plugin, answering"
        f" {device.name!r} with {device.memory_gib} GiB{facts.get(device.platform, '')}"
    )


def _device_lines(device: Gpu) -> list[str]:
    """How torch's device queries were answered (on ROCm, with amd-smi's and Triton's)."""
    if device.platform == "cuda":
        return [
            "torch.cuda.get_device_properties, get_device_capability and get_device_name:"
            f" answered for the emulated device ({device.sm_count} multiprocessors);"
            " torch.cuda.is_available() stays False"
        ]
    if device.platform == "rocm":
        from kvrig.run.emulation import rocm_answers  # not in the plugin's own import

        return rocm_answers.device_lines(device)
    return ["torch.xpu's device queries: answered by the platform for the emulated device"]


def _kernel_lines(device: Gpu) -> list[str]:
    """The device's own kernel packages, and what stood in for them."""
    if device.platform == "xpu":
        return [
            "torch.ops._xpu_C.is_xe2_arch and is_xe3_arch (vllm_xpu_kernels' device queries):"
            " answered for the emulated device's Xe generation",
            "vllm_xpu_kernels and every submodule: empty stubs, as vLLM's own XPU selection"
            " tests use (a kernel called through them raises); the custom ops the layers"
            " look up in torch.ops._C come from the CUDA wheel's library",
        ]
    if device.platform == "rocm":
        from kvrig.rules.rocm import aiter_installed
        from kvrig.run.emulation import rocm_answers

        return rocm_answers.kernel_lines(aiter=aiter_installed(os.environ))
    return []
