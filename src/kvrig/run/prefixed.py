"""Processes run side by side with their output kept apart: each line a process prints is
prefixed by its name, as it comes, so two columns' interleaved output stays readable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

# One line at a time on stdout and stderr, whichever thread prints it.
PRINTING = threading.Lock()


def run(name: str, command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """The process's exit code, each line it printed (stdout and stderr) prefixed by name."""
    proc = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, **env} if env else None,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        with PRINTING:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()
    return proc.wait()
