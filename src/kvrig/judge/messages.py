"""What vLLM's two block-size checks say of a size in their errors.

A module of its own because the verdict and the comparison with the computed size must read
these messages the same way without either importing the other.
"""

from __future__ import annotations

import re

# The function of vLLM's early alignment check (kvrig.define.checks names it too, checking
# the matrix's cases from a layer that cannot import this one).
EARLY_FUNCTION = "_check_aligned_block_size"
_EARLY_MESSAGE = re.compile(
    r"Aligned KV cache block size (\d+) is not supported by attention backend\(s\): (.+?)\.?$"
)


def early_error_backends(message: str) -> tuple[int, list[str]] | None:
    """(size, backends) of the early check's message, or None when the first line is not
    it: the size is the one vLLM chose, the backends the ones a cell must name exactly."""
    m = _EARLY_MESSAGE.search(message.strip().splitlines()[0] if message.strip() else "")
    if not m:
        return None
    return int(m.group(1)), [n.strip() for n in m.group(2).split(",") if n.strip()]


_LATE_MESSAGE = re.compile(r"No common block size for (\d+)")


def late_error_size(message: str) -> int | None:
    """The size the worker's late check names ("No common block size for 128"): compared
    with the computed size, since a pattern without it would pass a failure at any size."""
    m = _LATE_MESSAGE.search(message)
    return int(m.group(1)) if m else None
