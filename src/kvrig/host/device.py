"""Whether a column's accelerator is still there, asked inside its container before each cell.

A lost device turns every remaining cell into the same raw CUDA, HIP or Level Zero error,
filed under each cell's name as if vLLM had failed it; asked first, the column stops at the
first cell it would lose and says what went.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def _run(cmd: Sequence[str], timeout: float = 30) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except OSError as exc:
        return 127, str(exc)
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {timeout:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


@dataclass(frozen=True)
class Looks:
    """How the check looks at the system: swapped for fakes in tests."""

    glob: Callable[[str], list[str]] = lambda pattern: sorted(glob.glob(pattern))
    usable: Callable[[str], bool] = lambda path: os.access(path, os.R_OK | os.W_OK)
    which: Callable[[str], str | None] = shutil.which
    run: Callable[[Sequence[str]], tuple[int, str]] = _run


def _lists_a_gpu(looks: Looks, cmd: list[str]) -> str | None:
    """The driver's own tool still lists a GPU, or why not."""
    code, out = looks.run(cmd)
    if code != 0 or "GPU" not in out:
        last = out.splitlines()[-1] if out else f"exit {code}"
        return f"`{' '.join(cmd)}` lists no GPU ({last}): the driver has lost the device"
    return None


def _cuda(looks: Looks) -> str | None:
    # nvidia-smi, where the image has the driver's tools, is the driver's own word; else
    # the device nodes Docker's toolkit and a CDI spec create (/dev/nvidiaN, or WSL's dxg).
    if looks.which("nvidia-smi") is not None:
        return _lists_a_gpu(looks, ["nvidia-smi", "-L"])
    if not looks.glob("/dev/nvidia[0-9]*") and not looks.glob("/dev/dxg"):
        return (
            "no /dev/nvidiaN device node is here: the container was started without the GPU"
            " (docker --gpus all, podman --device nvidia.com/gpu=all) or the GPU has gone"
        )
    return None


def _render_node(looks: Looks) -> str | None:
    """A render node this user may open: what XPU's Level Zero and ROCm's HIP open."""
    nodes = looks.glob("/dev/dri/renderD*")
    if not nodes:
        return (
            "no /dev/dri/renderD* node is here: the container was started without the GPU"
            " (--device /dev/dri) or the GPU has gone"
        )
    if not any(looks.usable(node) for node in nodes):
        return (
            f"{', '.join(nodes)} cannot be opened for reading and writing by uid"
            f" {os.getuid()}: the container lacks the render group (--group-add, or"
            " keep-groups for rootless Podman)"
        )
    return None


def _rocm(looks: Looks) -> str | None:
    # vLLM's ROCm build opens both the compute node (/dev/kfd) and a render node; the
    # driver's own word comes last, where the image has amd-smi.
    if not looks.glob("/dev/kfd"):
        return (
            "no /dev/kfd is here: the container was started without the GPU (--device"
            " /dev/kfd --device /dev/dri) or the GPU has gone"
        )
    if not looks.usable("/dev/kfd"):
        return (
            f"/dev/kfd cannot be opened for reading and writing by uid {os.getuid()}: the"
            " container lacks the video and render groups (--group-add, or keep-groups for"
            " rootless Podman)"
        )
    render = _render_node(looks)
    if render is not None:
        return render
    if looks.which("amd-smi") is not None:
        return _lists_a_gpu(looks, ["amd-smi", "list"])
    return None


def missing(platform: str, looks: Looks | None = None) -> str | None:
    """Why the platform's device is not usable here, or None when it is (and off GPUs)."""
    looks = looks or Looks()
    if platform == "cuda":
        return _cuda(looks)
    if platform == "xpu":
        return _render_node(looks)
    if platform == "rocm":
        return _rocm(looks)
    return None
