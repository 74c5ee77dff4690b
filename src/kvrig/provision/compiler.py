"""What CPU engines need to compile: a C++ compiler and this interpreter's headers.

vLLM compiles a few helpers even in eager mode (the vocab-parallel embedding's mask, with
tensor parallelism), and on CPU torch's inductor builds them as C++ against Python.h; a
host without either fails those cells mid-run with a compile error.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path


def needed(
    which: Callable[[str], str | None] = shutil.which,
    include: str | None = None,
    version: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
) -> list[str]:
    """The Debian packages that would supply what is missing (pure, given its facts)."""
    out = []
    if which("g++") is None:
        out.append("g++")
    headers = Path(include or sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        out.append(f"python{version[0]}.{version[1]}-dev")  # Debian's name for them
    return out
