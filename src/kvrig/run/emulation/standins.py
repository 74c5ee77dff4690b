"""Inert CUDA objects for a model built on an emulated CUDA (or ROCm) device.

Some of vLLM's layers take CUDA objects as they are built: Qwen3.5's GDN layers
(`models/qwen3_5/nvidia/model.py`) open `aux_stream()` and two events, and DeepSeek-V3.2's
sparse MLA reads the multiprocessor count of the current accelerator. Each would
initialise a driver, though the cell's outcome depends on none. While the model is built,
torch.cuda's Stream and Event are stand-ins that refuse every use, naming themselves, and
the current accelerator is device 0 (kvrig.run.emulation.cuda_platform); a layer that uses
one leaves its cell undecided (kvrig.judge.trust's DEVICE_GAPS), never passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

from kvrig.define.gpus import Gpu
from kvrig.run.emulation import CUDA_ALIKE

# The phrase a stand-in's refusal carries, which the verdict reads as a device gap.
NO_DEVICE = "kvrig's inert stand-in, no device"


class _Inert:
    """Made freely; any method or attribute asked of it raises, naming itself."""

    kind: ClassVar[str] = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and hasattr probes keep working
            raise AttributeError(name)
        raise RuntimeError(
            f"torch.cuda.{self.kind}.{name} was used in an emulated column ({NO_DEVICE})"
        )

    def __repr__(self) -> str:
        return f"<kvrig inert torch.cuda.{self.kind}>"


class InertStream(_Inert):
    kind = "Stream"


class InertEvent(_Inert):
    kind = "Event"


def current_device_index() -> int:
    """torch.accelerator's current device: the one device an emulated column has."""
    return 0


@contextlib.contextmanager
def while_built(device: Gpu | None) -> Iterator[None]:
    """The stand-ins in place for the `with` block only, on an emulated CUDA or ROCm
    device only (vLLM's XPU code takes no CUDA objects; ROCm's takes them through
    torch.cuda, as HIP's torch names them); torch's own are back after it, an exception
    included."""
    if device is None or device.platform not in CUDA_ALIKE:
        yield
        return
    import torch

    saved = (torch.cuda.Stream, torch.cuda.Event, torch.accelerator.current_device_index)
    torch.cuda.Stream = InertStream  # type: ignore[misc, assignment]
    torch.cuda.Event = InertEvent  # type: ignore[misc, assignment]
    torch.accelerator.current_device_index = current_device_index
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.Event, torch.accelerator.current_device_index = saved  # type: ignore[misc]
