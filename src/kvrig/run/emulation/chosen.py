"""The device this process emulates, read from its environment each time vLLM asks.

A platform's warm parent imports vLLM with no device chosen (KVRIG_EMULATE `cuda`), and
each process forked from it takes on its own architecture (`cuda:9.0`), so no device
answer may be fixed at import. A question asked before a device is chosen would leak one
architecture's answer into another's cells through whatever vLLM cached from it; such a
read is noted and refused with an exception `except Exception` cannot swallow, and a
parent that noted one is unfit to serve (kvrig.run.forkserver).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from kvrig.define.gpus import Gpu
from kvrig.run.emulation import EMULATE_ENV, target

_reads: list[str] = []


class DeviceUnchosen(BaseException):
    """A device answer was asked for in a process that serves every architecture."""


def device() -> Gpu:
    """The emulated device, as this process's environment names it now."""
    found = target()
    if found is None:
        where = asked_from(traceback.extract_stack()[:-1])
        _reads.append(where)
        raise DeviceUnchosen(
            f"{where} asked for the emulated device's answers before a device was chosen"
            f" ({EMULATE_ENV} names a platform alone: a parent serving every architecture)"
        )
    return found


# kvrig's own package folder: a checkout's folder may be named kvrig too.
_KVRIG = str(Path(__file__).resolve().parents[2]) + os.sep


def asked_from(stack: traceback.StackSummary) -> str:
    """The innermost frame outside kvrig that asked, as `vllm/...py:LINE in NAME`."""
    outside = [
        f
        for f in stack
        if not str(Path(f.filename).resolve()).startswith(_KVRIG) and "<frozen" not in f.filename
    ]
    if not outside:
        return "kvrig"
    frame = outside[-1]
    path = frame.filename.split("site-packages/")[-1]
    return f"{path}:{frame.lineno} in {frame.name}"


def unchosen_reads() -> list[str]:
    """Where this process asked for the device before one was chosen (none, in a parent
    fit to serve every architecture)."""
    return list(_reads)
