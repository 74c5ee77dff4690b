"""What a GPU host must have before a containerised GPU column installs or builds anything.

Checked in the order a runner fails (device, driver, container toolkit, node access, a
known architecture), each missing piece one paragraph, exit 2, before an engine is
installed or an image built. With --dry-run nothing is refused: the gaps are printed as
comment lines above the plan, so a dry run works on any host.

    kvrig check host cpu|cuda|xpu|rocm [--gpu-arch ARCH] [--dry-run] [the column's other
        arguments, ignored]
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from kvrig.containers.preflight import PreflightError, Probe, check_architecture, check_device
from kvrig.define.matrix import load
from kvrig.provision import engines

# The oldest Linux driver each CUDA major runs on (CUDA's minor-version compatibility:
# any driver of at least this release runs every minor of the major).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
CDI_SPECS = (Path("/etc/cdi"), Path("/var/run/cdi"))
_CUDA_TAG = re.compile(r"nvidia/cuda:(\d+)\.(\d+)")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def image_cuda(base_image: str) -> tuple[int, int] | None:
    """The CUDA release an image is built on, from its nvidia/cuda tag (None: unknown)."""
    m = _CUDA_TAG.search(base_image)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _version(text: str) -> tuple[int, ...] | None:
    m = _VERSION.search(text)
    return tuple(int(p or 0) for p in m.groups()) if m else None


def check_driver(base_image: str, probe: Probe) -> None:
    """The host's driver runs the image's CUDA (its major's minimum)."""
    cuda = image_cuda(base_image)
    if cuda is None or cuda[0] not in MIN_DRIVER:
        return
    code, out = probe.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    have = _version(out) if code == 0 else None
    shown = MIN_DRIVER[cuda[0]]
    need = _version(shown) or ()
    if have is None:
        raise PreflightError(
            "The CUDA column cannot read the NVIDIA driver's version (`nvidia-smi"
            f" --query-gpu=driver_version` said {out or f'exit {code}'!r}). Check the driver"
            " with `nvidia-smi`; the image needs CUDA"
            f" {cuda[0]}.{cuda[1]}, which runs on driver {shown} or newer."
        )
    if have < need:
        raise PreflightError(
            f"The image is built on CUDA {cuda[0]}.{cuda[1]} ({base_image}), which needs an"
            f" NVIDIA driver of at least {shown}, and this host has {out.strip()}. Install a"
            f" newer driver (the R{need[0]} branch or later; `nvidia-smi` shows the one"
            " installed), then run this again."
        )


def check_toolkit(probe: Probe) -> None:
    """Something passes the GPU into a container: the NVIDIA Container Toolkit (its
    `nvidia-ctk` or Docker's nvidia runtime) or a CDI spec for Podman."""
    if probe.which("nvidia-ctk") or probe.which("nvidia-container-runtime"):
        return
    for folder in CDI_SPECS:
        if probe.glob(folder, "nvidia*.yaml") or probe.glob(folder, "nvidia*.json"):
            return
    raise PreflightError(
        "The CUDA column passes the GPU into its container, and this host has neither the"
        " NVIDIA Container Toolkit (no `nvidia-ctk` or `nvidia-container-runtime`) nor a CDI"
        f" spec for the GPU ({' or '.join(str(f) for f in CDI_SPECS)}). Install the toolkit"
        " (nvidia-container-toolkit from NVIDIA's repository), then for Podman generate the"
        " spec: `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`; for Docker"
        " configure the runtime: `sudo nvidia-ctk runtime configure --runtime=docker`."
    )


def _check_node_access(platform: str, nodes: list[Path], groups: str) -> None:
    """The user may open the device nodes (root, or a member of the groups owning them)."""
    if os.geteuid() == 0:
        return
    member = set(os.getgroups())
    for node in nodes:
        try:
            gid = node.stat().st_gid
        except OSError:
            continue
        if gid not in member and not os.access(node, os.R_OK | os.W_OK):
            raise PreflightError(
                f"The {platform} column opens {node}, and this user is not in its group (gid"
                f" {gid}, {groups}). Add the user to it (`sudo usermod -aG $(stat -c %G {node})"
                " $USER`), then log in again and run this again; rootless Podman keeps the"
                " group in the container (kvrig passes `--group-add keep-groups`)."
            )


def check_render_access(probe: Probe, dri: Path = Path("/dev/dri")) -> None:
    """The user may open the Intel render nodes (root, or a member of their group)."""
    _check_node_access("XPU", probe.glob(dri, "renderD*"), "usually `render`")


def check_kfd_access(
    probe: Probe, kfd: Path = Path("/dev/kfd"), dri: Path = Path("/dev/dri")
) -> None:
    """The user may open /dev/kfd and the render nodes (root, or a member of their groups):
    vLLM's ROCm build opens both, and a container keeps only the groups its user has."""
    groups = "usually `render`, or `video` for /dev/kfd on older ROCm releases"
    _check_node_access("ROCm", [kfd, *probe.glob(dri, "renderD*")], groups)


def check(platform: str, base_image: str, probe: Probe, gpu_arch: str | None = None) -> None:
    check_device(platform, probe)
    if platform == "cuda":
        check_driver(base_image, probe)
        check_toolkit(probe)
        check_architecture(probe, gpu_arch)
    elif platform == "xpu":
        check_render_access(probe)
    elif platform == "rocm":
        check_kfd_access(probe)
        check_architecture(probe, gpu_arch, platform="rocm")


def check_host(
    platform: str,
    probe: Probe | None = None,
    matrix: Path | None = None,
    gpu_arch: str | None = None,
) -> None:
    """The host's side of the platform's column, against the base image matrix.yaml names
    and, on CUDA and ROCm, the architecture a runner's label names."""
    spec = load(matrix).platforms.get(platform)  # type: ignore[call-overload]
    check(platform, spec.base_image if spec else "", probe or Probe(), gpu_arch)


def dry_run_lines(
    platform: str,
    probe: Probe | None = None,
    matrix: Path | None = None,
    gpu_arch: str | None = None,
    engine_facts: Callable[[tuple[str, ...]], engines.Facts] | None = None,
) -> list[str]:
    """What a run would stop at here, as comment lines of the plan, never a refusal: a dry
    run shows the plan on any host, and says what this host lacks for it."""
    head = f"# kvrig check host {platform}:"
    try:
        check_host(platform, probe, matrix, gpu_arch)
    except PreflightError as exc:
        host = f"{head} a run stops here (exit 2), before anything is installed: {exc}"
    else:
        needs = "its device, driver and toolkit" if platform != "cpu" else "no device"
        host = f"{head} this host has what the {platform} column needs ({needs})"
    return [host, engine_line(ENGINE_PACKAGES.get(platform, ()), engine_facts)]


# What each session's engine set-up installs beside the engine (noxfile.py: the cpu
# session's local base image is built with debootstrap where no registry answers).
ENGINE_PACKAGES = {"cpu": ("debootstrap",)}


def engine_line(
    extra: tuple[str, ...] = (),
    engine_facts: Callable[[tuple[str, ...]], engines.Facts] | None = None,
) -> str:
    """What `kvrig setup container-engine EXTRA...` would do here: use the engine that
    answers, install Podman (and `extra`), or stop (its paragraph)."""
    head = f"# kvrig setup container-engine{''.join(' ' + p for p in extra)}:"
    try:
        setup = engines.decide((engine_facts or engines.facts)(extra), extra)
    except engines.SetupError as exc:
        return f"{head} a run stops here (exit 2): {exc}"
    if setup.install:
        return f"{head} would install {', '.join(setup.install)} and use podman ({setup.reason})"
    return f"{head} would use {setup.engine} ({setup.reason})"
