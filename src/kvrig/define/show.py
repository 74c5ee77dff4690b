"""A case or a cell as matrix.yaml expands it, each value after the line it comes from:
`kvrig cells --show ID`.

The short form says each thing once, so the line a value is written on is often not the
case's own, and what a cell expects on one CPU class or GPU is spread over `expect`,
`expect_by_isa` and `expect_by_arch`. This prints the validated case field by field and
every cell it makes, each beside the line that says so ("default" where the schema's
default stands). An ID is a case's id, `<model>-<case>`, or a cell id.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kvrig.define import column_names, gpus, lines, shorthands
from kvrig.define.cells import Cell, by_arch, expand
from kvrig.define.matrix import Matrix
from kvrig.host import isa

if TYPE_CHECKING:
    from kvrig.define.column_names import Column

# The parts of a case shown one entry per row (a knob, a platform's expectation, a sibling).
_SPLIT = {
    (),
    ("knobs",),
    ("crafted",),
    ("crafted", "siblings"),
    ("expect",),
    ("expect_by_isa",),
    ("expect_by_arch",),
    ("known_defect",),
    ("known_defect", "shows"),
}
DEFAULT = "default"


class UnknownId(LookupError):
    """An ID that names no case or cell: the message says so and names the nearest."""


@dataclass(frozen=True)
class _Wanted:
    """The cases an ID names (by index into the matrix's cases) and the column it narrows
    their cells to (None: every column)."""

    indices: list[int]
    column: Column | None = None


def show(matrix: Matrix, wanted: str) -> list[str]:
    """The lines `kvrig cells --show` prints; UnknownId for an ID that names nothing."""
    if matrix.path is None:
        raise UnknownId("--show reads the lines of a matrix file; this matrix was built in code")
    parsed = lines.parse(matrix.path.read_text(encoding="utf-8"))
    written = shorthands.expand(parsed).get("cases") or []
    facts = shorthands.cpu_facts(parsed)
    every = _every_cell(matrix)
    chosen = _resolve(matrix, every, wanted)
    where = _where(matrix.path)
    out: list[str] = []
    for i in chosen.indices:
        case = matrix.cases[i]
        raw = written[i]
        if (raw.get("model"), raw.get("id")) != (case.model, case.id):
            raise RuntimeError(f"the expanded case {i} is not the loaded one ({case.id})")
        rows = list(_case_rows(case, raw, where))
        rows += _fact_rows(facts.get((case.model, case.id)), where)
        cells = [c for c in every if _same(c, case) and _on(c, chosen.column)]
        out.append(f"{case.model}-{case.id}: the case as it expands, each value after its line")
        out += _aligned(rows)
        host = f" (a CPU host's cpu-{case.model}-{case.id} is its class's)"
        on_cpu = any(c.platform == "cpu" for c in cells)
        out.append(f"its cells, each with the expectation it follows{host * on_cpu}:")
        out += _aligned([_cell_row(cell, raw, where) for cell in cells])
        out.append("")
    return out[:-1]


def _where(path: Path) -> str:
    """The file as a reader types it: relative to the working folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _every_cell(matrix: Matrix) -> list[Cell]:
    """Each case on every column kvrig knows: a CPU class each, a CUDA architecture each."""
    out: list[Cell] = []
    for platform in matrix.platforms:
        if platform == "cpu":
            for cls in isa.CLASSES:
                out += expand(matrix, "cpu", isa=cls, emulated=True)
        elif platform in gpus.BY_ARCH:
            for arch in gpus.GPUS[platform]:
                out += expand(matrix, platform, gpu_arch=arch)
        else:
            out += expand(matrix, platform)
    return out


def _resolve(matrix: Matrix, every: list[Cell], wanted: str) -> _Wanted:
    """What an ID names: a case id, `<model>-<case>`, or a cell id on one column."""
    by_name = {f"{c.model}-{c.id}": i for i, c in enumerate(matrix.cases)}
    same_id = [i for i, c in enumerate(matrix.cases) if c.id == wanted]
    if same_id:
        return _Wanted(same_id)
    if wanted in by_name:
        return _Wanted([by_name[wanted]])
    for name, index in by_name.items():
        column = _column_of(wanted, name)
        if column is not None:
            return _Wanted([index], column)
    cells = {c.id for c in every} | {f"{c.platform}-{c.model_name}-{c.case.id}" for c in every}
    names = sorted({c.id for c in matrix.cases} | set(by_name) | cells)
    near = difflib.get_close_matches(wanted, names, n=5, cutoff=0.6)
    hint = f"the nearest: {', '.join(near)}" if near else "none is near it"
    raise UnknownId(
        f"--show {wanted}: no case or cell of {matrix.path} has that id ({hint}). Give a"
        " case's id (default), <model>-<case> (granite_hybrid-default) or a cell id"
        " (cpu-granite_hybrid-default); `kvrig cells` lists the cells."
    )


def _column_of(wanted: str, name: str) -> Column | None:
    """The column of a cell id `<column>-<name>`, when `wanted` is one."""
    prefix = wanted.removesuffix(f"-{name}")
    if prefix == wanted:
        return None
    return column_names.parse(prefix)


def _same(cell: Cell, case: Any) -> bool:
    return (cell.model_name, cell.case.id) == (case.model, case.id)


def _on(cell: Cell, column: Column | None) -> bool:
    """Whether the cell is on the column an ID named (any, when it named none): a CPU
    cell id without a class stands for every class, a CUDA one without a GPU for each."""
    if column is None:
        return True
    if cell.platform != column.platform:
        return False
    if column.isa is not None and cell.isa != column.isa:
        return False
    return column.gpu_arch is None or cell.gpu_arch == column.gpu_arch


def _case_rows(case: Any, raw: dict[str, Any], where: str) -> Iterator[tuple[str, str, str]]:
    """Each field of the validated case, split where _SPLIT says, at its line."""
    for path, value in _split((), case.model_dump(mode="json", exclude_none=True)):
        yield _at(raw, path, where), ".".join(str(p) for p in path), _flow(value)


def _split(path: tuple[Any, ...], value: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, value) pairs: a part of _SPLIT one row per entry, an empty one as itself."""
    if path in _SPLIT and isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from _split((*path, key), sub)
    elif path in _SPLIT and isinstance(value, list) and value:
        for i, sub in enumerate(value):
            yield from _split((*path, i), sub)
    else:
        yield path, value


def _at(raw: dict[str, Any], path: tuple[Any, ...], where: str) -> str:
    """`file:line` of a value the expanded case writes at `path`; DEFAULT when the file
    does not write it (the schema's default stands)."""
    node: Any = raw
    for part in path:
        if not _holds(node, part):
            return DEFAULT
        node = node[part]
    line = lines.line_of(raw, path)
    return f"{where}:{line}" if line else DEFAULT


def _holds(node: Any, part: Any) -> bool:
    """Whether the parsed file writes `part` in `node` (a mapping's key, a list's index)."""
    if isinstance(node, dict):
        return part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


def _fact_rows(facts: Any, where: str) -> list[tuple[str, str, str]]:
    """The case's CPU facts (kvrig.define.measured) as rows, when it writes any."""
    if facts is None:
        return []
    rows = []
    if facts.measured is not None:
        sizes = ", ".join(f"{c} {facts.measured[c] or 'refused'}" for c in isa.CLASSES)
        rows.append((_line(where, facts.lines.get("measured")), "measured", sizes))
    if facts.cpu_next is not None:
        rows.append((_line(where, facts.lines.get("cpu_next")), "cpu_next", facts.cpu_next))
    return rows


def _line(where: str, line: int | None) -> str:
    return f"{where}:{line}" if line else DEFAULT


def _cell_row(cell: Cell, raw: dict[str, Any], where: str) -> tuple[str, str, str]:
    """A cell and the expectation it follows on its column, at the line that says so."""
    text = _flow(cell.expect.model_dump(mode="json", exclude_none=True))
    defect = cell.defect
    if defect is not None:
        shows = _flow(defect.model_dump(mode="json", exclude_none=True))
        at = _at(raw, ("known_defect", "shows", cell.platform), where)
        text += f"; a known defect shows {shows} ({at})"
    return _at(raw, _followed(cell), where), cell.id, text


def _followed(cell: Cell) -> tuple[Any, ...]:
    """Where the expectation a cell follows is written: its class's or its GPU's own
    refinement, else its platform's."""
    case = cell.case
    if cell.platform == "cpu" and cell.isa in case.expect_by_isa:
        return ("expect_by_isa", cell.isa)
    if cell.platform in gpus.ARCH_KEYED and cell.gpu_arch is not None:
        chosen = by_arch(case, cell.gpu_arch)
        for key, entry in case.expect_by_arch.items():
            if chosen is not None and entry.expect is chosen:
                return ("expect_by_arch", key, "expect")
    return ("expect", cell.platform)


def _flow(value: Any) -> str:
    """A value as YAML writes it on one line."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 20)
        return text.strip()
    return str(value)


def _aligned(rows: list[tuple[str, str, str]]) -> list[str]:
    """Rows as three columns: where, what, the value."""
    if not rows:
        return ["  (none on this column)"]
    width = max(len(at) for at, _, _ in rows)
    name = max(len(what) for _, what, _ in rows)
    return [f"  {at:<{width}}  {what:<{name}}  {value}".rstrip() for at, what, value in rows]
