"""The platform's vLLM installed into this interpreter's environment, as its plan says.

`kvrig setup vllm` runs in the environment it installs into (a nox session's), so the
plan (kvrig.provision.install) is run with uv against this interpreter. uv, not pip: the
CPU plan keeps CUDA builds of torchvision and friends out with `--override`, which only
uv has. Where no uv is found (nox's virtualenv backend), it is first installed into the
environment with pip, which such environments have.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from kvrig.provision import uv
from kvrig.provision.install import InstallError, Plan

Run = Callable[..., subprocess.CompletedProcess]


def command(uv_exe: str, python: str, plan: Plan) -> list[str]:
    """The install, against the given interpreter's environment (pure)."""
    return [uv_exe, "pip", "install", "--python", python, *plan.args]


def uv_in_environment(python: str) -> str:
    """Where pip puts uv's executable in the interpreter's environment."""
    return str(Path(python).parent / "uv")


def ensure_uv(python: str, environ: Mapping[str, str], run: Run = subprocess.run) -> str:
    """A uv to install with: found ($UV, PATH), else installed into the environment."""
    found = uv.find(environ)
    if found:
        return found
    print("kvrig: no uv found; installing it into this environment with pip", flush=True)
    done = run([python, "-m", "pip", "install", "-q", "uv"], check=False)
    if done.returncode != 0:
        raise InstallError(
            "vLLM is installed with uv (its --override keeps CUDA builds out of a CPU"
            " environment), and none was found ($UV, PATH) nor could pip install one here"
            f" (`{python} -m pip install uv` exited {done.returncode}). Install uv (pip install"
            " uv, or run through nox with the uv backend: pip install 'nox[uv]')."
        )
    return uv_in_environment(python)


def install(
    plan: Plan,
    *,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    run: Run = subprocess.run,
    dry_run: bool = False,
) -> int:
    """Runs the plan (or, dry, prints the command it would run); uv's exit status."""
    environ = os.environ if environ is None else environ
    if dry_run:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in plan.env.items())
        print(prefix + shlex.join(command(uv.find(environ) or "uv", python, plan)))
        return 0
    argv = command(ensure_uv(python, environ, run), python, plan)
    print("+ " + shlex.join(argv), file=sys.stderr, flush=True)
    return run(argv, env={**environ, **plan.env}, check=False).returncode
