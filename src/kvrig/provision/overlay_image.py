"""An overlay in an image: its inputs staged on the host, built over the image's vLLM.

The host of an image build need not have vLLM but has the checkout and its git history,
so the inputs are checked there and the image's build makes the overlay over its own vLLM.

    python -m kvrig.provision.overlay_image build-staged INPUTS TARGET
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.define.platform_spec import VllmSource
from kvrig.provision.overlay import Manifest, digest_of, installed_distribution, prepare, run_file
from kvrig.provision.overlay_inputs import (
    OverlayError,
    checked_patch,
    ignored_note,
    outside_package,
    read_checkout,
    resolve,
    sha256,
)

REQUEST = "request.json"


@dataclass(frozen=True)
class Staged:
    """An overlay's inputs as an image build takes them, read and checked on the host."""

    kind: str  # "patch" or "source"
    identity: dict[str, Any]  # what the manifest names: the host's paths, commit, dirty
    files: dict[str, Path]  # path in the build's input folder -> the host's file
    digest: str  # over every input: part of the image's tag
    ignored: tuple[str, ...] = ()  # a patch's files outside vllm/, left out

    def describe(self) -> str:
        what = self.identity.get("patch") or self.identity.get("source")
        note = ignored_note(self.ignored)
        return f"the Python of {self.kind} {what} (overlay inputs {self.digest})" + (
            f"; {note}" if note else ""
        )


def staged_inputs(source: VllmSource, *, relative_to: Path, base_version: str) -> Staged:
    """Reads and checks an overlay's inputs without the base installed; refuses what
    prepare() would, but a patch that does not apply, which only the image's vLLM can tell."""
    base = source.installed.describe()
    if source.patch is not None:
        patch, diffs = checked_patch(resolve(source.patch, relative_to), base)
        sha = sha256(patch)
        return Staged(
            "patch",
            {"patch": str(patch), "patch_sha256": sha},
            {"fix.diff": patch},
            digest_of(base, [("patch", sha)]),
            tuple(outside_package(diffs)),
        )
    checkout = read_checkout(resolve(str(source.source), relative_to), base_version, base)
    identity = {
        "source": str(checkout.root),
        "commit": checkout.commit,
        "dirty": checkout.dirty,
        "compiled_check": checkout.compiled_check,
    }
    files = {f"src/{name}": path for name, path in sorted(checkout.files.items())}
    parts = [(name, sha256(path)) for name, path in files.items()]
    return Staged("source", identity, files, digest_of(base, parts))


def stage(staged: Staged | None, into: Path) -> None:
    """Fills the build's input folder (emptied first: a build without an overlay gets
    nothing stale)."""
    if into.exists():
        for child in into.iterdir():
            if child.name != ".keep":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    into.mkdir(parents=True, exist_ok=True)
    if staged is None:
        return
    for name, path in staged.files.items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, into / name)
    request = {"kind": staged.kind, "identity": staged.identity, "digest": staged.digest}
    (into / REQUEST).write_text(json.dumps(request, indent=2) + "\n")


def build_staged(inputs: Path, target: Path) -> Manifest:
    """In an image build: the overlay of the staged inputs over the image's vLLM, at
    `target` (a link to it, so the image's environment can name a fixed path)."""
    request = json.loads((inputs / REQUEST).read_text())
    name, _, version = installed_distribution().partition("==")
    base = VllmSource(kind="pypi", package=name, version=version)
    if request["kind"] == "patch":
        wanted = VllmSource(kind="overlay", base=base, patch=str(inputs / "fix.diff"))
    else:
        wanted = VllmSource(kind="overlay", base=base, source=str(inputs / "src"))
    cache = target.parent / "vllm-overlays"
    manifest = prepare(wanted, relative_to=inputs, cache=cache, identity=request["identity"])
    target.unlink(missing_ok=True)
    target.symlink_to(manifest.path)
    run_file(manifest, target.with_suffix(".json"))  # the image's KVRIG_OVERLAY
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kvrig.provision.overlay_image build-staged INPUTS TARGET`, in an image build."""
    p = argparse.ArgumentParser(prog="python -m kvrig.provision.overlay_image")
    p.add_argument("action", choices=["build-staged"])
    p.add_argument("inputs", type=Path)
    p.add_argument("target", type=Path)
    ns = p.parse_args(argv)
    try:
        manifest = build_staged(ns.inputs, ns.target)
    except OverlayError as exc:
        print(f"kvrig: {exc}", file=sys.stderr)
        return 2
    print(f"kvrig: vLLM {manifest.describe()}")
    if manifest.ignored_line():
        print(f"kvrig: {manifest.ignored_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
