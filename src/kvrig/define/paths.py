"""Where a column's results live: `results/<column>`, `results/<column>-shard<i>`.

Report and gate read these folders by default, so the names are decided here once; side
runs kept under results/ (`cpu-mutation`, `cpu-container`, `<column>-overlay-<digest>`)
match none of them and never mix in. A CI job's artifact `kvrig-<column>[-shard<i>]` is a
release folder too once downloaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

RESULTS_ROOT = Path("results")
ARTIFACT_PREFIX = "kvrig-"
MUTATION = "cpu-mutation"
MUTATION_CONTAINER = "cpu-mutation-container"
CONTAINER = "cpu-container"


def column_name(platform: str, cls: str | None = None) -> str:
    """A results column: the platform, or `<platform>-<class>` for a CPU class the rig
    emulates (None: the host's own class, read not set)."""
    return f"{platform}-{cls}" if cls else platform


def results_folder(column: str, shard: int | str | None = None, root: Path = RESULTS_ROOT) -> Path:
    """The default folder of a column's run (or of one shard of it)."""
    return root / (column if shard is None else f"{column}-shard{shard}")


def artifact_name(column: str, shard: int | str | None = None) -> str:
    """The CI artifact a column's (or a shard's) results folder is uploaded as."""
    return ARTIFACT_PREFIX + results_folder(column, shard, Path()).name


def column_of_folder(name: str, columns: Iterable[str]) -> str | None:
    """The column a release folder belongs to (`<column>`, `<column>-shard<i>`, or either
    as a CI artifact), or None for anything else under results/, side runs included."""
    bare = name.removeprefix(ARTIFACT_PREFIX)
    for column in sorted(columns, key=len, reverse=True):
        if bare == column or re.fullmatch(rf"{re.escape(column)}-shard\d+", bare):
            return column
    return None


def column_of_side_folder(name: str, columns: Iterable[str]) -> str | None:
    """The column a side run's folder is named for (`cpu-mutation`: cpu; an overlay's
    `cpu-avx2-overlay-1a2b3c4d`: cpu-avx2), or None when its name starts with none."""
    bare = name.removeprefix(ARTIFACT_PREFIX)
    for column in sorted(columns, key=len, reverse=True):
        if bare == column or bare.startswith(f"{column}-"):
            return column
    return None


def column_folders(root: Path, columns: Iterable[str]) -> list[Path]:
    """The column folders under `root` (results/), sorted."""
    if not root.is_dir():
        return []
    known = list(columns)
    return sorted(p for p in root.iterdir() if p.is_dir() and column_of_folder(p.name, known))
