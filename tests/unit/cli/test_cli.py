from __future__ import annotations

from pathlib import Path

from kvrig.cli import main
from kvrig.cli.columns import column_args, with_workers
from kvrig.publish import results

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"


def test_validate_and_cells(capsys) -> None:
    assert main(["--matrix", str(DEFAULT_MATRIX), "validate"]) == 0
    assert "valid (" in capsys.readouterr().out
    assert main(["--matrix", str(DEFAULT_MATRIX), "cells", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "cpu-qwen3_next-sibling_rejects" in out
    assert "early_error" in out


def test_bad_matrix_exits_2_with_one_paragraph(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("version: 1\nplatforms: {}\nmodels: {}\ncases: []\nextra: 1\n")
    assert main(["--matrix", str(bad), "validate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: ")
    assert "unknown key 'extra'" in err
    assert err.count("\n") == 1


def test_gate_exit_codes(tmp_path: Path, capsys) -> None:
    assert main(["gate", "--results", str(tmp_path), "--platform", "cpu"]) == 1
    assert "not run" in capsys.readouterr().out


def test_report_without_results_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "Run a column first" in capsys.readouterr().err


def test_report_writes_files(tmp_path: Path, capsys) -> None:
    results.append(
        tmp_path,
        {
            "cell_id": "cpu-a-b",
            "status": "pass",
            "expected": "runs",
            "outcome": "ran",
            "reason": "as expected: fine",
        },
    )
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists()
    assert (tmp_path / "report.html").exists()
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_column_args_collect_the_matrix_and_pass_pytest_args_through() -> None:
    values = {"platform": "cpu", "isa": "avx2", "results": "/r", "cold": True, "rerun": False}
    args = column_args(values, Path("/m.yaml"), ["-k", "qwen3_next"], "cpu-avx2")
    assert args[0] == "/m.yaml"
    assert "--kvrig-platform=cpu" in args
    assert "--kvrig-isa=avx2" in args
    assert "--kvrig-results=/r" in args
    assert "--kvrig-cold" in args
    assert not any(a.startswith("--kvrig-rerun") for a in args)  # off: left out
    assert "--junitxml=/r/junit.xml" in args
    assert args[-2:] == ["-k", "qwen3_next"]
    assert "--override-ini=junit_suite_name=kvrig-cpu-avx2" in args
    # The host's own class is the plugin's default: not named, so it is read, not emulated.
    native = column_args({**values, "isa": "native"}, Path("/m.yaml"), [], "cpu")
    assert not any(a.startswith("--kvrig-isa") for a in native)


def test_with_workers_respects_the_users_choice() -> None:
    assert with_workers(["-k", "x"], 2) == ["-n", "2", "-k", "x"]
    assert with_workers(["-n", "4"], 2) == ["-n", "4"]
    assert with_workers(["-n0"], 2) == ["-n0"]
    assert with_workers(["-k", "x"], 1) == ["-k", "x"]


def test_the_cpu_class_is_taken_from_pytests_arguments_too() -> None:
    from kvrig.host.isa import take_arg

    assert take_arg("native", ["-k", "x", "--kvrig-isa", "avx2"]) == ("avx2", ["-k", "x"])
    assert take_arg("native", ["--kvrig-isa=avx512", "-x"]) == ("avx512", ["-x"])
    assert take_arg("amx", ["-x"]) == ("amx", ["-x"])


def test_a_class_above_the_host_is_refused_before_pytest(capsys, monkeypatch) -> None:
    from kvrig.host import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    assert (
        main(["--matrix", str(DEFAULT_MATRIX), "column", "--platform", "cpu", "--isa", "amx"]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("kvrig: The CPU class 'amx' needs the flags avx512f")
    assert err.count("\n") == 1
    assert (
        main(["--matrix", str(DEFAULT_MATRIX), "column", "--platform", "cpu", "--isa", "sse"]) == 2
    )
    assert "Unknown CPU class 'sse'" in capsys.readouterr().err


def test_an_overlay_that_cannot_be_built_is_refused_before_pytest(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """In an environment without vLLM (this one), or with a patch that is not there."""
    import pytest

    monkeypatch.setattr(pytest, "main", lambda *a, **k: pytest.fail("pytest must not start"))
    base = ["--matrix", str(DEFAULT_MATRIX), "column", "--platform", "cpu"]
    assert main([*base, "--vllm-patch", str(tmp_path / "fix.diff")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: ") and err.count("\n") == 1
    assert "Install the platform's vLLM first" in err or "does not exist" in err
    assert main([*base, "--vllm-patch", "a.diff", "--vllm-source", "."]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_pytest_options_are_not_read_as_abbreviations_of_the_columns(
    monkeypatch, tmp_path: Path
) -> None:
    import pytest

    given: list[list[str]] = []
    monkeypatch.setattr(pytest, "main", lambda args: given.append(args) or 0)
    monkeypatch.setenv("KVRIG_PLATFORM", "cuda")
    base = ["--matrix", str(DEFAULT_MATRIX), "column", "--emulate", "9.0", "--results"]
    assert main([*base, str(tmp_path), "--co", "--re", "x"]) == 0
    [args] = given
    assert args[-3:] == ["--co", "--re", "x"]  # pytest's, as given
    assert "--kvrig-cold" not in args and "--kvrig-rerun" not in args
    assert "--kvrig-emulate=9.0" in args and "--kvrig-platform=cuda" in args


def test_two_devices_mutation_checks_run_side_by_side_each_a_check_of_its_own(
    monkeypatch, capsys
) -> None:
    from kvrig.cli import check

    ran: list[tuple[str, list[str]]] = []

    def beside(name: str, command: list[str]) -> int:
        ran.append((name, command))
        return {"9.0": 0, "rocm:gfx942": 1}[name]

    monkeypatch.setattr(check.prefixed, "run", beside)
    argv = ["check", "mutation", "--emulate", "9.0", "--emulate", "rocm:gfx942", "--", "-x"]
    assert main(argv) == 1  # one device red: red
    assert [name for name, _ in ran] == ["9.0", "rocm:gfx942"]
    for name, command in ran:
        # One worker each: the two columns' imports take a core each.
        assert command[-8:] == ["check", "mutation", "--emulate", name, "--", "-x", "-n", "0"]
    ran.clear()
    monkeypatch.setattr(check.prefixed, "run", lambda name, command: ran.append(name) or 0)
    assert main(["check", "mutation", "--seeded", "--emulate", "9.0", "--emulate", "xpu:bmg"]) == 0
    assert main(["check", "mutation", "--emulate", "9.0", "--emulate", "rocm:gfx0"]) == 2
    assert "--emulate rocm:gfx0" in capsys.readouterr().err
    two_folders = ["--emulate", "9.0", "--emulate", "8.0", "--results", "r"]
    assert main(["check", "mutation", *two_folders]) == 2
    assert "--results names one check's folder" in capsys.readouterr().err
    assert ran == ["9.0", "xpu:bmg"]  # nothing run for a refused command line
