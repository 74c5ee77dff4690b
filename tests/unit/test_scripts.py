"""The pure parts of scripts/: the mutation and the benchmark's process-tree sampling."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''
class Platform:
    @classmethod
    def _check_aligned_block_size(cls, vllm_config, backend_classes, pre_block_size):
        """Fail now."""
        block_size = vllm_config
        raise ValueError("Aligned KV cache block size")
'''


def test_disable_check_returns_before_the_body() -> None:
    mutation = load("mutation_check")
    mutated = mutation.disable_check(SOURCE)
    namespace: dict = {}
    exec(compile(mutated, "interface.py", "exec"), namespace)
    assert namespace["Platform"]._check_aligned_block_size(1, [], 16) is None
    original: dict = {}
    exec(compile(SOURCE, "interface.py", "exec"), original)
    try:
        original["Platform"]._check_aligned_block_size(1, [], 16)
    except ValueError:
        pass
    else:
        raise AssertionError("the unmutated check must raise")


def test_verdict_problems_flag_a_cell_that_still_passes() -> None:
    mutation = load("mutation_check")
    rows = [
        {
            "cell_id": "a",
            "expected": "early_error",
            "status": "fail",
            "reason": "expected ...; got engine ran, generated 4 token(s)",
        },
        {"cell_id": "b", "expected": "early_error", "status": "pass", "reason": "ok"},
        {
            "cell_id": "c",
            "expected": "early_error",
            "status": "fail",
            "reason": "expected ...; got crashed: SIGILL",
        },
    ]
    problems = mutation.verdict_problems(rows)
    assert len(problems) == 2
    assert "b still passed" in problems[0] and "c failed for another reason" in problems[1]
    assert mutation.verdict_problems([]) == ["no early_error cell ran"]


def test_benchmark_sees_its_own_process_tree() -> None:
    bench = load("benchmark")
    assert os.getpid() in bench.descendants(os.getppid())
    assert "OVER TARGET" in bench.line("x", 400, 300, "s")
