"""kvrig's environment for a named release: made with uv and the release's own setup, once,
reused while what it was made from holds, refused in one paragraph when it cannot be."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kvrig.define.named_release import NamedRelease
from kvrig.provision import release_env as re_


class Recorder:
    def __init__(self, codes: dict[int, int] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.codes = codes or {}

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        code = self.codes.get(len(self.calls) - 1, 0)
        return subprocess.CompletedProcess(argv, code)


ENV = {"UV": "/bin/true", "PATH": "/usr/bin:/bin"}


def test_an_environment_is_made_with_uv_kvrig_and_the_releases_own_setup(tmp_path: Path) -> None:
    wanted = re_.Wanted("emulated", NamedRelease("0.33.0"), matrix="/m.yaml")
    run = Recorder()
    folder = re_.ensure(wanted, root=tmp_path, environ=ENV, run=run)
    assert folder == tmp_path / "emulated-vllm-0.33.0"
    venv, rig, setup = run.calls
    assert venv[1:3] == ["venv", "--quiet"] and venv[-1] == str(folder)
    assert "-e" in rig and rig[rig.index("-e") + 1] == str(re_.ROOT)
    assert rig[-1].endswith("pyproject.toml:emulated")
    assert setup[0] == str(folder / "bin" / "python")
    assert setup[-4:] == ["vllm", "--emulated", "--vllm", "0.33.0"]
    assert setup[3:5] == ["--matrix", "/m.yaml"]
    assert json.loads((folder / re_.STAMP).read_text())["release"] == "0.33.0"


def test_a_made_environment_is_reused_and_remade_when_what_it_was_made_from_changed(
    tmp_path: Path,
) -> None:
    wanted = re_.Wanted("cpu", NamedRelease("0.33.0"))
    re_.ensure(wanted, root=tmp_path, environ=ENV, run=Recorder())
    again = Recorder()
    re_.ensure(wanted, root=tmp_path, environ=ENV, run=again)
    assert again.calls == []
    other = re_.Wanted("cpu", NamedRelease("0.33.0"), overrides=("flashinfer-python==0.7.4",))
    third = Recorder()
    re_.ensure(other, root=tmp_path, environ=ENV, run=third)
    assert len(third.calls) == 3 and "--override=flashinfer-python==0.7.4" in third.calls[-1]


def test_columns_asking_at_once_make_the_environment_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    wanted = re_.Wanted("emulated", NamedRelease("0.33.0"))
    calls: list[list[str]] = []

    def slow(argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        calls.append(argv)
        time.sleep(0.2)
        return subprocess.CompletedProcess(argv, 0)

    with ThreadPoolExecutor(3) as pool:
        made = list(
            pool.map(lambda _: re_.ensure(wanted, root=tmp_path, environ=ENV, run=slow), range(3))
        )
    assert made == [tmp_path / "emulated-vllm-0.33.0"] * 3
    assert len(calls) == 3  # venv, kvrig, setup: once


def test_a_refused_setup_or_a_failed_step_is_one_paragraph_and_leaves_no_stamp(
    tmp_path: Path,
) -> None:
    wanted = re_.Wanted("emulated", NamedRelease("0.34.0"))
    with pytest.raises(re_.ReleaseEnvError, match="its install was refused") as err:
        re_.ensure(wanted, root=tmp_path, environ=ENV, run=Recorder({2: 2}))
    assert "\n" not in str(err.value)
    assert not (wanted.folder(tmp_path) / re_.STAMP).exists()
    with pytest.raises(re_.ReleaseEnvError, match="exited 1"):
        re_.ensure(wanted, root=tmp_path, environ=ENV, run=Recorder({1: 1}))


def test_without_uv_it_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(re_.uv, "find", lambda environ=None: None)
    wanted = re_.Wanted("emulated", NamedRelease("0.34.0"))
    run = Recorder()
    with pytest.raises(re_.ReleaseEnvError, match="no uv was found"):
        re_.ensure(wanted, root=tmp_path, environ={}, run=run)
    assert run.calls == []


def test_two_wheels_of_one_version_are_two_environments(tmp_path: Path) -> None:
    a = re_.Wanted("emulated", NamedRelease("0.35.0.dev1", wheel="/w/a/vllm.whl"))
    b = re_.Wanted("emulated", NamedRelease("0.35.0.dev1", wheel="/w/b/vllm.whl"))
    assert a.folder(tmp_path) != b.folder(tmp_path)


def test_which_installed_vllm_is_the_named_release() -> None:
    assert re_.is_installed(NamedRelease("0.34.0"), "0.34.0")
    assert not re_.is_installed(NamedRelease("0.34.0"), "0.33.0")
    assert not re_.is_installed(NamedRelease("0.34.0"), "0.34.0.dev3+gabc")
    assert not re_.is_installed(NamedRelease("0.34.0"), None)
    nightly = NamedRelease("0.35.0.dev3+gabc", wheel="/w/vllm.whl")
    assert re_.is_installed(nightly, "0.35.0.dev3+gabc")
    assert not re_.is_installed(nightly, "0.35.0")
