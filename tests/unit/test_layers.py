"""The layers contract holds, and breaks on an import that runs back along the data path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .builders import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    return subprocess.run(
        [str(LINT), "--config", str(tmp_path / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def test_a_back_edge_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src" / "kvrig", tmp_path / "src" / "kvrig")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kept = lint(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    # define (the matrix) reaching up into publish (the report): a back edge.
    paths = tmp_path / "src" / "kvrig" / "define" / "paths.py"
    paths.write_text(paths.read_text() + "\nfrom kvrig.publish import report  # noqa\n")
    broken = lint(tmp_path)
    assert broken.returncode != 0
    assert "kvrig.define.paths -> kvrig.publish.report" in broken.stdout
