"""Which uv kvrig runs: the one nox names in $UV, else uv on PATH.

nox may run its own uv from outside PATH (`pipx install nox[uv]`) and names it in $UV;
every uv kvrig starts is found the same way, so they all read one cache.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping


def find(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> str | None:
    """The uv executable, or None when there is none to run."""
    environ = os.environ if environ is None else environ
    named = environ.get("UV")
    if named and which(named):
        return which(named)
    return which("uv")
