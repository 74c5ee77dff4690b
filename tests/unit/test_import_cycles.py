"""No module of kvrig imports itself back, however far round: the layers contract sees
only imports between layers, so a circle inside one (a module and its helper, a model and
its matrix) would stay until an import order broke it at run time.

Every import counts, those under `if TYPE_CHECKING:` and inside functions too: grimp reads
them all, and a circle that only type checkers walk still ties the modules together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from pathlib import Path

import grimp
import pytest

Graph = Mapping[str, Collection[str]]


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of the package with the package's modules it imports directly."""
    graph = grimp.build_graph(package, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def reachable(graph: Graph, start: str) -> set[str]:
    """The modules an import of `start` reaches through one import or more."""
    seen: set[str] = set()
    todo = deque(graph.get(start, ()))
    while todo:
        module = todo.popleft()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The groups of modules that each reach every other one of their group: the circles,
    found by reachability (kvrig's hundred modules need nothing faster)."""
    reach = {module: reachable(graph, module) for module in graph}
    groups = {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }
    return sorted(sorted(group) for group in groups)


def shortest_cycle(graph: Graph, start: str) -> list[str]:
    """The fewest imports from `start` back to itself, as the chain a reader follows."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        for imported in sorted(graph.get(module, ())):
            if imported == start:
                chain = [start, module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return chain[::-1]
            if imported not in came_from:
                came_from[imported] = module
                todo.append(imported)
    return []


def cycles(graph: Graph) -> list[list[str]]:
    """A shortest circle through each module that is in one, each circle once, so every
    module of every group shows in some chain (a -> b -> a)."""
    rings: set[tuple[str, ...]] = set()
    for group in strongly_connected(graph):
        for module in group:
            ring = shortest_cycle(graph, module)[:-1]
            first = ring.index(min(ring))  # one circle, whichever module it was found from
            rings.add(tuple(ring[first:] + ring[:first]))
    return [[*ring, ring[0]] for ring in sorted(rings)]


def chains(found: list[list[str]]) -> str:
    return "\n".join(" -> ".join(chain) for chain in found)


def test_no_module_of_kvrig_imports_itself_back() -> None:
    found = cycles(import_graph("kvrig"))
    assert not found, (
        "kvrig's modules import each other in a circle; move what both need to a module of"
        " its own, below both:\n" + chains(found)
    )


def test_a_circle_is_reported_as_its_chain_and_a_tree_is_not() -> None:
    circle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(circle) == [["a", "b", "c", "a"]]
    assert chains(cycles({"x": {"x"}})) == "x -> x"
    two = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}, "d": {"e"}, "e": {"d"}}
    assert strongly_connected(two) == [["a", "b", "c"], ["d", "e"]]
    assert cycles(two) == [["a", "b", "a"], ["a", "c", "a"], ["d", "e", "d"]]
    tree = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}
    assert strongly_connected(tree) == []
    assert cycles(tree) == []


def test_imports_for_type_checkers_and_inside_functions_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hooks.py").write_text("from circled import items\n")
    (package / "items.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circled import hooks\n"
    )
    (package / "bench.py").write_text("def run():\n    from circled import late\n")
    (package / "late.py").write_text("from circled import bench\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert chains(cycles(import_graph("circled"))) == (
        "circled.bench -> circled.late -> circled.bench\n"
        "circled.hooks -> circled.items -> circled.hooks"
    )
