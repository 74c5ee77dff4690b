"""The benchmark's figures and how it runs its columns (no column is run here)."""

from __future__ import annotations

import os

import pytest

from kvrig.column import bench
from kvrig.host import isa


def test_benchmark_sees_its_own_process_tree() -> None:
    assert os.getpid() in bench.tree_pids(os.getppid())
    assert "OVER TARGET" in bench.line("x", 400, 300, "s")
    assert "within target" in bench.line("x", 200, 300, "s")


def test_the_naive_column_is_the_benchmark_run_again_in_the_interpreter_under_test() -> None:
    cmd = bench.naive_cmd("/venv/bin/python", bench.Path("/n"), 2, ["llama"])
    assert cmd == ["/venv/bin/python", "-m", "kvrig", "bench", "--naive-run", "/n", "--workers",
                   "2", "llama"]  # fmt: skip


def test_the_classes_are_the_hosts_own_then_each_lesser(monkeypatch) -> None:
    flags = {"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl"}
    monkeypatch.setattr(bench.hardware, "cpu_flags", lambda: flags)
    monkeypatch.setattr(bench.hardware, "cpu_info", lambda: {"arch": "x86_64"})
    assert bench.classes() == [isa.NATIVE, "avx2"]


def test_kvrig_bench_is_the_benchmarks_own_command_line(capsys) -> None:
    from kvrig.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--no-such-option"])
    assert exit_.value.code == 2
    assert "usage: kvrig bench" in capsys.readouterr().err
