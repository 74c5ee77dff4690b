"""Where a column's results live: `results/<column>`, `results/<column>-shard<i>`.

A column is a platform, or `cpu-<class>` for a CPU class the rig emulates. Report and
gate read these folders by default, so the names are decided here once; side runs kept
under results/ (the mutation check's `cpu-mutation` and `cpu-mutation-container`, the
container check's `cpu-container`, an overlay's `<column>-overlay-<digest>`) match none of
them and never mix in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

RESULTS_ROOT = Path("results")
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


def column_of_folder(name: str, columns: Iterable[str]) -> str | None:
    """The column a folder name belongs to, or None for anything else under results/."""
    for column in sorted(columns, key=len, reverse=True):
        if name == column or re.fullmatch(rf"{re.escape(column)}-shard\d+", name):
            return column
    return None


def column_folders(root: Path, columns: Iterable[str]) -> list[Path]:
    """The column folders under `root` (results/), sorted."""
    if not root.is_dir():
        return []
    known = list(columns)
    return sorted(p for p in root.iterdir() if p.is_dir() and column_of_folder(p.name, known))
