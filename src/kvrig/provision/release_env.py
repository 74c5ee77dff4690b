"""An environment of kvrig's own for a vLLM release named on the command line.

Installing another release over the nox session's vLLM would leave the session judging the
wrong one. uv hard-links from its cache, so a second environment costs its own wheels only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvrig.define.named_release import NamedRelease
from kvrig.provision import uv

# Set in a column re-run in a release's environment: it must not look for another.
IN_RELEASE_ENV = "KVRIG_RELEASE_ENV"
STAMP = "kvrig-release-env.json"
# kvrig's checkout (src/kvrig/provision/ -> the root holding pyproject.toml).
ROOT = Path(__file__).resolve().parents[3]

Run = Callable[..., subprocess.CompletedProcess]


class ReleaseEnvError(Exception):
    """An environment for the release cannot be made; one paragraph saying what to do."""


def envs_root(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("KVRIG_ENVS"):
        return Path(environ["KVRIG_ENVS"])
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kvrig" / "envs"


@dataclass(frozen=True)
class Wanted:
    """What a release's environment is made of: the column kind (`emulated`: the CUDA
    wheel), the release and the overrides its install was given."""

    kind: str
    named: NamedRelease
    overrides: tuple[str, ...] = ()
    matrix: str | None = None

    def folder(self, root: Path) -> Path:
        """One folder per release and kind; a wheel file's by its path too (two nightlies
        of one version are two environments)."""
        slug = self.named.slug
        if self.named.wheel:
            slug += "-" + hashlib.sha256(self.named.wheel.encode()).hexdigest()[:8]
        return root / f"{self.kind}-{slug}"

    def identity(self) -> dict[str, object]:
        """What must be unchanged for the environment to be reused."""
        return {
            "kind": self.kind,
            "release": self.named.describe(),
            "overrides": sorted(self.overrides),
            "kvrig": str(ROOT),
            "matrix": self.matrix,
        }

    def setup_args(self) -> list[str]:
        """`kvrig setup vllm` for the release, as the environment runs it."""
        target = ["--emulated"] if self.kind == "emulated" else [self.kind]
        extra = [f"--override={o}" for o in self.overrides]
        matrix = ["--matrix", self.matrix] if self.matrix else []
        return [*matrix, "setup", "vllm", *target, "--vllm", self.named.wheel or self.named.version,
                *extra]  # fmt: skip


def group_for(kind: str) -> str:
    """The dependency group of pyproject.toml the column needs beside kvrig."""
    return "emulated" if kind == "emulated" else "column"


def reusable(folder: Path, wanted: Wanted) -> bool:
    stamp = folder / STAMP
    try:
        return json.loads(stamp.read_text()) == wanted.identity()
    except (OSError, ValueError):
        return False


def ensure(
    wanted: Wanted,
    *,
    root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    run: Run = subprocess.run,
) -> Path:
    """The environment's folder, made or brought up to date by one column at a time, as a
    release diff starts several of a release's columns at once."""
    environ = os.environ if environ is None else environ
    folder = wanted.folder(root or envs_root(environ))
    if reusable(folder, wanted):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait, then find it made
        if not reusable(folder, wanted):
            _make(wanted, folder, environ, run)
    return folder


def _make(wanted: Wanted, folder: Path, environ: Mapping[str, str], run: Run) -> None:
    if not (ROOT / "pyproject.toml").is_file():
        raise ReleaseEnvError(
            f"A column for vLLM {wanted.named.describe()} runs in an environment made from"
            f" kvrig's checkout, and this kvrig is not run from one ({ROOT} holds no"
            " pyproject.toml). Run it from a checkout of kvrig (pip install -e .)."
        )
    uv_exe = uv.find(environ)
    if uv_exe is None:
        raise ReleaseEnvError(
            f"A column for vLLM {wanted.named.describe()} runs in an environment of its own,"
            " made with uv, and no uv was found ($UV, PATH). Install uv (pip install uv), or"
            " run through nox, which has it."
        )
    print(
        f"kvrig: making the environment for vLLM {wanted.named.describe()} ({wanted.kind}) in"
        f" {folder}: uv, about a minute when its cache holds the wheels",
        file=sys.stderr,
        flush=True,
    )
    (folder / STAMP).unlink(missing_ok=True)
    steps = commands(wanted, folder, uv_exe)
    for i, step in enumerate(steps):
        _step(step, run, environ, wanted, kvrig_setup=i == len(steps) - 1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAMP).write_text(json.dumps(wanted.identity()))


def commands(wanted: Wanted, folder: Path, uv_exe: str) -> list[list[str]]:
    """The environment made with this interpreter, kvrig editable with its column's tools,
    then the release's vLLM by kvrig's own setup (pins checked, overrides recorded)."""
    python = str(folder / "bin" / "python")
    venv = [uv_exe, "venv", "--quiet", "--allow-existing", "--python", sys.executable, str(folder)]
    rig = [uv_exe, "pip", "install", "--quiet", "--python", python, "-e", str(ROOT),
           "--group", f"{ROOT / 'pyproject.toml'}:{group_for(wanted.kind)}"]  # fmt: skip
    return [venv, rig, [python, "-m", "kvrig", *wanted.setup_args()]]


def _step(
    argv: Sequence[str],
    run: Run,
    environ: Mapping[str, str],
    wanted: Wanted,
    *,
    kvrig_setup: bool,
) -> None:
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    done = run(list(argv), env=dict(environ), check=False)
    if done.returncode == 0:
        return
    if kvrig_setup and done.returncode == 2:  # kvrig's own refusal, its paragraph above
        raise ReleaseEnvError(
            f"The environment for vLLM {wanted.named.describe()} could not be set up: its"
            " install was refused (the paragraph above says why and what to do). Nothing"
            " was run."
        )
    raise ReleaseEnvError(
        f"The environment for vLLM {wanted.named.describe()} could not be made: `{argv[0]}"
        f" {' '.join(argv[1:3])} ...` exited {done.returncode} (its output is above). Nothing"
        " was run; fix that and start again (the environment is remade, not reused)."
    )


def python_of(folder: Path) -> str:
    return str(folder / "bin" / "python")


def installed_version(package: str) -> str | None:
    """The version of `package` in this interpreter's environment, or None."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def is_installed(named: NamedRelease, installed: str | None) -> bool:
    """Whether the installed version is the named release: a wheel's exactly (a nightly
    differs from the release it precedes), a release by its number."""
    if installed is None:
        return False
    if named.wheel is not None:
        return installed == named.version
    from kvrig.define import releases

    try:
        return releases.parse(installed) == releases.parse(named.version) and (
            "dev" not in installed and "+" not in installed
        )
    except releases.VersionError:
        return False
