"""Debian packages some nox sessions need beyond Python (a browser, a container engine).

The README's commands must do all the set-up on a fresh machine; without root and apt-get
the refusal is one paragraph naming the packages.

    kvrig setup packages chromium chromium-driver
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable


class SystemPackageError(Exception):
    """One paragraph for the user; the nox session stops with it."""


def installed(package: str) -> bool:
    """True when dpkg knows the package as installed."""
    if shutil.which("dpkg-query") is None:
        return False
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.returncode == 0 and out.stdout.startswith("ii")


def missing(
    packages: Iterable[str], is_installed: Callable[[str], bool] | None = None
) -> list[str]:
    check = is_installed or installed
    return [p for p in packages if not check(p)]


def install_commands(packages: list[str]) -> list[list[str]]:
    """The apt-get commands that install `packages` without prompts (pure)."""
    if not packages:
        return []
    return [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ]


def ensure(packages: list[str], *, is_root: bool | None = None) -> list[str]:
    """Installs the missing packages; returns what was installed, or raises one paragraph."""
    need = missing(packages)
    if not need:
        return []
    root = os.geteuid() == 0 if is_root is None else is_root
    if not root or shutil.which("apt-get") is None:
        raise SystemPackageError(
            f"This step needs the Debian packages {', '.join(need)}, which are not installed,"
            " and kvrig can install them only as root on a Debian or Ubuntu host. Install them"
            f" yourself (sudo apt-get install {' '.join(need)}, or your distribution's"
            " equivalents) and run the session again."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in install_commands(need):
        done = subprocess.run(cmd, env=env, check=False)
        if done.returncode != 0:
            raise SystemPackageError(
                f"Installing {', '.join(need)} failed ({' '.join(cmd)} exited with"
                f" {done.returncode}; its output is above). Check that the Debian mirrors are"
                " reachable, or install the packages yourself, and run the session again."
            )
    return need
