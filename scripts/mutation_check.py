"""Proves the rig notices when vLLM's early check is gone.

Edits the vLLM installed in THIS interpreter's environment so that
`Platform._check_aligned_block_size` returns at once, runs the column's early_error
cells, and requires every one of them to fail with a verdict saying the error came late
or not at all. The edit is undone afterwards, also on Ctrl-C; `nox -s mutation` runs this
in an environment of its own, reinstalled first, so no other environment is touched.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

from kvrig import results as results_mod

FUNCTION = "_check_aligned_block_size"
MARK = "# kvrig mutation: early check disabled"


def interface_path() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        sys.exit("mutation check: vLLM is not installed in this environment")
    return Path(spec.origin).parent / "platforms" / "interface.py"


def disable_check(source: str) -> str:
    """The source with `return` as the first statement of the check (after its docstring)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == FUNCTION:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                first = node.body[1]
            lines = source.splitlines(keepends=True)
            indent = lines[first.lineno - 1][: first.col_offset]
            lines.insert(first.lineno - 1, f"{indent}return None  {MARK}\n")
            return "".join(lines)
    raise SystemExit(f"mutation check: {FUNCTION} not found in vLLM; nothing to mutate")


def verdict_problems(rows: list[dict]) -> list[str]:
    """Every early_error cell must have failed, saying the error was late or absent."""
    problems = []
    early = [r for r in rows if r["expected"] == "early_error"]
    if not early:
        problems.append("no early_error cell ran")
    for r in early:
        if r["status"] != "fail":
            problems.append(f"{r['cell_id']} still passed with the check disabled")
        elif not ("got engine ran" in r["reason"] or "after KV-cache sizing" in r["reason"]):
            problems.append(f"{r['cell_id']} failed for another reason: {r['reason']}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/cpu-mutation")
    ap.add_argument("pytest_args", nargs="*")
    ns = ap.parse_args()
    path = interface_path()
    original = path.read_text()
    if MARK in original:
        sys.exit(f"mutation check: {path} is already mutated; reinstall vLLM first")
    results = Path(ns.results).resolve()
    (results / results_mod.RESULTS_FILE).unlink(missing_ok=True)
    try:
        path.write_text(disable_check(original))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvrig",
                "column",
                "--platform",
                "cpu",
                "--results",
                str(results),
                "-m",
                "expect_early_error",
                "-q",
                "--tb=no",  # the failures are expected; the summary below reads them
                *ns.pytest_args,
            ],
            check=False,
        )
    finally:
        path.write_text(original)
    rows = results_mod.read(results)
    print("\nWith _check_aligned_block_size disabled:")
    for r in rows:
        print(f"  {r['status'].upper():<4} {r['cell_id']}: {r['reason']}")
    problems = verdict_problems(rows)
    if problems:
        print(
            "mutation check FAILED: the rig did not notice the missing check:\n  "
            + "\n  ".join(problems)
        )
        return 1
    print(
        f"mutation check passed: all {len(rows)} early_error cells turned red, each saying"
        " the error came late or not at all."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
