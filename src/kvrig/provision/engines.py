"""A container engine that answers: decided from what runs, installed when none does.

    kvrig setup container-engine [EXTRA_PACKAGE...]

A `docker` binary on PATH says nothing: the common CI runner and desk have the client and
no daemon. So each engine is asked (`docker info`, `podman info`), and Podman is installed
when none answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvrig.provision import system_packages

# Podman and what it is known to run containers with on these hosts: runc (crun refuses
# a hybrid cgroup layout), and netavark with aardvark-dns and iptables for networking.
PODMAN_PACKAGES = ("podman", "runc", "netavark", "aardvark-dns", "iptables")


class SetupError(Exception):
    """No engine answers and kvrig cannot install one; one paragraph for the user."""


@dataclass(frozen=True)
class Answer:
    """What one engine said: absent, or its `info` exit status and last line."""

    installed: bool
    answers: bool = False
    said: str = ""

    def describe(self, engine: str) -> str:
        if not self.installed:
            return f"{engine} is not installed"
        if self.answers:
            return f"`{engine} info` answers"
        return f"`{engine} info` failed ({self.said or 'no output'})"


@dataclass(frozen=True)
class Facts:
    docker: Answer
    podman: Answer
    root: bool
    apt: bool
    have: frozenset[str]  # Debian packages already installed (of those that matter)


@dataclass(frozen=True)
class Setup:
    engine: str  # the engine the column will use
    install: tuple[str, ...]  # Debian packages to install first (none: use it as it is)
    reason: str


def decide(facts: Facts, extra: Sequence[str] = ()) -> Setup:
    """Docker when its daemon answers; else Podman, with whatever of it (and `extra`, e.g.
    debootstrap for a local base image) is missing; refused when that cannot be installed."""
    if facts.docker.answers:
        return Setup("docker", (), facts.docker.describe("docker"))
    seen = f"{facts.docker.describe('docker')}; {facts.podman.describe('podman')}"
    missing = tuple(p for p in (*PODMAN_PACKAGES, *extra) if p not in facts.have)
    if not missing:
        return Setup("podman", (), seen)
    if not (facts.root and facts.apt):
        why = "not running as root" if not facts.root else "apt-get is not available"
        raise SetupError(
            f"No container engine can run a container here ({seen}), and kvrig cannot"
            f" install one ({why}). Install the Debian packages {', '.join(missing)}"
            f" (sudo apt-get install {' '.join(missing)}, or your distribution's"
            " equivalents), or start the Docker daemon (sudo systemctl start docker), then"
            " run the session again."
        )
    return Setup("podman", missing, f"{seen}: installing {', '.join(missing)}")


Run = Callable[[Sequence[str]], tuple[int, str]]


def _run(cmd: Sequence[str], timeout: float = 60) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
    return done.returncode, lines[-1] if lines else ""


def ask(engine: str, which: Callable[[str], str | None] = shutil.which, run: Run = _run) -> Answer:
    if which(engine) is None:
        return Answer(installed=False)
    code, said = run([engine, "info"])
    return Answer(installed=True, answers=code == 0, said="" if code == 0 else said)


def facts(
    extra: Iterable[str] = (),
    which: Callable[[str], str | None] = shutil.which,
    run: Run = _run,
    installed: Callable[[str], bool] = system_packages.installed,
) -> Facts:
    wanted = (*PODMAN_PACKAGES, *extra)
    return Facts(
        docker=ask("docker", which, run),
        podman=ask("podman", which, run),
        root=os.geteuid() == 0,
        apt=which("apt-get") is not None,
        have=frozenset(p for p in wanted if installed(p)),
    )


def ensure(extra: Sequence[str] = ()) -> Setup:
    """The engine a column will use, with what it lacks (and `extra`) installed first."""
    setup = decide(facts(extra), extra)
    if setup.install:
        system_packages.ensure(list(setup.install))
    return setup
