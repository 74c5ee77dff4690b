"""What `kvrig setup vllm` installed into an environment, kept in the environment.

An override makes the environment not the release's own, and only the install knows it:
a record sees vLLM's version and nothing of flashinfer's. A stamp counts only while its
release is the one installed, so a vLLM installed over it by other means makes it stale.
An image's build finishes a stamp planned on the host:

    python -m kvrig.provision.stamp write PLANNED
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from kvrig.provision.install import Plan, Release
from kvrig.provision.pins import Override

FILE = "kvrig-vllm.json"


def path(prefix: str | None = None) -> Path:
    return Path(prefix or sys.prefix) / FILE


def content(plan: Plan, installed: str | None, asked: str, now: dt.datetime) -> dict[str, Any]:
    """The stamp of a finished install (pure): the command, the release and the version
    that landed, the overrides with why, what the plan kept out, and when."""
    return finished(planned(plan.release, plan.overrides, plan.excluded, asked), installed, now)


def planned(
    release: Release | None, overrides: Sequence[Override], excluded: Sequence[str], asked: str
) -> dict[str, Any]:
    """What a stamp says that is known before the install (pure): the host knows the
    overrides and why, the image alone the version that landed."""
    return {
        "asked": asked,
        "package": release.package if release else None,
        "release": str(release) if release else None,
        "overrides": [o.as_json() for o in overrides],
        "excluded": list(excluded),
    }


def finished(known: Mapping[str, Any], installed: str | None, now: dt.datetime) -> dict[str, Any]:
    """A planned stamp with the version installed and the time (pure)."""
    return {
        "asked": known.get("asked"),
        "package": known.get("package"),
        "release": known.get("release"),
        "installed": installed,
        "overrides": list(known.get("overrides") or []),
        "excluded": list(known.get("excluded") or []),
        "at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write(data: dict[str, Any], prefix: str | None = None) -> Path:
    target = path(prefix)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(target)
    return target


def read(prefix: str | None = None) -> dict[str, Any] | None:
    try:
        data = json.loads(path(prefix).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def overrides_in_force(
    data: dict[str, Any] | None, installed: Callable[[str], str | None] | None = None
) -> list[str]:
    """The overrides a stamp records, while its release is the one installed (pure given
    `installed`, the installed version of a distribution)."""
    if not data or not data.get("package") or not data.get("installed"):
        return []
    if (installed or installed_version)(str(data["package"])) != data["installed"]:
        return []
    return [str(o["requirement"]) for o in data.get("overrides") or [] if o.get("requirement")]


# --- in an image's build -------------------------------------------------------------------


def write_planned(text: str, prefix: str | None = None) -> Path:
    """Finishes a stamp planned on the host with the installed version, into this prefix.
    ValueError without one: a stamp naming no installed version would record nothing."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"the planned stamp is not JSON: {text[:80]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("overrides", []), list):
        raise ValueError(f"the planned stamp is not an object with overrides: {text[:80]!r}")
    package = str(data.get("package") or "vllm")
    installed = installed_version(package)
    if installed is None:
        raise ValueError(f"{package} is not installed in {sys.prefix}, so nothing is stamped")
    return write(finished(data, installed, dt.datetime.now(dt.timezone.utc)), prefix)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kvrig.provision.stamp write PLANNED`, in an image's build once vLLM and
    the rig (which runs it) are installed."""
    p = argparse.ArgumentParser(prog="python -m kvrig.provision.stamp")
    p.add_argument("action", choices=["write"])
    p.add_argument("planned", help="the stamp as kvrig.containers planned it (JSON)")
    ns = p.parse_args(argv)
    try:
        target = write_planned(ns.planned)
    except ValueError as exc:
        print(f"kvrig: {exc}", file=sys.stderr)
        return 2
    said = overrides_in_force(read(str(target.parent)))
    note = f"; overrides in force: {' '.join(said)}" if said else ""
    print(f"kvrig: stamp {target}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
