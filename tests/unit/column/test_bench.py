"""The benchmark's figures and how it runs its columns (no column is run here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvrig.column import bench, bench_emulated, figures
from kvrig.host import isa


def test_benchmark_sees_its_own_process_tree() -> None:
    assert os.getpid() in figures.tree_pids(os.getppid())
    assert "OVER TARGET" in figures.line("x", 400, 300, "s")
    assert "within target" in figures.line("x", 200, 300, "s")


def test_the_emulated_floor_is_an_import_per_platform_and_release_plus_the_cells_side_by_side(
    tmp_path: Path,
) -> None:
    for column, times in {"cuda-sm90-emulated": [1.5, 0.5], "xpu-bmg-emulated": [2.0]}.items():
        records = tmp_path / column / "records"
        records.mkdir(parents=True)
        for i, cell_s in enumerate(times):
            (records / f"{i}.json").write_text(json.dumps({"timings": {"cell_s": cell_s}}))
    (tmp_path / "xpu-bmg-emulated" / "records" / "skip.json").write_text('{"timings": {}}')
    n, cells_s = bench_emulated.cells_seconds(tmp_path.glob("*-emulated"))
    assert (n, cells_s) == (3, 4.0)
    floor = bench_emulated.Floor({"cuda": 20.0, "xpu": 16.0}, n, cells_s)
    assert floor.seconds == (36.0 + 4.0) / 2
    assert bench_emulated.Floor({"cuda": 20.0}, n, cells_s, releases=2).seconds == 22.0
    (ratio,) = [x for x in floor.lines(30.0) if "rig / floor" in x]
    assert "1.50 x" in ratio and "within target" in ratio
    assert "OFF TARGET" in floor.lines(40.0)[1]


def test_the_release_diff_figures_replace_the_emulated_columns_not_add_to_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[tuple[str, object]] = []
    monkeypatch.setattr(
        bench_emulated, "emulated_figures", lambda py: ran.append(("emu", py)) or []
    )
    monkeypatch.setattr(
        bench_emulated, "release_diff_figures", lambda py, r: ran.append(("diff", py)) or []
    )
    bench_emulated.figures("/e/python", [])
    bench_emulated.figures("/e/python", None)
    bench_emulated.figures(None, None)
    assert ran == [("diff", "/e/python"), ("emu", "/e/python")]


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
