"""What `kvrig setup vllm` installed into an environment, kept in the environment.

An override (kvrig.provision.pins) makes the environment not the release's own, and only
the install knows it: a cell's process, a record, the report and the gate see vLLM's
version and nothing of flashinfer's. So the install leaves a small stamp in the
environment's prefix, and every cell reads it (kvrig.run.identity). A stamp counts only
while the release it names is still the one installed: a vLLM installed over it by
other means makes it stale, and a stale stamp says nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from kvrig.provision.install import Plan

FILE = "kvrig-vllm.json"


def path(prefix: str | None = None) -> Path:
    return Path(prefix or sys.prefix) / FILE


def content(plan: Plan, installed: str | None, asked: str, now: dt.datetime) -> dict[str, Any]:
    """The stamp of a finished install (pure): the command, the release and the version
    that landed, the overrides with why, what the plan kept out, and when."""
    release = plan.release
    return {
        "asked": asked,
        "package": release.package if release else None,
        "release": str(release) if release else None,
        "installed": installed,
        "overrides": [o.as_json() for o in plan.overrides],
        "excluded": list(plan.excluded),
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
