"""An arm of the branch table found in one vLLM's source: the lines whose running takes it.

A row names its arm by function and a fragment of one line, never by line number, so the
same row finds its arm in every release wherever the lines moved. Taking it is said in
lines and arcs, as coverage.py records them with branch=True.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvrig.define.reach_table import Arm

Defs = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Located:
    """Where an arm is in one source, and the lines that say it was taken.

    `enter`: it is taken when any of these lines runs. A false arm with nothing of its own
    to run is taken by an arc that leaves one of `leave` lines (the condition) for a line
    outside `inside` (the statement), or for `exit` (the function's return).
    """

    line: int
    enter: frozenset[int] = frozenset()
    leave: frozenset[int] = frozenset()
    inside: frozenset[int] = frozenset()
    exit: int = 0
    exit_only: bool = False  # an assertion: only leaving by the exit counts


@dataclass(frozen=True)
class Missing:
    """Why an arm could not be found: the release moved or rewrote the code."""

    reason: str


def locate(source: str, function: str, arm: Arm) -> Located | Missing:
    """The arm in `source` (a module's text), inside the function at dotted path `function`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return Missing(f"the file does not parse ({exc.msg}, line {exc.lineno})")
    defs = find_defs(tree, function)
    if not defs:
        return Missing(f"no function {function}")
    lines = source.splitlines()
    found = _matching_lines(lines, defs, arm.at)
    if not found:
        return Missing(f"{arm.at!r} is found nowhere in {function}")
    if arm.nth is None and len(found) > 1:
        return Missing(
            f"{arm.at!r} is found on {len(found)} lines of {function}"
            f" ({', '.join(map(str, found))}): the row must say which (`nth`)"
        )
    if len(found) < (arm.nth or 1):
        return Missing(f"{arm.at!r} is found {len(found)} time(s) in {function}, not {arm.nth}")
    line = found[(arm.nth or 1) - 1]
    if arm.arm == "line":
        return Located(line, enter=frozenset({line}))
    return _branch(tree, line, arm.arm == "true")


def find_defs(tree: ast.Module, dotted: str) -> list[Defs]:
    """The definitions at a dotted path of class and function names; nesting inside if,
    with or try blocks is not part of the path. Several where a name is defined twice."""
    level: list[ast.AST] = [tree]
    for name in dotted.split("."):
        level = [d for node in level for d in _child_defs(node) if d.name == name]
    return [d for d in level if isinstance(d, Defs)]


def _child_defs(node: ast.AST) -> list[Defs]:
    """The definitions directly under a node, looking through blocks but not into defs."""
    out: list[Defs] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, Defs):
            out.append(child)
        elif isinstance(child, ast.stmt):
            out.extend(_child_defs(child))
    return out


def _first_line(node: Defs) -> int:
    """Where the definition's code object starts: its first decorator, else `def`."""
    return min([d.lineno for d in node.decorator_list] + [node.lineno])


def _matching_lines(lines: list[str], defs: list[Defs], at: str) -> list[int]:
    """Line numbers in the definitions where the fragment starts: equal lines (spaces aside)
    before containing ones, so a short fragment does not match a longer line by accident."""
    want = [" ".join(part.split()) for part in at.splitlines() if part.strip()]
    span = sorted({n for d in defs for n in range(_first_line(d), (d.end_lineno or 0) + 1)})
    text = {n: " ".join(lines[n - 1].split()) for n in span if n <= len(lines)}
    if len(want) == 1:
        equal = [n for n, t in text.items() if t == want[0]]
        return equal or [n for n, t in text.items() if want[0] in t]
    code = [n for n, t in text.items() if t and not t.startswith("#")]
    return [
        n
        for i, n in enumerate(code)
        if all(w in text[m] for w, m in zip(want, code[i : i + len(want)], strict=False))
        and len(code[i:]) >= len(want)
    ]


def _lines(node: ast.AST) -> frozenset[int]:
    return frozenset(range(node.lineno, (node.end_lineno or node.lineno) + 1))  # type: ignore[attr-defined]


def _branch(tree: ast.Module, line: int, true: bool) -> Located | Missing:
    """The true or false arm of the condition written on `line`: an if, elif, while or
    assert statement's, else a conditional expression spanning the line."""
    stmt = _condition_at(tree, line)
    if stmt is None:
        expr = _conditional_at(tree, line)
        if expr is None:
            return Missing(f"line {line} holds no if, elif, while, assert or conditional")
        return _expression_arm(expr, line, true)
    test = stmt.test
    header = frozenset(range(stmt.lineno, (test.end_lineno or test.lineno) + 1))
    function = _function_of(tree, line)
    exit_line = -_first_line(function) if function is not None else 0
    if isinstance(stmt, ast.Assert):
        if true:
            return Missing(f"line {line} is an assertion: only its false arm (it fails) is an arm")
        return Located(line, leave=header, inside=_lines(stmt), exit=exit_line, exit_only=True)
    body = stmt.body[0]
    if body.lineno in header:
        return Missing(f"line {line}: the arm shares its line with its condition")
    if true:
        return Located(line, enter=_lines(body))
    if stmt.orelse:
        return Located(line, enter=_lines(stmt.orelse[0]))
    return Located(line, leave=header, inside=_lines(stmt), exit=exit_line)


def _expression_arm(expr: ast.IfExp, line: int, true: bool) -> Located | Missing:
    """An arm of `body if test else orelse`. The body's line is not enough for the true
    arm: the compiler may put the test's jump on it, so it runs either way."""
    body, test, orelse = _lines(expr.body), _lines(expr.test), _lines(expr.orelse)
    if body & test or orelse & test or body & orelse:
        return Missing(f"line {line}: the conditional's arms share lines with its condition")
    if not true:
        return Located(line, enter=orelse)
    return Located(line, leave=body, inside=body | test | orelse)


def _innermost(
    tree: ast.Module, line: int, kinds: tuple[type, ...], span: Callable[[Any], tuple[int, int]]
) -> Any:
    """The node of those kinds whose span (first, last line) holds `line` and starts last."""
    holding = [
        n for n in ast.walk(tree) if isinstance(n, kinds) and span(n)[0] <= line <= span(n)[1]
    ]
    return max(holding, key=lambda n: n.lineno, default=None)


def _condition_at(tree: ast.Module, line: int) -> ast.If | ast.While | ast.Assert | None:
    """The innermost if, elif, while or assert whose condition spans `line`."""
    return _innermost(
        tree, line, (ast.If, ast.While, ast.Assert), lambda n: (n.lineno, n.test.end_lineno)
    )


def _conditional_at(tree: ast.Module, line: int) -> ast.IfExp | None:
    """The innermost conditional expression spanning `line`."""
    return _innermost(tree, line, (ast.IfExp,), lambda n: (n.lineno, n.end_lineno))


def _function_of(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function holding `line`: whose exit a false arm may leave by."""
    return _innermost(
        tree,
        line,
        (ast.FunctionDef, ast.AsyncFunctionDef),
        lambda n: (_first_line(n), n.end_lineno),
    )
