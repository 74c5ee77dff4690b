"""What a reach run's cells left: per cell, the vLLM it ran and the arcs it took in each
of the table's files, read from coverage.py's data files."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kvrig.publish.reach.arms import Arc
from kvrig.run import reach as hook


@dataclass(frozen=True)
class Cell:
    """One cell's coverage, the union of its processes' (its own, forked ranks, spawned
    engine cores and workers)."""

    id: str
    column: str
    platform: str | None
    vllm: str | None
    vllm_root: str | None
    error: str | None = None
    processes: int = 0
    arcs: dict[str, frozenset[Arc]] = field(default_factory=dict)  # vLLM-relative file


@dataclass(frozen=True)
class Column:
    """A column's cells as measured, and the cells it ran that left no data."""

    name: str
    cells: tuple[Cell, ...]
    unmeasured: tuple[str, ...]  # cell ids with a results row and no coverage data


def read_root(root: Path) -> list[Column]:
    """Every column under a reach run's folder (<root>/<column>/coverage/)."""
    return [
        read_column(folder)
        for folder in sorted(p.parent for p in root.glob(f"*/{hook.DATA_FOLDER}"))
        if folder.is_dir()
    ]


def read_column(results: Path) -> Column:
    folder = hook.data_folder(results)
    metas = {p.stem: json.loads(p.read_text()) for p in folder.glob(f"*{hook.META_SUFFIX}")}
    files: dict[str, list[Path]] = defaultdict(list)
    for path in folder.glob(f"*{hook.DATA_SUFFIX}.*"):
        files[path.name.split(hook.DATA_SUFFIX + ".", 1)[0]].append(path)
    root = next((m["vllm_root"] for m in metas.values() if m.get("vllm_root")), None)
    cells = tuple(
        _cell(cell_id, results.name, metas.get(cell_id, {}), files.get(cell_id, []), root)
        for cell_id in sorted(set(metas) | set(files))
    )
    ran = _cells_run(results)
    unmeasured = tuple(c for c in ran if c not in files)
    return Column(results.name, cells, unmeasured)


def _cells_run(results: Path) -> list[str]:
    """The cells the column ran (its results rows), skipped ones aside."""
    rows = results / "results.jsonl"
    if not rows.is_file():
        return []
    out = []
    for line in rows.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("outcome") != "skipped":
                out.append(row["cell_id"])
    return sorted(set(out))


def _cell(
    cell_id: str, column: str, meta: dict[str, object], paths: list[Path], root: str | None
) -> Cell:
    vllm_root = str(meta.get("vllm_root") or root or "") or None
    arcs: dict[str, set[Arc]] = defaultdict(set)
    for path in paths:
        for name, found in read_arcs(path).items():
            arcs[relative(name, vllm_root)] |= found
    return Cell(
        id=cell_id,
        column=column,
        platform=meta.get("platform"),  # type: ignore[arg-type]
        vllm=meta.get("vllm"),  # type: ignore[arg-type]
        vllm_root=vllm_root,
        error=meta.get("error"),  # type: ignore[arg-type]
        processes=len(paths),
        arcs={k: frozenset(v) for k, v in arcs.items()},
    )


def read_arcs(path: Path) -> dict[str, set[Arc]]:
    """One process's data file: each measured file's raw arcs."""
    from coverage import CoverageData

    data = CoverageData(basename=str(path))
    data.read()
    return {name: set(data.arcs(name) or ()) for name in data.measured_files()}


def relative(path: str, vllm_root: str | None) -> str:
    """A measured file's path inside the vllm package: under the cell's vLLM when known,
    else after the last `/vllm/`."""
    if vllm_root and path.startswith(vllm_root.rstrip("/") + "/"):
        return path[len(vllm_root.rstrip("/")) + 1 :]
    return path.rpartition("/vllm/")[2]


def sources(root: str, files: tuple[str, ...]) -> dict[str, str | None]:
    """The text of each table file in one installed vLLM (None: the release has no such
    file)."""
    out: dict[str, str | None] = {}
    for name in files:
        path = Path(root) / name
        out[name] = path.read_text() if path.is_file() else None
    return out
