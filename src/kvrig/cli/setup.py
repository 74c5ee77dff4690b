"""`kvrig setup WHAT`: what a nox session installs before it runs anything.

The README's two commands must set up a fresh machine by themselves; where one of these
cannot install, it refuses in one paragraph naming what to install instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
from pathlib import Path
from typing import Any

from kvrig.cli.usage import UsageError
from kvrig.containers import base_image
from kvrig.define import column_choice, named_release
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import load
from kvrig.define.vllm_names import PLATFORMS
from kvrig.provision import (
    compiler,
    engines,
    install,
    libcuda_stub,
    pins,
    system_packages,
    vllm_install,
)


def cmd_vllm(ns: argparse.Namespace, extra: list[str]) -> int:
    """The platform's vLLM into this environment, with what its engines need beside it: on
    CPU a C++ compiler and Python.h, as torch's inductor builds helpers even in eager mode;
    emulated, the stand-in libcuda.so.1. The pins are checked against the index first."""
    job = vllm_job(ns)
    if ns.dry_run:
        return vllm_install.install(job.plan(), dry_run=True)
    plan = vllm_install.checked_plan(job)
    if job.platform == "cpu" or ns.emulated:
        _packages(compiler.needed())
    code = vllm_install.setup(job, plan)
    if code != 0 or not ns.emulated:
        return code
    # The stub's symbols are read off the wheel just installed into this interpreter.
    importlib.invalidate_caches()
    folder, count = libcuda_stub.ensure()
    print(f"kvrig: stand-in {libcuda_stub.DRIVER} for {count} driver symbols in {folder}")
    return 0


# vLLM for ROCm is not on the package index (PyPI's vllm wheel is CUDA's build, with
# CUDA's torch): a ROCm GPU's column runs in vLLM's ROCm image.
ROCM_ON_HOST = (
    "kvrig installs no vLLM for ROCm on a host: the package index serves only CUDA's build"
    " of vLLM (with CUDA's torch), so a ROCm GPU's column runs in vLLM's own ROCm image of"
    " the pinned release (matrix.yaml platforms.rocm.vllm) with the rig layered on. Run"
    " `nox -s rocm` (or `kvrig container rocm`) on the AMD GPU host; `nox -s emulated`"
    " decides every ROCm cell on emulated gfx targets on any host."
)


def vllm_job(ns: argparse.Namespace) -> vllm_install.Job:
    """What `kvrig setup vllm` was asked for: the matrix, the platform (cuda's wheel for
    the emulated columns, else the one named or the host's) and the overrides."""
    platform = "cuda" if ns.emulated else ns.platform
    if platform is None:
        platform = column_choice.ThisHost().platform
        print(f"kvrig: host platform: {platform}", flush=True)
    if platform == "rocm":
        raise UsageError(ROCM_ON_HOST)
    matrix = load(ns.matrix or default_matrix())
    if getattr(ns, "vllm", None):  # a release named instead of the pin, in memory only
        every = named_release.platforms_for(platform, ns.emulated)
        matrix = named_release.apply(matrix, every, named_release.parse(ns.vllm))
    return vllm_install.Job(
        matrix,
        platform,
        emulated=ns.emulated,
        requested=tuple(requested_overrides(ns.override or [], ns.overrides or [])),
        command=rerun_command(ns),
    )


def requested_overrides(options: list[str], files: list[str]) -> list[pins.Override]:
    """--override PKG==VER and the lines of each --overrides FILE, checked."""
    out = [pins.from_option(text) for text in options]
    for name in files:
        try:
            text = Path(name).read_text()
        except OSError as exc:
            raise pins.PinError(
                f"--overrides {name}: the file could not be read ({exc.strerror}). Nothing was"
                " installed; name a file of requirement lines (PKG==VER, one a line)."
            ) from None
        out += pins.from_file(text, name)
    return out


def rerun_command(ns: argparse.Namespace) -> str:
    """The command as given, for a refusal to add an --override to."""
    words = ["kvrig", *(["--matrix", ns.matrix] if ns.matrix else []), "setup", "vllm"]
    words += ["--emulated"] if ns.emulated else ([ns.platform] if ns.platform else [])
    if getattr(ns, "vllm", None):
        words += ["--vllm", ns.vllm]
    for text in ns.override or []:
        words += ["--override", text]
    for name in ns.overrides or []:
        words += ["--overrides", name]
    return shlex.join(words)


def _packages(packages: list[str]) -> None:
    done = system_packages.ensure(packages)
    if done:
        print(f"installed: {' '.join(done)}")


def cmd_packages(ns: argparse.Namespace, extra: list[str]) -> int:
    _packages(ns.packages)
    return 0


def cmd_container_engine(ns: argparse.Namespace, extra: list[str]) -> int:
    setup = engines.ensure(ns.packages)
    print(f"kvrig: container engine {setup.engine} ({setup.reason})")
    return 0


def cmd_base_image(ns: argparse.Namespace, extra: list[str]) -> int:
    tag = ns.tag or base_image.local_tag(ns.suite)
    base_image.build(ns.engine, tag, ns.suite, ns.mirror)
    print(f"base image: {tag} (use it with KVRIG_BASE_IMAGE={tag})")
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("setup", help="install what a session needs (vLLM, packages, an engine)")
    what = s.add_subparsers(dest="what", required=True, metavar="WHAT")
    v = what.add_parser(
        "vllm", help="the platform's vLLM as matrix.yaml says, into this environment (uv)"
    )
    v.add_argument("platform", nargs="?", choices=PLATFORMS, help="default: this host's")
    v.add_argument(
        "--emulated",
        action="store_true",
        help="the emulated GPU columns' environment: the cuda platform's PyPI wheel, and the"
        " stand-in libcuda.so.1 its extensions link",
    )
    v.add_argument("--dry-run", action="store_true", help="print the install, run nothing")
    v.add_argument(
        "--vllm",
        metavar="RELEASE",
        help="this release (a version, or a wheel file) instead of the one matrix.yaml pins",
    )
    v.add_argument(
        "--override",
        action="append",
        metavar="PKG==VER",
        help="take this version instead of the one the release pins (uv's --override;"
        " repeatable); the environment is then not the release's own, and records say so",
    )
    v.add_argument(
        "--overrides",
        action="append",
        metavar="FILE",
        help="the same from a file of requirement lines (uv's override file; repeatable)",
    )
    v.set_defaults(run=cmd_vllm)
    p = what.add_parser(
        "packages", help="Debian packages, installed when missing (as root, with apt-get)"
    )
    p.add_argument("packages", nargs="+", metavar="PACKAGE")
    p.set_defaults(run=cmd_packages)
    e = what.add_parser(
        "container-engine",
        help="a container engine that answers: Docker's daemon, else Podman (installed as"
        " root when none answers)",
    )
    e.add_argument(
        "packages", nargs="*", metavar="PACKAGE", help="also these Debian packages (debootstrap)"
    )
    e.set_defaults(run=cmd_container_engine)
    b = what.add_parser(
        "base-image",
        help="build localhost/kvrig-base:<suite> with debootstrap and import it (no registry)",
    )
    b.add_argument("--engine", choices=("podman", "docker"), default="podman")
    b.add_argument("--suite", default=base_image.SUITE)
    b.add_argument("--tag", help="default: localhost/kvrig-base:<suite>")
    b.add_argument("--mirror", default=os.environ.get("KVRIG_DEBIAN_MIRROR") or None)
    b.set_defaults(run=cmd_base_image)


USER_ERRORS = (
    install.InstallError,
    pins.PinError,
    system_packages.SystemPackageError,
    engines.SetupError,
    base_image.BaseImageError,
    libcuda_stub.StubError,
)
