"""The stamp an install leaves in its environment, and the cell that reads it: every
record of an environment installed with overrides names them, while the release the
stamp names is still the one installed."""

from __future__ import annotations

import datetime as dt
import json
import sys
import types
from pathlib import Path

import pytest

from kvrig.provision import pins, stamp
from kvrig.provision.install import Plan, Release
from kvrig.run import identity

OVERRIDE = pins.Override(
    "flashinfer-python==0.7.4",
    "flashinfer-python",
    "--override",
    "flashinfer-python==0.7.3 pinned by vllm 0.34.0",
)
PLAN = Plan(["vllm==0.34.0"], release=Release("vllm", "0.34.0"), overrides=(OVERRIDE,))
NOW = dt.datetime(2026, 12, 3, 4, 5, 6, tzinfo=dt.timezone.utc)


def test_the_stamp_says_what_was_asked_installed_and_overridden_and_when() -> None:
    data = stamp.content(PLAN, "0.34.0", "kvrig setup vllm --emulated", NOW)
    assert data == {
        "asked": "kvrig setup vllm --emulated",
        "package": "vllm",
        "release": "vllm 0.34.0",
        "installed": "0.34.0",
        "overrides": [OVERRIDE.as_json()],
        "excluded": [],
        "at": "2026-12-03T04:05:06Z",
    }


def test_a_stamp_counts_only_while_its_release_is_installed(tmp_path: Path) -> None:
    data = stamp.content(PLAN, "0.34.0", "k", NOW)
    assert stamp.write(data, str(tmp_path)) == tmp_path / "kvrig-vllm.json"
    back = stamp.read(str(tmp_path))
    assert stamp.overrides_in_force(back, {"vllm": "0.34.0"}.get) == ["flashinfer-python==0.7.4"]
    # vLLM installed over it by other means, or gone: the stamp says nothing.
    assert stamp.overrides_in_force(back, {"vllm": "0.33.0"}.get) == []
    assert stamp.overrides_in_force(back, {}.get) == []
    assert stamp.overrides_in_force(None) == []
    (tmp_path / "kvrig-vllm.json").write_text("{not json")
    assert stamp.read(str(tmp_path)) is None
    assert stamp.read(str(tmp_path / "none")) is None


@pytest.fixture
def imported_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A cell's process as identity sees it: vllm and torch imported, in an environment
    whose prefix is a folder of the test's."""
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.34.0"  # type: ignore[attr-defined]
    vllm.__file__ = "/env/vllm/__init__.py"
    torch = types.ModuleType("torch")
    torch.__version__ = "2.14.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm._version", None)  # no commit: import fails
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(stamp, "installed_version", {"vllm": "0.34.0"}.get)
    monkeypatch.delenv(identity.overlay.OVERLAY_ENV, raising=False)
    return tmp_path


def test_every_cell_reads_the_overrides_of_its_environment(imported_vllm: Path) -> None:
    out: dict = {}
    assert identity.vllm_identity(out) is None
    assert out["vllm_version"] == "0.34.0" and out["vllm_overrides"] == []  # no stamp
    stamp.write(stamp.content(PLAN, "0.34.0", "k", NOW), str(imported_vllm))
    identity.vllm_identity(out)
    assert out["vllm_overrides"] == ["flashinfer-python==0.7.4"]


def test_an_images_stamp_is_planned_on_the_host_and_finished_in_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvrig container` plans it (the overrides and why), the image's build finishes it
    (the version that landed): the same stamp a host's install writes."""
    planned = stamp.planned(PLAN.release, PLAN.overrides, PLAN.excluded, "k")
    assert "installed" not in planned and "at" not in planned
    assert stamp.finished(planned, "0.34.0", NOW) == stamp.content(PLAN, "0.34.0", "k", NOW)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(stamp, "installed_version", {"vllm": "0.34.0"}.get)
    assert stamp.main(["write", json.dumps(planned)]) == 0
    assert "overrides in force: flashinfer-python==0.7.4" in capsys.readouterr().out
    assert stamp.overrides_in_force(stamp.read()) == ["flashinfer-python==0.7.4"]


def test_a_stamp_that_would_say_nothing_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its package not installed (or not JSON at all): its overrides would go unrecorded."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(stamp, "installed_version", {}.get)
    planned = json.dumps(stamp.planned(PLAN.release, PLAN.overrides, (), "k"))
    assert stamp.main(["write", planned]) == 2
    assert stamp.main(["write", "{not json"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"kvrig: vllm is not installed in {tmp_path}, so nothing is stamped"
    assert err[1].startswith("kvrig: the planned stamp is not JSON")
    assert stamp.read() is None
