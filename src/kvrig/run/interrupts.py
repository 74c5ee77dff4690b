"""Holds Ctrl-C over the few steps that turn a finished cell into its record and results row.

A cell whose record is on disk but whose row is not would be run again on resume, and a
run cut there shows a record that no results row names. Holding SIGINT for those
milliseconds, and raising it right after, keeps the two together; the engine itself is
never held, so Ctrl-C still stops a running cell at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held() -> Iterator[None]:
    """Delays a SIGINT that arrives inside the block until the block ends, then raises
    KeyboardInterrupt (only in the main thread, the one Python delivers signals to)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            signal.raise_signal(signal.SIGINT)  # the handler the caller had decides
