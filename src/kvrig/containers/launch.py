"""Builds a platform's image and runs its column inside it: `kvrig container`.

    kvrig container {cpu,cuda,xpu,rocm} [--dry-run] [--engine auto|docker|podman]
        [--matrix PATH] [--results DIR] [--podman-compat] [--registry REG] [--push]
        [--build-only] [--from-wheels] [-- pytest args...]

The commands are decided elsewhere (kvrig.containers.plan); this is the edge that runs
them, so it alone removes the container on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from kvrig.containers import base_image, preflight
from kvrig.containers import settings as es
from kvrig.containers.args import Args, parse_args, requested_engine, with_gpu_arch
from kvrig.containers.assemble import make_plan
from kvrig.containers.facts import cache_dir, find_root, host_facts
from kvrig.containers.plan import (
    Plan,
    UsageError,
    dry_run_lines,
    passage_on,
    pull_failed_line,
    push_failure,
)
from kvrig.define import column_choice, gpus
from kvrig.provision import overlay_image


class _Terminated(Exception):
    pass


# A dry run asks no engine, so with --engine auto it prints Docker's commands; the run
# takes the first engine that answers.
AUTO_ENGINE = (
    "# --engine auto: Docker's commands (a dry run asks no engine; the run takes Docker when"
    " `docker info` answers, else Podman: `--engine podman` prints Podman's)"
)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _engine_env(settings: es.EngineSettings) -> dict[str, str]:
    return {**os.environ, **es.engine_env(settings)}


def _image_present(engine: str, image: str, settings: es.EngineSettings) -> bool:
    cmd = [engine, *es.global_flags(settings), "image", "inspect", image]
    done = subprocess.run(cmd, capture_output=True, env=_engine_env(settings), check=False)
    return done.returncode == 0


def _prepare_results(plan: Plan) -> None:
    plan.results.mkdir(parents=True, exist_ok=True)
    if plan.results_owner is not None:
        # The column runs as the image's unprivileged user (see user_args): hand it the folder.
        os.chown(plan.results, plan.results_owner, plan.results_owner)


def _run_teed(cmd: list[str], env: dict[str, str], keep: int = 400) -> tuple[int, str]:
    """Runs `cmd` with its output shown as it comes, and returns the output's last lines
    too, so a failure can be explained rather than only shown."""
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)
        code = proc.wait()
    sys.stdout.flush()
    return code, "".join(tail)


def pulled(plan: Plan) -> bool:
    """Whether the image is here, pulled from the plan's registry when it was not, so that
    neither its base nor a build is needed; a failed pull falls back to a build."""
    if _image_present(plan.engine, plan.image, plan.settings):
        return True
    if not plan.pull:
        return False
    print("+ " + shlex.join(plan.pull), file=sys.stderr, flush=True)
    code, output = _run_teed(plan.pull, _engine_env(plan.settings))
    if code == 0:
        return True
    assert plan.registry is not None
    print(pull_failed_line(plan.image, plan.registry, plan.engine, output), flush=True)
    return False


def _push(plan: Plan) -> None:
    print("+ " + shlex.join(plan.push), file=sys.stderr, flush=True)
    code, output = _run_teed(plan.push, _engine_env(plan.settings))
    if code != 0:
        assert plan.registry is not None
        raise preflight.PreflightError(
            push_failure(plan.image, plan.registry, plan.engine, code, output)
        )


def resolve_base(
    engine: str,
    wanted: str,
    settings: es.EngineSettings,
    probe: preflight.Probe,
    vllm_image: str | None = None,
    platform: str | None = None,
) -> str | None:
    """None when `wanted` is here or can be pulled; else the local image standing in for it,
    built first when absent, for hosts that reach no registry."""
    flags = es.global_flags(settings)
    try:
        preflight.check_base_image(engine, wanted, probe, flags, platform)
        return None
    except preflight.PreflightError as exc:
        suite = base_image.can_stand_in(wanted)
        if suite is None and vllm_image:
            raise preflight.PreflightError(
                f"{exc} The platform's vLLM is the prebuilt image {vllm_image}; to build the"
                " same release from the package index on the platform's base_image instead,"
                " add --from-wheels."
            ) from None
        if suite is None:
            raise
    local = base_image.local_tag(suite)
    if probe.run([engine, *flags, "image", "inspect", local])[0] == 0:
        print(f"kvrig.containers: {wanted} cannot be pulled; building on {local}", flush=True)
        return local
    print(
        f"kvrig.containers: {wanted} cannot be pulled; building {local} from Debian's"
        " packages (debootstrap) to build on instead",
        flush=True,
    )
    try:
        base_image.build(engine, local, suite, os.environ.get("KVRIG_DEBIAN_MIRROR") or None)
    except base_image.BaseImageError as exc:
        raise preflight.PreflightError(str(exc)) from None
    return local


def _build(plan: Plan) -> None:
    if plan.stage is not None:  # the overlay's inputs, or an empty folder without one
        overlay_image.stage(plan.overlay, plan.stage)
    if plan.overlay is not None:
        print(f"kvrig.containers: vLLM with {plan.overlay.describe()}", flush=True)
    for line in plan.pins.lines:
        print(f"kvrig.containers: {line}", flush=True)
    print("+ " + shlex.join(plan.build), file=sys.stderr, flush=True)
    code, output = _run_teed(plan.build, {**_engine_env(plan.settings), **plan.build_env})
    if code != 0:
        raise preflight.PreflightError(preflight.build_failure(plan.image, code, output))


def execute(plan: Plan, probe: preflight.Probe) -> int:
    es.write_containers_conf(plan.settings)
    if not _image_present(plan.engine, plan.image, plan.settings):
        _build(plan)
    if plan.push:
        _push(plan)
    if plan.build_only:
        print(f"kvrig.containers: {plan.image} is ready; --build-only runs no column", flush=True)
        return 0
    digest = subprocess.run(
        plan.digest, capture_output=True, text=True, env=_engine_env(plan.settings), check=False
    ).stdout.strip()
    _prepare_results(plan)
    env = {**_engine_env(plan.settings), "KVRIG_IMAGE_DIGEST": digest}
    print("+ " + shlex.join(plan.run), file=sys.stderr, flush=True)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    proc = subprocess.Popen(plan.run, env=env)
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Terminated) as exc:
        _stop(plan, proc)
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(plan: Plan, proc: subprocess.Popen[bytes]) -> None:
    """Removes the container whatever state its client is in.

    The engine's --rm does not fire when its client dies first, and an interrupt can land
    while the client is still creating the container, so removal is retried until the
    client has gone, and once more after. A second Ctrl-C must not cut this short.
    """
    env = _engine_env(plan.settings)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for _ in range(3):
            subprocess.run(plan.remove, capture_output=True, env=env, check=False)
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            proc.kill()
            proc.wait()
        subprocess.run(plan.remove, capture_output=True, env=env, check=False)
    finally:
        signal.signal(signal.SIGINT, previous)


def on_device(args: Args, probe: preflight.Probe) -> Args:
    """A CUDA or ROCm column is named by the host GPU's architecture, which must be the one
    --gpu-arch names: refused here, before any image is built."""
    if args.platform not in gpus.BY_ARCH:
        return args
    try:
        arch = preflight.check_architecture(probe, args.gpu_arch, platform=args.platform)
    except preflight.PreflightError as exc:
        raise UsageError(str(exc)) from None
    return with_gpu_arch(args, arch)


def planned_device(args: Args) -> Args:
    """A dry run's CUDA or ROCm column: the architecture --gpu-arch names, else the bare
    platform's name (a dry run asks the host nothing; the run names it by the GPU's)."""
    if args.platform not in gpus.BY_ARCH or not args.gpu_arch:
        return args
    try:
        choice = column_choice.requested(args.platform, gpu_arch=args.gpu_arch)
    except column_choice.ChoiceError as exc:
        raise UsageError(str(exc)) from None
    assert choice.arch is not None
    return with_gpu_arch(args, choice.arch)


def check_passage(plan: Plan, image: str, probe: preflight.Probe) -> None:
    """The device reaches a container of `image` (the base, or the image the registry
    gave), before anything is built."""
    if plan.passthrough is None:
        return
    cmd = passage_on(plan, image)
    preflight.check_passthrough(
        plan.platform, plan.engine, cmd, es.engine_env(plan.settings), probe
    )


def main(argv: Sequence[str] | None = None, probe: preflight.Probe | None = None) -> int:
    probe = probe or preflight.Probe()
    try:
        env = dict(os.environ)
        args = parse_args(sys.argv[1:] if argv is None else argv, env)
        root = find_root(Path.cwd())
        name = f"kvrig-{args.platform}-{os.getpid()}"
        requested = requested_engine(args, env)
        facts = es.read_host_facts(env)
        if args.dry_run:
            args = planned_device(args)
            engine = "docker" if requested == "auto" else requested
            settings = es.decide(engine, facts, env, cache_dir(env), args.host_settings)
            plan = make_plan(args, root, host_facts(engine), engine, env, name, settings)
            if requested == "auto":
                print(AUTO_ENGINE)
            print("\n".join(dry_run_lines(plan)))
            return 0
        engine = preflight.choose_engine(requested, probe, args.platform)
        settings = es.decide(engine, facts, env, cache_dir(env), args.host_settings)
        for reason in settings.reasons:
            print(f"kvrig.containers: {engine} setting: {reason}", flush=True)
        if args.emulate is None and not args.build_only:  # emulated, or a build: no device
            preflight.check_device(args.platform, probe)
            args = on_device(args, probe)
        es.write_containers_conf(settings)
        host = host_facts(engine)
        plan = make_plan(args, root, host, engine, env, name, settings)
        have = pulled(plan)  # from the registry: no base image, no build
        local = (
            None
            if have
            else resolve_base(
                engine, plan.base_image, settings, probe, plan.vllm_image, args.platform
            )
        )
        if local is not None:
            plan = make_plan(
                args, root, host, engine, env, name, settings, local, plan.overlay, plan.pins
            )
        preflight.check_wheel(root, plan.wheel, probe)
        if preflight.check_engine_runs(
            engine,
            plan.image if have else plan.base_image,
            es.global_flags(settings),
            es.engine_env(settings),
            probe,
            settings.host_network,
            es.may_add_host_network(engine, env, args.host_settings),
            args.platform,
        ):
            settings = es.with_host_network(settings)
            print(f"kvrig.containers: {engine} setting: {settings.reasons[-1]}", flush=True)
            plan = make_plan(
                args, root, host, engine, env, name, settings, local, plan.overlay, plan.pins
            )
        check_passage(plan, plan.image if have else plan.base_image, probe)
        return execute(plan, probe)
    except (preflight.PreflightError, UsageError, es.SettingsError) as exc:
        print(f"kvrig.containers: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
