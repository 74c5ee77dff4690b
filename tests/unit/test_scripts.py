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


def test_verdict_problems_read_the_records_and_require_the_full_count() -> None:
    mutation = load("mutation_check")
    rows = [
        {"cell_id": "a", "expected": "early_error", "status": "fail", "reason": "got ran"},
        {"cell_id": "b", "expected": "early_error", "status": "pass", "reason": "ok"},
        {"cell_id": "c", "expected": "early_error", "status": "fail", "reason": "got SIGILL"},
        {"cell_id": "d", "expected": "early_error", "status": "fail", "reason": "late"},
        {"cell_id": "e", "expected": "early_error", "status": "fail", "reason": "early"},
    ]
    records = {
        "a": {"outcome": "ran"},
        "c": {"outcome": "crashed"},
        "d": {"outcome": "error", "kv_cache_sized_before_error": True},
        "e": {"outcome": "error", "kv_cache_sized_before_error": False},
    }
    problems = mutation.verdict_problems(rows, records, {"a", "b", "c", "d", "e", "f"})
    assert problems[0] == "5 of the matrix's 6 early_error cells ran; missing: f"
    assert problems[1:] == [
        "b still passed with the check disabled",
        "c failed for another reason: got SIGILL",
        "e failed for another reason: early",
    ]
    assert mutation.verdict_problems([], {}) == ["no early_error cell ran"]


def test_verdict_problems_require_the_mutated_overlay() -> None:
    mutation = load("mutation_check")
    rows = [
        {"cell_id": "a", "expected": "early_error", "status": "fail", "reason": "got ran",
         "vllm_overlay": {"patch_sha256": "abc"}},
        {"cell_id": "b", "expected": "early_error", "status": "fail", "reason": "got ran",
         "vllm_overlay": None},
    ]  # fmt: skip
    records = {"a": {"outcome": "ran"}, "b": {"outcome": "ran"}}
    assert mutation.verdict_problems(rows, records, {"a", "b"}, "abc") == [
        "b did not run on the mutated overlay (it names None)"
    ]


def test_each_kind_of_mutation_run_has_a_folder_no_release_column_claims() -> None:
    import argparse

    from kvrig.define import gpus
    from kvrig.define.paths import column_of_folder

    mutation = load("mutation_check")
    kinds = [
        argparse.Namespace(container=False, emulate=None),
        argparse.Namespace(container=True, emulate=None),
        argparse.Namespace(container=False, emulate="sm90"),
    ]
    folders = [mutation.folder_name(ns) for ns in kinds]
    assert len(set(folders)) == 3
    release = ["cpu", "cuda", "xpu", *gpus.emulated_columns()]
    assert [column_of_folder(f, release) for f in folders] == [None, None, None]
    assert [mutation.described(ns) for ns in kinds] == [
        "on this host",
        "in the CPU image",
        "on the emulated CUDA sm90 column",
    ]


def test_the_mutation_patch_is_kept_in_the_repo_and_disables_only_the_check() -> None:
    mutation = load("mutation_check")
    text = mutation.PATCH.read_text()
    assert text.startswith("diff --git a/vllm/platforms/interface.py b/vllm/platforms/interface.py")
    removed = [x for x in text.splitlines() if x.startswith("-") and not x.startswith("---")]
    assert removed == ["-        if block_size == pre_block_size:", "-            return"]


def test_benchmark_sees_its_own_process_tree() -> None:
    bench = load("benchmark")
    assert os.getpid() in bench.tree_pids(os.getppid())
    assert "OVER TARGET" in bench.line("x", 400, 300, "s")
