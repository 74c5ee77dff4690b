"""The proof that nothing the rig does writes into uv's cache of vLLM.

uv installs by hard-linking files from its cache, so a write through an installed vLLM
file changes every environment made from it; digests before and after make such a run fail
instead of passing on silently corrupted installs.

`kvrig check uv-cache snapshot FILE` writes the digests; `kvrig check uv-cache compare
FILE` compares and exits 1 on any change (files added since are fine: a new install).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from kvrig.provision.uv import find as find_uv


class UvCacheError(Exception):
    """The check cannot run; the message says why, in one paragraph."""


def cache_dir() -> Path:
    """uv's cache folder, as uv itself reports it (UV_CACHE_DIR, XDG, or its default)."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    uv = find_uv()
    if uv is None:
        raise UvCacheError(
            "uv is not on PATH, so its cache cannot be found or checked. Run this through"
            " nox with the uv backend (pip install 'nox[uv]'), as the README's commands do."
        )
    out = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise UvCacheError(f"`uv cache dir` failed: {out.stderr.strip() or 'no output'}")
    return Path(out.stdout.strip())


def vllm_packages(cache: Path) -> list[Path]:
    """Every unpacked vllm package in the cache (one per cached wheel)."""
    return sorted(p.parent for p in cache.glob("archive-v*/*/vllm/__init__.py"))


def digests(cache: Path) -> dict[str, str]:
    """sha256 of every file of every cached vllm package, by path."""
    out = {}
    for package in vllm_packages(cache):
        for path in sorted(package.rglob("*")):
            if path.is_file() and not path.is_symlink():
                h = hashlib.sha256()
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                out[str(path)] = h.hexdigest()
    return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The files that were there before and differ or are gone; new files are a new install."""
    return sorted(p for p, digest in before.items() if after.get(p) != digest)


def snapshot(file: Path) -> int:
    """Writes the digests of every cached vLLM file to `file`, for `compare` after."""
    cache = cache_dir()
    now = digests(cache)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"cache": str(cache), "files": now}))
    print(f"uv cache: {len(now)} vLLM file(s) in {cache} recorded")
    return 0


def compare(file: Path) -> int:
    """1 when a cached vLLM file recorded in `file` differs from its digest."""
    cache = cache_dir()
    if not file.is_file():
        raise UvCacheError(
            f"No snapshot at {file}: take one first (kvrig check uv-cache snapshot {file})."
        )
    now = digests(cache)
    before = json.loads(file.read_text())["files"]
    bad = changed(before, now)
    if bad:
        print(
            f"uv cache CHANGED: {len(bad)} cached vLLM file(s) differ from before the run,"
            f" e.g. {', '.join(bad[:5])}. Something wrote through an installed vLLM; clear"
            " uv's cache (uv cache clean) before trusting any environment made from it."
        )
        return 1
    if not before:
        print(
            f"uv cache: it held no vLLM before the run ({cache}), so there was nothing to"
            " compare here; the mutation session compares its own before and after."
        )
        return 0
    print(f"uv cache: all {len(before)} cached vLLM file(s) byte-identical before and after")
    return 0
