"""The noxfile stays thin: each session installs and calls kvrig commands, and the logic
(loops, parsing, fallbacks, file handling) lives in the package, where it is tested."""

from __future__ import annotations

import ast
import re

from .builders import ROOT

TREE = ast.parse((ROOT / "noxfile.py").read_text())
# What the sessions start: kvrig's commands, and the tools the package does not wrap.
PROGRAMS = {"kvrig", "pytest", "ruff", "lint-imports", "hadolint", "mkdocs"}
SESSIONS = {
    "local", "unit", "faults", "cpu_column", "container_cpu", "mutation", "emulated",
    "backend_facts", "tests", "cpu", "cuda", "xpu", "base_image", "lint", "report", "gate",
    "bench", "cuda_image", "release_diff", "release", "rocm", "reach",
}  # fmt: skip


def functions() -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in TREE.body if isinstance(n, ast.FunctionDef)}


def is_session(fn: ast.FunctionDef) -> bool:
    return any("nox.session" in ast.unparse(d) for d in fn.decorator_list)


def test_every_session_is_there_with_its_docstring() -> None:
    sessions = {name: fn for name, fn in functions().items() if is_session(fn)}
    assert set(sessions) == SESSIONS
    for name, fn in sessions.items():
        assert ast.get_docstring(fn), name


def test_no_session_holds_logic_of_its_own() -> None:
    for name, fn in functions().items():
        for node in ast.walk(fn):
            assert not isinstance(node, (ast.For, ast.While, ast.Try)), f"{name} loops or tries"
            if isinstance(node, ast.Name):
                assert node.id not in {"json", "shutil", "os", "subprocess"}, f"{name}: {node.id}"


def test_sessions_run_kvrig_commands_not_modules_or_scripts() -> None:
    for name, fn in functions().items():
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "session.run"):
                continue
            program = node.args[0]
            assert isinstance(program, ast.Constant), f"{name}: {ast.unparse(node)}"
            assert program.value in PROGRAMS, f"{name} runs {program.value}"


def test_the_noxfile_imports_nox_alone() -> None:
    imported = {
        alias.name
        for node in TREE.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"annotations", "Path", "nox"}, imported


def _requires(name: str) -> list[str]:
    """The sessions a session requires, in the order nox runs them."""
    (decorator,) = [d for d in functions()[name].decorator_list if "nox.session" in ast.unparse(d)]
    assert isinstance(decorator, ast.Call), name
    found = [k.value for k in decorator.keywords if k.arg == "requires"]
    return list(ast.literal_eval(found[0])) if found else []


def test_what_ci_runs_lints_first() -> None:
    """CI runs the README's test command, `nox -s tests` (.ci/run): ruff, the layers
    contract, hadolint and the strict docs build guard a landing only through it."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "nox -s tests" in ci and "nox -s tests" in (ROOT / "README.md").read_text()
    required = _requires("tests")
    assert required[0] == "lint", required
    assert 'session.run("ruff"' in ast.unparse(functions()["lint"]).replace("'", '"')


def test_the_docs_name_what_tests_requires_in_its_order() -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "setup.md").read_text().splitlines()
        if line.startswith("| `nox -s tests` |")
    )
    named = re.findall(r"`(\w+)`", row.split("requires", 1)[1].split(", in that order")[0])
    assert named == _requires("tests"), row
    # `nox -l -s tests` lists sessions in the file's order: the docs' way to see the order.
    defined = [name for name in functions() if name in named]
    assert defined == named, "define the sessions `tests` requires in the order it runs them"
