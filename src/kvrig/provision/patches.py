"""A diff of vLLM's tree, read and applied in memory (whatthepatch), exactly where it says.

In memory because an image build has no git. A patch made against another vLLM is refused
rather than fuzzed onto it. One allowance: vLLM moves a function a few lines between
releases without changing it, so a hunk that names its function (git's `diff=python`)
and misses its lines is looked for, exactly and once, inside that function.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import whatthepatch
from whatthepatch.exceptions import HunkApplyException, WhatThePatchException

NULL = "/dev/null"
# A unified diff's hunk header; git writes the enclosing function's line after the second @@.
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")
DEF = re.compile(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(")


class PatchError(Exception):
    """Why a patch cannot be read or applied, in words the caller puts in its paragraph."""


class HunkNotInFunction(PatchError):
    """A hunk that names its function matched neither at its lines nor inside it: the patch
    must be remade for this release, which the caller names."""

    def __init__(self, message: str, path: str, function: str, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.function = function
        self.line = line


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the tree's root, `a/`/`b/` stripped
    created: bool
    deleted: bool
    diff: Any  # whatthepatch's diff


@dataclass(frozen=True)
class Hunk:
    """One hunk of a file diff: where it says it goes, and the function it says it edits."""

    line: int  # the old file's line its header names
    function: str | None  # the def named after the second @@, if any
    changes: tuple[Any, ...]  # whatthepatch's changes of this hunk

    @property
    def old(self) -> list[tuple[int, str]]:
        """Its context and removed lines with their line numbers: what must match."""
        return [(c.old, c.line) for c in self.changes if c.old is not None]


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
        placed = fd.diff if old is None else _placed(fd, old)
        try:
            lines = whatthepatch.apply_diff(placed, (old or "").splitlines())
        except HunkApplyException as exc:
            raise PatchError(f"{fd.path}: {exc}") from None
        if fd.deleted:
            out[fd.path] = None
            continue
        ends = old is None or old.endswith("\n")
        out[fd.path] = "\n".join(lines) + ("\n" if ends and lines else "")
    return out


# --- hunks that name their function ---------------------------------------------------------


def hunks(fd: FileDiff) -> list[Hunk]:
    """The file diff's hunks with their headers; a diff whose headers cannot be paired with
    whatthepatch's hunks (a context diff, an ed script) gets none named, so stays strict."""
    headers = [m for m in map(HUNK_HEADER.match, (fd.diff.text or "").splitlines()) if m]
    changes = list(fd.diff.changes or [])
    numbers = sorted({c.hunk for c in changes})
    if numbers != list(range(1, len(headers) + 1)):
        return [Hunk(0, None, tuple(c for c in changes if c.hunk == n)) for n in numbers]
    out = []
    for n, header in enumerate(headers, start=1):
        named = DEF.match(header.group(2))
        out.append(
            Hunk(
                line=int(header.group(1)),
                function=named.group(1) if named else None,
                changes=tuple(c for c in changes if c.hunk == n),
            )
        )
    return out


def _matches(lines: Sequence[str], hunk: Hunk, shift: int) -> bool:
    return all(0 < n + shift <= len(lines) and lines[n + shift - 1] == text for n, text in hunk.old)


def _placed(fd: FileDiff, old: str) -> Any:
    """The file diff with each hunk that names its function and misses its lines moved to
    where they are in that function; the others left for whatthepatch to report."""
    lines = old.splitlines()
    shifts = []
    for hunk in hunks(fd):
        moved = hunk.function is not None and bool(hunk.old) and not _matches(lines, hunk, 0)
        shifts.append((hunk, _locate(fd.path, old, lines, hunk) if moved else 0))
    if not any(shift for _, shift in shifts):
        return fd.diff
    _check_order(fd.path, shifts)

    def shifted(c: Any, by: int) -> Any:
        return c._replace(
            old=None if c.old is None else c.old + by, new=None if c.new is None else c.new + by
        )

    return fd.diff._replace(changes=[shifted(c, by) for hunk, by in shifts for c in hunk.changes])


def _check_order(path: str, shifts: list[tuple[Hunk, int]]) -> None:
    """Hunks moved into their functions must still come one after the other, apart: else
    applying them in the diff's order would interleave their lines."""
    end = 0
    for hunk, shift in shifts:
        first = hunk.old[0][0] + shift if hunk.old else hunk.line + 1
        if first <= end:
            raise PatchError(
                f"{path}: the hunk at line {hunk.line}, found at line {first}, overlaps or"
                " comes before the hunk ahead of it in the diff"
            )
        end = hunk.old[-1][0] + shift if hunk.old else hunk.line


def _spans(path: str, old: str, hunk: Hunk) -> list[tuple[int, int]]:
    """The lines (first, last) of every def of the hunk's function in the base's file,
    methods and nested functions alike."""
    try:
        tree = ast.parse(old)
    except SyntaxError as exc:
        raise PatchError(
            f"{path}: the hunk at line {hunk.line} does not match there, and {hunk.function}"
            f" cannot be looked for: the file does not parse as Python ({exc.msg}, line"
            f" {exc.lineno})"
        ) from None
    return sorted(
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == hunk.function
    )


def _locate(path: str, old: str, lines: Sequence[str], hunk: Hunk) -> int:
    """How far the hunk moved: its old lines, exact and in order, begin inside exactly one
    place in the function it names (git names the def above the hunk's first line)."""
    name = str(hunk.function)
    spans = _spans(path, old, hunk)
    if not spans:
        raise HunkNotInFunction(
            f"{path} of this vLLM defines no {name}, which the hunk at line {hunk.line}"
            " edits: it was moved to another file or renamed",
            path,
            name,
            hunk.line,
        )
    needle = [text for _, text in hunk.old]
    found = sorted(
        {
            at
            for first, last in spans
            for at in range(first, last + 1)
            if lines[at - 1 : at - 1 + len(needle)] == needle
        }
    )
    if len(found) == 1:
        return found[0] - hunk.old[0][0]
    where = ", ".join(f"{a}-{b}" for a, b in spans)
    if found:
        raise HunkNotInFunction(
            f"{path}: the hunk at line {hunk.line} edits {name}, and its lines are there"
            f" {len(found)} times (at lines {', '.join(map(str, found))} of {name}, lines"
            f" {where}): which one it edits cannot be told",
            path,
            name,
            hunk.line,
        )
    missing = _first_missing(lines, spans, needle)
    raise HunkNotInFunction(
        f"{path}: the hunk at line {hunk.line} edits {name}, but {name} here (lines {where})"
        f' does not hold its lines in order: the first it lacks is "{missing}"',
        path,
        name,
        hunk.line,
    )


def _first_missing(lines: Sequence[str], spans: list[tuple[int, int]], needle: list[str]) -> str:
    """The hunk's line where the longest run of its lines found in the function breaks off."""
    longest = 0
    for first, last in spans:
        for at in range(first - 1, last):
            run = 0
            while run < len(needle) and at + run < len(lines) and lines[at + run] == needle[run]:
                run += 1
            longest = max(longest, run)
    return needle[longest].strip()
