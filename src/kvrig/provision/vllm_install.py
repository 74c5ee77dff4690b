"""The platform's vLLM installed into this interpreter's environment, as its plan says.

uv, not pip: the CPU plan keeps CUDA builds of torchvision and friends out with
`--override`, which only uv has; where none is found (nox's virtualenv backend), pip
installs it first.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import importlib
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvrig.define.matrix import Matrix
from kvrig.define.platform_spec import PlatformSpec
from kvrig.provision import index, pin_check, pins, stamp, uv
from kvrig.provision import install as install_mod
from kvrig.provision.install import InstallError, Plan
from kvrig.provision.pins import Override

Run = Callable[..., subprocess.CompletedProcess]
# The end of uv's output kept to read its resolver message from (lines).
KEPT_LINES = 200


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


def tee(
    argv: list[str], env: Mapping[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """Runs a command with its stderr shown as it comes and its end kept (`.stderr`): uv
    says why a resolution failed there, and the user still sees the install go by."""
    kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            kept.append(line)
        code = proc.wait()
    return subprocess.CompletedProcess(argv, code, stderr="".join(kept))


def run_plan(
    plan: Plan,
    *,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    run: Run = tee,
) -> subprocess.CompletedProcess:
    """Runs the plan with uv; what uv left on stderr, when the runner keeps it."""
    environ = os.environ if environ is None else environ
    argv = command(ensure_uv(python, environ, run), python, plan)
    print("+ " + shlex.join(argv), file=sys.stderr, flush=True)
    return run(argv, env={**environ, **plan.env}, check=False)


def install(
    plan: Plan,
    *,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    run: Run = tee,
    dry_run: bool = False,
) -> int:
    """Runs the plan (or, dry, prints the command it would run); uv's exit status."""
    environ = os.environ if environ is None else environ
    if dry_run:
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in plan.env.items())
        print(prefix + shlex.join(command(uv.find(environ) or "uv", python, plan)))
        return 0
    return run_plan(plan, python=python, environ=environ, run=run).returncode


# --- `kvrig setup vllm`: the check, the install, the stamp ---------------------------------


@dataclass(frozen=True)
class Job:
    """One `kvrig setup vllm`, with the command as a user would rerun it, so a refusal can
    name it with an --override added."""

    matrix: Matrix
    platform: str
    emulated: bool = False
    requested: tuple[Override, ...] = ()
    command: str = "kvrig setup vllm"
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: os.environ)

    @property
    def spec(self) -> PlatformSpec:
        return install_mod.platform_spec(self.matrix, self.platform, emulated=self.emulated)

    def plan(self, more: Sequence[Override] = ()) -> Plan:
        """The install with the overrides asked for and `more` (the matrix's that apply)."""
        return install_mod.plan_for(
            self.matrix,
            self.platform,
            emulated=self.emulated,
            environ=self.environ,
            pinned=[*self.requested, *more],
        )


def checked_plan(job: Job, get: index.Get | None = None) -> Plan:
    """The plan once the release's pins are checked (pins.PinError where one is served
    nowhere and not overridden), with the matrix's overrides the release calls for."""
    plan = job.plan()
    request = pin_check.Request(plan, job.platform, job.spec.pin_overrides, job.command)
    found = pin_check.check(request, job.environ, get or index.http_get)
    for line in found.lines:
        print(line, flush=True)
    if found.applied:
        plan = job.plan(found.applied)
    if found.declared and plan.release:
        named = pins.replacing(plan.overrides, found.declared, str(plan.release))
        plan = dataclasses.replace(plan, overrides=tuple(named))
    return plan


def setup(job: Job, plan: Plan, run: Run = tee, get: index.Get | None = None) -> int:
    """Installs the checked plan and leaves its stamp; uv's exit status. uv's failure over a
    release pin is said as the check says it, or retried where the matrix overrides it."""
    done = run_plan(plan, environ=job.environ, run=run)
    if done.returncode != 0:
        retry = _after_failure(job, plan, str(done.stderr or ""), get or index.http_get)
        if retry is None:
            return done.returncode
        plan = retry
        done = run_plan(plan, environ=job.environ, run=run)
        if done.returncode != 0:
            return done.returncode
    importlib.invalidate_caches()
    package = plan.release.package if plan.release else "vllm"
    now = dt.datetime.now(dt.timezone.utc)
    data = stamp.content(plan, stamp.installed_version(package), job.command, now)
    print(f"kvrig: installed; stamp {stamp.write(data)}", flush=True)
    return 0


def _after_failure(job: Job, plan: Plan, output: str, get: index.Get) -> Plan | None:
    """The plan to run again when uv named a pin the matrix overrides, else None after a
    line of advice; raises the paragraph for a release pin uv could not resolve."""
    release = plan.release
    gap = pins.resolver_gap(output, release.package) if release else None
    if gap is None or release is None:
        if "No solution found" in output:
            print(
                "kvrig: uv found no set of versions to install (its message is above); where"
                " a pin of the release is what the index cannot serve, `--override PKG==VER`"
                f" takes another version ({pins.DOCS})",
                file=sys.stderr,
            )
        return None
    more = [
        o
        for o in pins.from_matrix(job.spec.pin_overrides, [gap], job.platform, str(release))
        if o.key not in {p.key for p in plan.overrides}
    ]
    if more:
        print(
            f"kvrig: uv found no {gap} ({release} pins it); {more[0].source} takes"
            f" {more[0].requirement} instead: installing again, into an environment that is"
            " not the release's own",
            flush=True,
        )
        asked = {o.key for o in job.requested}
        again = job.plan([*(o for o in plan.overrides if o.key not in asked), *more])
        return dataclasses.replace(again, overrides=(*plan.overrides, *more))
    sources = pin_check.sources_for(plan, job.environ)
    versions = (
        None if index.offline(job.environ) else _versions_or_none(sources.index, gap.name, get)
    )
    raise pins.PinError(
        pins.refusal(
            str(release),
            [pins.Gap(gap, versions)],
            sources.does(),
            job.command,
            job.platform,
            done="uv installed nothing.",
        )
    )


def _versions_or_none(where: str, name: str, get: index.Get) -> list[str] | None:
    try:
        return index.project(where, name, get).versions
    except index.Unreachable:
        return None
