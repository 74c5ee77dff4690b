"""A Debian base image made from Debian's packages, for hosts that reach no image registry.

    kvrig setup base-image [--engine podman|docker] [--suite bookworm] [--tag IMAGE]

debootstrap fetches the packages from a Debian mirror, which such hosts reach as their
apt-get does; KVRIG_BASE_IMAGE then builds on the imported image.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = "bookworm"
LOCAL_TAG = "localhost/kvrig-base:{suite}"
# What the Dockerfiles' RUN steps need from a python:3.x-slim base.
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Public bases a local Debian image can stand in for: Python on that Debian release.
STANDS_IN_FOR = {"bookworm": ("python:3.11-slim-bookworm", "python:3.12-slim-bookworm")}


class BaseImageError(Exception):
    """One paragraph for the user."""


def local_tag(suite: str = SUITE) -> str:
    return LOCAL_TAG.format(suite=suite)


# NVIDIA's CUDA runtime images, which the CUDA image builds on: the PyPI wheels it
# installs (torch, vLLM) bring their own CUDA libraries and the driver comes from the host,
# so a Debian base with Python stands in where no registry answers.
CUDA_RUNTIME = re.compile(r"^(docker\.io/)?nvidia/cuda:[\d.]+-(base|runtime)-")


def can_stand_in(public: str) -> str | None:
    """The Debian suite whose local image can replace `public`, if any (pure)."""
    if CUDA_RUNTIME.match(public):
        return SUITE
    name = public.rsplit("/", 1)[-1]
    for suite, images in STANDS_IN_FOR.items():
        if name in images or (name.startswith("python:") and name.endswith(f"-{suite}")):
            return suite
    return None


def debootstrap_command(root: Path, suite: str = SUITE, mirror: str | None = None) -> list[str]:
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        suite,
        str(root),
    ]
    if mirror:
        cmd.append(mirror)
    return cmd


def import_command(engine: str, tag: str) -> list[str]:
    return [engine, "import", "-", tag]


def build(engine: str, tag: str, suite: str = SUITE, mirror: str | None = None) -> None:
    """Makes the root filesystem in a temporary folder and imports it as `tag`."""
    if shutil.which("debootstrap") is None:
        raise BaseImageError(
            "Building a local base image needs debootstrap, which is not installed. Install it"
            " (apt-get install debootstrap, or as root `kvrig setup packages debootstrap`), or"
            " point the build at an image you have with KVRIG_BASE_IMAGE."
        )
    if os.geteuid() != 0:
        raise BaseImageError(
            "debootstrap must run as root to make the base image's root filesystem. Run"
            " `sudo kvrig setup base-image` (or `nox -s base_image` as root), or point the build"
            " at an image you have with KVRIG_BASE_IMAGE."
        )
    with tempfile.TemporaryDirectory(prefix="kvrig-rootfs-") as tmp:
        root = Path(tmp) / "root"
        cmd = debootstrap_command(root, suite, mirror)
        print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise BaseImageError(
                f"debootstrap of Debian {suite} failed (exit {done.returncode}; its output is"
                " above). Check that the Debian mirror is reachable (KVRIG_DEBIAN_MIRROR names"
                " another), or point the build at an image you have with KVRIG_BASE_IMAGE."
            )
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imp = import_command(engine, tag)
        print(f"+ tar -C {shlex.quote(str(root))} -c . | {shlex.join(imp)}", file=sys.stderr)
        imported = subprocess.run(imp, stdin=tar.stdout, stdout=subprocess.DEVNULL, check=False)
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise BaseImageError(
                f"Importing the root filesystem as {tag} failed (`{shlex.join(imp)}` exited"
                f" {imported.returncode}). Check that `{engine} images` works here."
            )
