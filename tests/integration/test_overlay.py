"""Overlays of the real installed vLLM, on real engines: a checkout made of the wheel's own
Python runs exactly as the release, a no-op patch gives the base's sizes and verdicts, a
checkout without the early check turns the early_error cell red, a broken patch stops
with nothing run, and uv's cache of vLLM is byte-identical after all of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrig.provision import overlay, uv_cache

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "matrix.yaml"
# A cell that runs, and one whose early check must fire.
CELLS = ["cpu-granite_hybrid-default", "cpu-granite_hybrid-exact_rejects"]
CHECK = "        if block_size == pre_block_size:\n            return\n"
GIT = ["git", "-c", "user.name=kvrig", "-c", "user.email=kvrig@localhost"]
# One worker takes every test here, in order: the last one holds uv's cache to what the
# first found, and the module's release column is run once.
pytestmark = pytest.mark.xdist_group("overlay")


def column(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    selected = ["-k", " or ".join(CELLS)]
    return subprocess.run(
        [sys.executable, "-m", "kvrig", "--matrix", str(MATRIX), "column", "--platform", "cpu",
         "--results", str(results), "--rerun", *args, *selected, "-q"],
        capture_output=True, text=True, check=False, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
    )  # fmt: skip


def kvrig_compare(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvrig", "compare", str(a), str(b)],
        capture_output=True,
        text=True,
        check=False,
    )


def records(results: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (results / "records").glob("*.json")}


@pytest.fixture(scope="module")
def uv_before() -> dict[str, str]:
    before = uv_cache.digests(uv_cache.cache_dir())
    assert before, "uv's cache holds no vLLM: nothing here could prove it untouched"
    return before


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory, uv_before: dict[str, str]) -> Path:
    results = tmp_path_factory.mktemp("release") / "results"
    out = column(results)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return results


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A vLLM tree of the installed wheel's own Python files, committed."""
    root = tmp_path_factory.mktemp("checkout") / "vllm-src"
    package = overlay.installed_package()
    for path in package.rglob("*.py"):
        if "__pycache__" not in path.parts:
            target = root / "vllm" / path.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    subprocess.run([*GIT, "-C", str(root), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "the wheel's Python"], check=True)
    yield root


def test_a_checkout_of_the_wheels_own_python_runs_exactly_as_the_release(
    release: Path, checkout: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    out = column(results, "--vllm-source", str(checkout))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "with the Python of source" in out.stderr
    same = kvrig_compare(release, results)
    assert same.returncode == 0 and "no cell differs" in same.stdout, same.stdout
    recs = records(results)
    assert sorted(recs) == sorted(CELLS)
    for rec in recs.values():
        named = rec["vllm_overlay"]
        assert named["source"] == str(checkout) and named["files"] == []
        assert len(named["commit"]) == 40 and named["dirty"] is None
        assert "/overlays/" in rec["vllm_file"]  # the copy was what the engine imported
    report = (results / "report.md").read_text()
    assert "vLLM under test: " in report and str(checkout) in report


def test_a_noop_patch_gives_the_base_sizes_and_verdicts_exactly(
    release: Path, tmp_path: Path
) -> None:
    interface = overlay.installed_package() / "platforms" / "interface.py"
    patch = tmp_path / "noop.diff"
    old = interface.read_text().splitlines(keepends=True)
    new = [*old, "# a comment: the code is the base's\n"]
    n = len(old)
    patch.write_text(
        "diff --git a/vllm/platforms/interface.py b/vllm/platforms/interface.py\n"
        "--- a/vllm/platforms/interface.py\n+++ b/vllm/platforms/interface.py\n"
        f"@@ -{n - 2},3 +{n - 2},4 @@\n" + "".join(f" {x}" for x in old[-3:]) + f"+{new[-1]}"
    )
    results = tmp_path / "results"
    out = column(results, "--vllm-patch", str(patch))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    same = kvrig_compare(release, results)
    assert same.returncode == 0 and "no cell differs" in same.stdout, same.stdout
    sizes = {r["cell_id"]: r["worker_block_size"] for r in _rows(results)}
    assert sizes == {r["cell_id"]: r["worker_block_size"] for r in _rows(release)}
    for rec in records(results).values():
        assert rec["vllm_overlay"]["files"] == ["vllm/platforms/interface.py"]


def test_a_checkout_without_the_early_check_turns_the_early_error_cell_red(
    release: Path, checkout: Path, tmp_path: Path
) -> None:
    interface = checkout / "vllm" / "platforms" / "interface.py"
    text = interface.read_text()
    assert text.count(CHECK) == 1, "the base's _check_aligned_block_size changed shape"
    interface.write_text(text.replace(CHECK, "        return\n"))
    try:
        results = tmp_path / "results"
        out = column(results, "--vllm-source", str(checkout))
    finally:
        interface.write_text(text)
    assert out.returncode != 0  # the early_error cell is red
    diff = kvrig_compare(release, results)
    assert diff.returncode == 1, diff.stdout
    assert "cpu-granite_hybrid-exact_rejects" in diff.stdout and "turned red" in diff.stdout
    assert "cpu-granite_hybrid-default " not in diff.stdout  # unchanged cells are not listed
    rec = records(results)["cpu-granite_hybrid-exact_rejects"]
    assert rec["outcome"] == "ran" and rec["vllm_overlay"]["dirty"]
    assert rec["vllm_overlay"]["files"] == ["vllm/platforms/interface.py"]


def test_a_broken_patch_exits_2_with_nothing_run(tmp_path: Path) -> None:
    patch = tmp_path / "broken.diff"
    patch.write_text(
        "diff --git a/vllm/platforms/interface.py b/vllm/platforms/interface.py\n"
        "--- a/vllm/platforms/interface.py\n+++ b/vllm/platforms/interface.py\n"
        "@@ -1,2 +1,2 @@\n-not what the file says\n+anything\n context that is not there\n"
    )
    results = tmp_path / "results"
    out = column(results, "--vllm-patch", str(patch))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("kvrig: The patch") and "does not apply" in out.stderr
    assert out.stderr.count("\n") == 1  # one paragraph
    assert not results.exists()  # no engine started, nothing written


def test_uv_cache_of_vllm_is_byte_identical_after_every_overlay_above(
    uv_before: dict[str, str],
) -> None:
    assert uv_cache.changed(uv_before, uv_cache.digests(uv_cache.cache_dir())) == []


def _rows(results: Path) -> list[dict]:
    from kvrig.publish import results as results_mod

    return results_mod.read(results)
