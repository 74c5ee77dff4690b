"""The noxfile stays thin: each session installs and calls kvrig commands, and the logic
(loops, parsing, fallbacks, file handling) lives in the package, where it is tested."""

from __future__ import annotations

import ast

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
