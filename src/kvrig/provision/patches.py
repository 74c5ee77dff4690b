"""A diff of vLLM's tree, read and applied in memory (whatthepatch), exactly where it says.

The same code reads a patch on the host (which files it touches: compiled code is
refused there) and applies it over the installed vLLM, on the host or in an image build,
where no git need be installed. Hunks apply at the lines the diff names, with every
context line as written: a patch made against another vLLM than the base is refused
rather than fuzzed onto it. Pure: text in, texts or an error out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import whatthepatch
from whatthepatch.exceptions import HunkApplyException, WhatThePatchException

NULL = "/dev/null"


class PatchError(Exception):
    """Why a patch cannot be read or applied, in words the caller puts in its paragraph."""


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the tree's root, `a/`/`b/` stripped
    created: bool
    deleted: bool
    diff: Any  # whatthepatch's diff


def _strip(path: str | None) -> str | None:
    if path is None or path == NULL:
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


def read(text: str) -> list[FileDiff]:
    """The file diffs of a unified diff (git diff's, or diff -u's)."""
    try:
        diffs = list(whatthepatch.parse_patch(text))
    except (WhatThePatchException, AssertionError, ValueError) as exc:
        # whatthepatch asserts on a malformed binary hunk
        why = str(exc) or "a malformed or binary hunk"
        raise PatchError(f"it cannot be read as a unified diff of text ({why})") from None
    out = []
    for d in diffs:
        if d.header is None:
            continue
        old, new = _strip(d.header.old_path), _strip(d.header.new_path)
        path = new or old
        if path is None:
            continue
        if not d.changes or "GIT binary patch" in (d.text or ""):
            raise PatchError(f"its diff of {path} has no text hunks (a rename or a binary diff)")
        # git names both sides in its `diff --git` line; /dev/null is on the --- or +++ line
        lines = (d.text or "").splitlines()
        created = (
            old is None
            or f"--- {NULL}" in lines
            or any(x.startswith("new file mode") for x in lines)
        )
        deleted = (
            new is None
            or f"+++ {NULL}" in lines
            or any(x.startswith("deleted file mode") for x in lines)
        )
        out.append(FileDiff(path, created=created, deleted=deleted, diff=d))
    if not out:
        raise PatchError("it holds no file diff")
    return out


def apply(diffs: list[FileDiff], read_file: Callable[[str], str | None]) -> dict[str, str | None]:
    """The new text of every file the diffs touch (None: deleted), from the old texts
    `read_file` gives (None: no such file)."""
    out: dict[str, str | None] = {}
    for fd in diffs:
        old = None if fd.created else read_file(fd.path)
        if old is None and not fd.created:
            raise PatchError(f"it changes {fd.path}, which the base does not have")
        if fd.created and read_file(fd.path) is not None:
            raise PatchError(f"it creates {fd.path}, which the base already has")
        try:
            lines = whatthepatch.apply_diff(fd.diff, (old or "").splitlines())
        except HunkApplyException as exc:
            raise PatchError(f"{fd.path}: {exc}") from None
        if fd.deleted:
            out[fd.path] = None
            continue
        ends = old is None or old.endswith("\n")
        out[fd.path] = "\n".join(lines) + ("\n" if ends and lines else "")
    return out
