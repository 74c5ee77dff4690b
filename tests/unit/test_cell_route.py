"""A cell's route: the kvrig functions one cell is handed to on its way through
`run_and_judge`, measured so the route cannot grow back unseen: a route that bounces
between layers is logic that belongs in one place.

The route is traced, not read: sys.setprofile records every call of a kvrig function
whose arguments hold the Cell object itself (by identity; `self` too, so the Cell's own
methods count). Only the runner's process is traced: the cell's own process starts from
the cell written to its workdir (a copy, not the object), and here it is the runner's
test hook (FAULT_ENV "fake:0") instead of vLLM. A "climb" is a step of the route, in call
order, from a stop in a lower import layer (pyproject's [tool.importlinter]) to one in a
higher layer; a "return" is a stop in a file the route had already left.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import tomllib

import kvrig
from kvrig.column.one_cell import Judged, run_and_judge
from kvrig.define.cells import Cell, expand
from kvrig.define.column_names import columns, parse
from kvrig.define.matrix import load
from kvrig.run.cell import FAULT_ENV

from .builders import ROOT

MAX_STOPS = 45  # a function handed the whole cell is one more that depends on all of it
# The longest routes of all columns' cells, one per platform: a
# sibling-rejecting XPU cell, an unsupported CPU one, a CUDA sparse-MLA sibling, ROCm's
# accepted sibling on an emulated device.
CELLS = (
    "xpu-granite_hybrid-sibling_rejects",
    "cpu-deepseek_v32-default",
    "cuda-sm90-deepseek_v32-sparse_sibling_rejects",
    "rocm-gfx942-emulated-granite_hybrid-sibling_accepts",
)
PACKAGE = Path(kvrig.__file__).resolve().parent
_VARARGS, _VARKW = 0x04, 0x08  # CPython's CO_VARARGS and CO_VARKEYWORDS


def layers() -> dict[str, int]:
    """kvrig's subpackage -> its rank in the layers contract (0 is the top), read from
    pyproject so the measure follows the contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = (c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return {
        name.strip().removeprefix("kvrig."): rank
        for rank, layer in enumerate(contract["layers"])
        for name in layer.split("|")
    }


@dataclass(frozen=True)
class Stop:
    """One call that was handed the cell."""

    module: str  # kvrig.run.runner
    function: str  # its qualified name
    file: str  # relative to src/kvrig

    @property
    def subpackage(self) -> str:
        return self.module.split(".")[1] if "." in self.module else ""


@dataclass(frozen=True)
class Figures:
    stops: int  # distinct functions
    files: int  # distinct files
    climbs: int  # steps up the layers
    returns: int  # stops in a file the route had left
    calls: int  # calls, repeats included


def _arguments(frame: FrameType) -> list[Any]:
    """The values a call was handed, *args and **kwargs spread out."""
    code = frame.f_code
    named = code.co_argcount + code.co_kwonlyargcount
    spread = bool(code.co_flags & _VARARGS) + bool(code.co_flags & _VARKW)
    names = code.co_varnames[: named + spread]
    values: list[Any] = []
    for i, name in enumerate(names):
        value = frame.f_locals.get(name)
        if i >= named and isinstance(value, tuple):
            values.extend(value)
        elif i >= named and isinstance(value, dict):
            values.extend(value.values())
        else:
            values.append(value)
    return values


def follow(cell: Cell, call: Callable[[], object]) -> list[Stop]:
    """The stops `call` makes the cell take in this process, in call order."""
    route: list[Stop] = []
    prefix = str(PACKAGE) + "/"

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(prefix):
            return
        if any(value is cell for value in _arguments(frame)):
            route.append(
                Stop(
                    frame.f_globals.get("__name__", ""),
                    frame.f_code.co_qualname,
                    frame.f_code.co_filename.removeprefix(prefix),
                )
            )

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return route


def figures(route: Sequence[Stop], rank: dict[str, int]) -> Figures:
    climbs = sum(rank[b.subpackage] < rank[a.subpackage] for a, b in pairwise(route))
    left: set[str] = set()
    returns = 0
    for a, b in pairwise(route):
        if b.file != a.file:
            left.add(a.file)
            returns += b.file in left
    return Figures(
        stops=len({(s.module, s.function) for s in route}),
        files=len({s.file for s in route}),
        climbs=climbs,
        returns=returns,
        calls=len(route),
    )


def bounces(route: Sequence[Stop]) -> Counter[tuple[str, str]]:
    """How often the route goes from one file to another and straight back (A -> B -> A),
    by the pair of files: where it goes back and forth."""
    files = [s.file for i, s in enumerate(route) if i == 0 or s.file != route[i - 1].file]
    return Counter((a, b) for a, b, c in zip(files, files[1:], files[2:], strict=False) if a == c)


def _cell(cell_id: str) -> Cell:
    column = next(c for c in sorted(columns(), key=len, reverse=True) if cell_id.startswith(c))
    where = parse(column)
    assert where is not None
    cells = expand(
        load(ROOT / "matrix.yaml"),
        where.platform,
        isa=where.isa,
        gpu_arch=where.gpu_arch,
        device_emulated=where.device_emulated,
    )
    found = [c for c in cells if c.id == cell_id]
    assert found, f"{cell_id} is no cell of matrix.yaml now: name the longest route instead"
    return found[0]


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Stop]]:
    """Each cell of CELLS run and judged once, for real, by the runner's test hook."""
    out = {}
    for cell_id in CELLS:
        cell = _cell(cell_id)
        folder = tmp_path_factory.mktemp("route")
        judged: list[Judged] = []

        def run(c: Cell = cell, f: Path = folder, into: list[Judged] = judged) -> None:
            into.append(run_and_judge(c, f, env_overrides={FAULT_ENV: "fake:0"}))

        out[cell_id] = follow(cell, run)
        assert judged[0].record.outcome == "ran", judged[0].record.note
    return out


def _report(routes: dict[str, list[Stop]]) -> tuple[str, Figures]:
    rank = layers()
    longest = max(routes, key=lambda k: figures(routes[k], rank).stops)
    route = routes[longest]
    figs = figures(route, rank)
    visits = Counter(s.file for s in route)
    lines = [f"{k}: {figures(v, rank)}" for k, v in routes.items()]
    lines += [f"longest, {longest}: {figs}", "most visited files:"]
    lines += [f"  {n:3d} {f}" for f, n in visits.most_common(10)]
    lines += ["bounces (A -> B -> A):"]
    lines += [f"  {n:3d} {a} <-> {b}" for (a, b), n in bounces(route).most_common(5)]
    return "\n".join(lines), figs


def test_the_route_is_traced_from_run_and_judge(routes: dict[str, list[Stop]]) -> None:
    text, figs = _report(routes)
    print("\n" + text)
    for route in routes.values():
        assert route[0] == Stop("kvrig.column.one_cell", "run_and_judge", "column/one_cell.py")
    assert figs.files <= figs.stops <= figs.calls


def test_a_cells_route_takes_at_most_45_stops(routes: dict[str, list[Stop]]) -> None:
    text, figs = _report(routes)
    assert figs.stops <= MAX_STOPS, text


def _stop(file: str, name: str = "f") -> Stop:
    module = "kvrig." + file.removesuffix(".py").replace("/", ".")
    return Stop(module, name, file)


def test_climbs_count_steps_up_the_layers_and_returns_count_files_left_before() -> None:
    rank = layers()
    route = [
        _stop("column/one_cell.py", "run_and_judge"),
        _stop("run/runner.py", "run_unsaved"),
        _stop("define/cells.py", "Cell.id"),
        _stop("run/runner.py", "_prepare"),  # a climb, and a return
        _stop("define/cells.py", "Cell.id"),  # a return
        _stop("judge/verdict.py", "judge"),  # a climb
    ]
    assert figures(route, rank) == Figures(stops=5, files=4, climbs=2, returns=2, calls=6)
    assert bounces(route) == Counter(
        {("run/runner.py", "define/cells.py"): 1, ("define/cells.py", "run/runner.py"): 1}
    )


def test_a_cell_handed_on_in_args_or_kwargs_is_seen() -> None:
    cell = _cell(CELLS[1])

    def through(first: object, *args: object, **kwargs: object) -> FrameType:
        return sys._getframe()

    assert any(v is cell for v in _arguments(through(None, cell)))
    assert any(v is cell for v in _arguments(through(None, key=cell)))
    assert not any(v is cell for v in _arguments(through(None, cell.case, key=cell.config)))


def test_only_kvrig_functions_are_stops() -> None:
    cell = _cell(CELLS[1])
    assert follow(cell, lambda: print(end="")) == []
    stops = follow(cell, lambda: cell.id)
    assert stops[0].function == "Cell.id"
    assert {s.file for s in stops} == {"define/cells.py"}
