"""Advice that works when followed: each command a refusal of the container commands
advises parses with kvrig's own parser or names a nox session that hands it on, and a dry
run shows the plan on any host."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvrig.cli import command, delegated
from kvrig.containers import base_image, host_check, launch, preflight
from kvrig.containers import plan as c
from kvrig.containers import settings as es
from kvrig.containers.args import parse_args
from kvrig.containers.facts import find_root
from kvrig.define import column_choice
from kvrig.provision import engines

from ..builders import ROOT

# --- the noxfile, run with a stand-in for nox (no nox in the unit tests' environment) ------


class FakeSession:
    """What a nox session does, recorded: the commands it runs, nothing run."""

    def __init__(self, posargs: Sequence[str] = ()) -> None:
        self.posargs = list(posargs)
        self.ran: list[list[str]] = []

    def install(self, *args: str, **kw: Any) -> None:
        pass

    def run(self, *args: str, **kw: Any) -> None:
        self.ran.append(list(args))

    def log(self, *args: Any) -> None:
        pass

    def create_tmp(self) -> str:
        return "/tmp"

    def kvrig(self) -> list[list[str]]:
        return [r[1:] for r in self.ran if r[0] == "kvrig"]


def _nox_stub() -> types.ModuleType:
    nox = types.ModuleType("nox")
    nox.session = lambda *a, **kw: lambda fn: fn  # type: ignore[attr-defined]
    nox.options = types.SimpleNamespace()  # type: ignore[attr-defined]
    nox.virtualenv = types.SimpleNamespace(UV="uv")  # type: ignore[attr-defined]
    nox.project = types.SimpleNamespace(  # type: ignore[attr-defined]
        load_toml=lambda path: {}, dependency_groups=lambda toml, name: ()
    )
    nox.main = lambda: None  # type: ignore[attr-defined]
    return nox


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    monkeypatch.setitem(sys.modules, "nox", _nox_stub())
    spec = importlib.util.spec_from_file_location("kvrig_noxfile", ROOT / "noxfile.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sessions(noxfile: types.ModuleType) -> dict[str, Callable[[Any], None]]:
    text = (ROOT / "noxfile.py").read_text()
    names = re.findall(r"@nox\.session\([^)]*\)\ndef (\w+)\(", text, re.S)
    return {n: getattr(noxfile, n) for n in names}


# --- the advised command lines --------------------------------------------------------------

ADVISED = re.compile(r"`(?:sudo )?((?:kvrig|nox) [^`]*)`")


def kvrig_parses(argv: list[str]) -> None:
    """As `kvrig` reads it: a delegated command by its own parser, the others by kvrig's."""
    found = delegated.split(argv)
    if found is not None:
        _, name, rest = found
        if name == "container":
            parse_args(rest, {})
        return
    p = command.parser()
    ns, extra = p.parse_known_args(argv)
    assert not extra or getattr(ns, "pytest_args", False), f"kvrig {shlex.join(argv)}: {extra}"


def nox_runs(words: list[str], noxfile: types.ModuleType) -> FakeSession:
    """`nox -s NAME [-- ARGS]`: the session exists, and hands ARGS to its kvrig commands."""
    assert len(words) >= 2 and words[0] == "-s", f"nox {shlex.join(words)}: no session"
    name, rest = words[1], words[2:]
    assert not rest or rest[0] == "--", f"nox {shlex.join(words)}: arguments go after --"
    known = sessions(noxfile)
    assert name in known, f"no session {name!r} in the noxfile ({', '.join(known)})"
    session = FakeSession(rest[1:])
    known[name](session)
    for argv in session.kvrig():
        kvrig_parses(argv)
    if rest[1:]:
        handed = [a for a in session.kvrig() if a[-len(rest[1:]) :] == rest[1:]]
        assert handed, f"nox -s {name} hands {rest[1:]} to no kvrig command: {session.ran}"
    return session


def follow(text: str, noxfile: types.ModuleType) -> list[str]:
    """Every command line the paragraph advises, checked; the lines it named."""
    assert "\n" not in text and text.strip(), text
    advised = ADVISED.findall(text)
    for line in advised:
        program, *words = shlex.split(line)
        if program == "kvrig":
            kvrig_parses(words)
        else:
            nox_runs(words, noxfile)
    return advised


# --- the refusals, each as a user meets it --------------------------------------------------


def probe(
    tools: dict[str, tuple[int, str]] | None = None,
    nodes: Sequence[str] = (),
    vendor: str = "0x8086",
) -> preflight.Probe:
    """A host with these tools (command prefix -> result) and /dev/dri render nodes."""
    tools = tools or {}

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        key = " ".join(cmd[:2])
        return tools.get(key, tools.get(cmd[0], (127, "not found")))

    return preflight.Probe(
        which=lambda name: f"/usr/bin/{name}" if name in {k.split()[0] for k in tools} else None,
        exists=lambda p: bool(nodes),
        glob=lambda p, pat: [Path("/dev/dri") / n for n in nodes if n.startswith("renderD")],
        read=lambda p: vendor,
        run=run,
    )


def gpu(cap: str) -> preflight.Probe:
    return probe({"nvidia-smi -L": (0, "GPU 0: NVIDIA (UUID: x)"), "nvidia-smi": (0, cap)})


def amd(tools: dict[str, tuple[int, str]], nodes: Sequence[str] = ()) -> preflight.Probe:
    """An AMD host: its tools answer whole (rocminfo's agents span lines)."""
    host = probe(tools, nodes)
    return replace(host, run_all=host.run)


def amd_gpu(target: str) -> preflight.Probe:
    return amd({"rocminfo": (0, f"  Name:   {target}\n  Device Type:   GPU\n")}, ["renderD128"])


NO_DOCKER = {"docker info": (1, "Cannot connect to the Docker daemon")}
INTEL = {"nodes": ["renderD128"]}


def refusal(act: Callable[[], object]) -> str:
    with pytest.raises(
        (
            preflight.PreflightError,
            c.UsageError,
            column_choice.ChoiceError,
            es.SettingsError,
            base_image.BaseImageError,
        )
    ) as exc:
        act()
    return str(exc.value)


REFUSALS: dict[str, Callable[[], object]] = {
    **{
        f"no engine answers ({platform})": (
            lambda platform=platform: preflight.choose_engine("auto", probe(NO_DOCKER), platform)
        )
        for platform in (None, "cpu", "cuda", "xpu", "rocm")
    },
    "podman asked for, and it does not answer": lambda: preflight.choose_engine(
        "podman", probe({"podman info": (125, "cannot set up namespace")}), "cpu"
    ),
    "docker asked for, and it is absent": lambda: preflight.choose_engine("docker", probe(), "cpu"),
    "no nvidia-smi": lambda: preflight.check_device("cuda", probe()),
    "nvidia-smi lists no GPU": lambda: preflight.check_device(
        "cuda", probe({"nvidia-smi -L": (9, "NVIDIA-SMI has failed")})
    ),
    "no render node": lambda: preflight.check_device("xpu", probe()),
    "another vendor's render node": lambda: preflight.check_device(
        "xpu", probe(vendor="0x10de", **INTEL)
    ),
    "sycl-ls fails": lambda: preflight.check_device(
        "xpu", probe({"sycl-ls": (1, "no platforms")}, **INTEL)
    ),
    "no amd-smi or rocminfo": lambda: preflight.check_device("rocm", amd({})),
    "amd-smi and rocminfo list no GPU": lambda: preflight.check_device(
        "rocm", amd({"amd-smi list": (255, "Unable to detect any GPU"), "rocminfo": (1, "")})
    ),
    "an AMD GPU without its device nodes": lambda: preflight.check_device(
        "rocm", amd({"amd-smi list": (0, "GPU: 0")})
    ),
    "a GPU kvrig keeps no expectations for": lambda: preflight.check_architecture(gpu("7.5")),
    "a gfx target kvrig keeps no expectations for": lambda: preflight.check_architecture(
        amd_gpu("gfx90a"), platform="rocm"
    ),
    "a runner labelled for another AMD GPU": lambda: preflight.check_architecture(
        amd_gpu("gfx942"), "gfx950", platform="rocm"
    ),
    "an AMD GPU that names no gfx target": lambda: preflight.check_architecture(
        amd({"amd-smi list": (0, "GPU: 0"), "rocminfo": (1, "")}), platform="rocm"
    ),
    "a runner labelled for another GPU": lambda: preflight.check_architecture(gpu("9.0"), "sm89"),
    "a label no GPU has": lambda: preflight.check_architecture(gpu("9.0"), "7.5"),
    "a GPU that says no capability": lambda: preflight.check_architecture(gpu("[N/A]")),
    "a base image that cannot be pulled": lambda: preflight.check_base_image(
        "podman",
        "intel/deep-learning-essentials:2025.3.2-0-devel-ubuntu24.04",
        probe({"podman": (125, "no such host")}),
        platform="xpu",
    ),
    "vLLM's image that cannot be pulled": lambda: launch.resolve_base(
        "docker",
        "vllm/vllm-openai:v0.33.0",
        es.NO_SETTINGS,
        probe({"docker": (1, "denied")}),
        "vllm/vllm-openai:v0.33.0",
        "cuda",
    ),
    "a trivial container that does not start": lambda: preflight.check_engine_runs(
        "podman", "base:1", [], {}, probe({"podman": (1, "OCI runtime error")}), platform="cpu"
    ),
    "a trivial container a setting would start": lambda: preflight.check_engine_runs(
        "podman", "base:1", [], {}, probe({"podman": (1, "error setting rlimit type 7")})
    ),
    **{
        f"the device does not reach a container ({p}, {e})": (
            lambda p=p, e=e: preflight.check_passthrough(
                p, e, [e, "run", "base"], {}, probe({e: (1, "no device")})
            )
        )
        for p in ("cuda", "xpu", "rocm")
        for e in ("docker", "podman")
    },
    "a wheel outside the checkout": lambda: preflight.check_wheel(
        Path("/tmp/x"), "../v.whl", probe()
    ),
    "a wheel that is not there": lambda: preflight.check_wheel(
        Path("/tmp/x"), "docker/wheels/v.whl", probe()
    ),
    "a driver too old": lambda: host_check.check_driver(
        "nvidia/cuda:13.0.2-runtime", gpu("550.54.15")
    ),
    "a driver that says no version": lambda: host_check.check_driver(
        "nvidia/cuda:13.0.2-runtime", gpu("")
    ),
    "no container toolkit": lambda: host_check.check_toolkit(probe()),
    "--push without a registry": lambda: parse_args(["cuda", "--push"], {}),
    "a registry that is none": lambda: parse_args(["cuda", "--registry", "https://x"], {}),
    "KVRIG_ENGINE misspelt": lambda: parse_args(["cpu"], {"KVRIG_ENGINE": "dokcer"}),
    "--gpu-arch off CUDA": lambda: parse_args(["xpu", "--gpu-arch", "9.0"], {}),
    "--gpu-arch beside --emulate": lambda: parse_args(
        ["cuda", "--gpu-arch", "9.0", "--emulate", "9.0"], {}
    ),
    "no checkout": lambda: find_root(Path("/")),
    "KVRIG_HOST_SETTINGS misspelt": lambda: es.decide(
        "podman", es.HostFacts(), {"KVRIG_HOST_SETTINGS": "yes"}, Path("/tmp")
    ),
}


@pytest.mark.parametrize("act", REFUSALS.values(), ids=list(REFUSALS))
def test_every_refusal_is_one_paragraph_whose_advice_runs(
    act: Callable[[], object], noxfile: types.ModuleType
) -> None:
    follow(refusal(act), noxfile)


@pytest.mark.parametrize("node_name", ["renderD128", "kfd"])
def test_the_group_refusal_names_the_nodes_own_group(
    node_name: str, tmp_path: Path, noxfile: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XPU's render node, and ROCm's /dev/kfd."""
    node = tmp_path / node_name
    node.write_text("")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    if node_name == "kfd":
        host = preflight.Probe(glob=lambda folder, pattern: [])
        text = refusal(lambda: host_check.check_kfd_access(host, node, tmp_path))
    else:
        host = preflight.Probe(glob=lambda folder, pattern: [node])
        text = refusal(lambda: host_check.check_render_access(host, tmp_path))
    assert f"sudo usermod -aG $(stat -c %G {node}) $USER" in text
    follow(text, noxfile)


def test_a_local_base_images_refusals_advise_commands_that_run(
    noxfile: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base_image.shutil, "which", lambda name: None)
    assert follow(refusal(lambda: base_image.build("podman", "t")), noxfile)
    monkeypatch.setattr(base_image.shutil, "which", lambda name: "/usr/sbin/debootstrap")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert follow(refusal(lambda: base_image.build("podman", "t")), noxfile)


def test_the_commands_refusals_reach_the_user_as_one_line(
    noxfile: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvrig.cli import main

    for argv in (
        ["check", "host", "xpu", "--gpu-arch", "9.0"],
        ["check", "host", "cuda", "--gpu-arch", "7.5", "--dry-run"],
        ["container", "xpu", "--gpu-arch", "9.0", "--dry-run"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        follow(err.split(": ", 1)[1].strip(), noxfile)


# --- the dry run: the plan on any host ------------------------------------------------------


@pytest.mark.parametrize("platform", ["cpu", "cuda", "xpu", "rocm"])
def test_a_sessions_dry_run_reaches_the_host_check_and_installs_no_engine(
    platform: str, noxfile: types.ModuleType
) -> None:
    session = nox_runs(["-s", platform, "--", "--dry-run", "-k", "qwen3_next"], noxfile)
    assert session.kvrig() == [
        ["check", "host", platform, "--dry-run", "-k", "qwen3_next"],
        ["container", platform, "--dry-run", "-k", "qwen3_next"],
    ]
    # Not a dry run (after a second `--` it is pytest's): the engine is set up first, with
    # the packages the dry run's line says it would install.
    session = nox_runs(["-s", platform, "--", "--", "--dry-run"], noxfile)
    packages = list(host_check.ENGINE_PACKAGES.get(platform, ()))
    assert session.kvrig()[1] == ["setup", "container-engine", *packages]
    assert session.kvrig()[0][:3] == ["check", "host", platform]


def _no_gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed host: no GPU, no render node, no engine."""
    monkeypatch.setattr(host_check, "Probe", lambda: probe(NO_DOCKER))
    absent = engines.Answer(installed=False)
    facts = engines.Facts(absent, absent, root=False, apt=True, have=frozenset())
    monkeypatch.setattr(engines, "facts", lambda *a, **kw: facts)


@pytest.mark.parametrize("platform", ["cpu", "cuda", "xpu", "rocm"])
def test_a_dry_run_on_a_host_without_the_gpu_prints_the_plan_and_what_a_run_stops_at(
    platform: str,
    checkout: Path,
    noxfile: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`nox -s xpu -- --dry-run`, its kvrig commands run in turn, as the session does."""
    from kvrig.cli import main

    _no_gpu_host(monkeypatch)
    for name in ("KVRIG_ENGINE", "KVRIG_PODMAN_COMPAT", "KVRIG_HOST_SETTINGS", "KVRIG_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    session = nox_runs(["-s", platform, "--", "--dry-run"], noxfile)
    monkeypatch.chdir(checkout)
    for argv in session.kvrig():
        assert main(["--matrix", str(checkout / "matrix.yaml"), *argv]) == 0, argv
    out = capsys.readouterr().out.splitlines()
    host, engine = out[0], out[1]
    if platform == "cpu":
        assert "this host has what the cpu column needs (no device)" in host
    else:
        assert host.startswith(f"# kvrig check host {platform}: a run stops here (exit 2)")
        assert f"`nox -s {platform} -- --dry-run`" in host  # the advice is this very run
    # No engine answers and this user cannot install one: said, as the set-up would say it.
    assert engine.startswith("# kvrig setup container-engine")
    assert "a run stops here (exit 2)" in engine
    assert "sudo apt-get install podman" in engine
    commands = [ln for ln in out[2:] if not ln.startswith("#")]
    assert any(" build " in ln for ln in commands) and any(" column " in ln for ln in commands)


def test_a_dry_run_on_a_ready_host_says_so(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvrig.cli import main

    ready = probe(
        {
            "nvidia-smi -L": (0, "GPU 0: NVIDIA H100 (UUID: x)"),
            "nvidia-smi --query-gpu=compute_cap": (0, "9.0"),
            "nvidia-smi": (0, "580.95.05"),
            "nvidia-ctk": (0, ""),
        }
    )
    monkeypatch.setattr(host_check, "Probe", lambda: ready)
    answers = engines.Answer(installed=True, answers=True)
    facts = engines.Facts(answers, answers, root=True, apt=True, have=frozenset())
    monkeypatch.setattr(engines, "facts", lambda *a, **kw: facts)
    argv = ["--matrix", str(checkout / "matrix.yaml"), "check", "host", "cuda", "--dry-run"]
    assert main([*argv, "--gpu-arch", "sm90"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "# kvrig check host cuda: this host has what the cuda column needs (its device,"
        " driver and toolkit)",
        "# kvrig setup container-engine: would use docker (`docker info` answers)",
    ]
    # Not a dry run: the same host passes, and a host without the GPU is refused, exit 2.
    assert main(argv[:-1]) == 0
    monkeypatch.setattr(host_check, "Probe", lambda: probe())
    assert main(argv[:-1]) == 2


def test_the_containers_pages_command_lines_run_as_written(noxfile: types.ModuleType) -> None:
    """docs/containers.md's examples: each `nox -s` line names a session that hands its
    arguments on, each `kvrig` line parses."""
    text = (ROOT / "docs" / "containers.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    lines = [
        ln.removeprefix("$ ").split("  #")[0].strip()
        for block in blocks
        for ln in block.splitlines()
        if ln.removeprefix("$ ").startswith(("nox -s ", "kvrig "))
    ]
    assert "nox -s xpu -- --dry-run" in lines
    for line in lines:
        program, *words = shlex.split(line)
        if program == "kvrig":
            kvrig_parses(words)
        else:
            nox_runs(words, noxfile)
