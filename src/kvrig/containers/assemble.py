"""One column's Plan, put together from its command line, the checkout and the host.

The decisions are kvrig.containers.plan's and the reads kvrig.containers.facts'; they meet
here so that kvrig.containers.launch has one call to make and a test one call to check.

    KVRIG_BASE_IMAGE=IMAGE: build on IMAGE instead of the platform's base_image. When the
        base cannot be pulled and a local Debian image can stand in for it, that image is
        built with debootstrap (kvrig.containers.base_image) and used, with a line saying so.
    KVRIG_CACHE_FROM=REF: an image to take BuildKit layer cache from (a CI registry).
"""

from __future__ import annotations

from pathlib import Path

from kvrig.containers import settings as es
from kvrig.containers.args import Args
from kvrig.containers.facts import (
    cache_dir,
    image_pins,
    inputs_digest,
    load_for,
    load_spec,
    rig_files,
    staged_overlay,
)
from kvrig.containers.plan import (
    OVERLAY_STAGE,
    Host,
    ImagePins,
    Plan,
    UsageError,
    build_args,
    build_command,
    build_env,
    digest_command,
    image_tag,
    passthrough_command,
    remove_command,
    results_owner,
    rig_version,
    run_command,
)
from kvrig.define import column_choice, named_release
from kvrig.define.paths import results_folder
from kvrig.host import isa
from kvrig.provision import index, overlay_image


def make_plan(
    args: Args,
    root: Path,
    host: Host,
    engine: str,
    env: dict[str, str],
    name: str,
    settings: es.EngineSettings | None = None,
    base_override: str | None = None,
    staged: overlay_image.Staged | None = None,
    pinned: ImagePins | None = None,
    get: index.Get | None = None,
) -> Plan:
    """The whole column as commands; reads the checkout's files and the release's pins but
    changes nothing. `staged` and `pinned` are an earlier plan's reads, so a plan made again
    for another base image or network neither reads them again nor decides them otherwise."""
    spec = load_spec(args, root)
    if settings is None:
        settings = es.decide(engine, es.HostFacts(), env, cache_dir(env), args.host_settings)
    if pinned is None:
        pinned = image_pins(args.platform, spec, root, env, settings, get)
    bargs = build_args(
        args.platform,
        spec,
        base_override or env.get("KVRIG_BASE_IMAGE") or None,
        settings,
        pinned.applied,
    )
    staged = staged or staged_overlay(args, spec, root)
    if staged is not None:
        bargs.update(VLLM_OVERLAY=staged.kind, VLLM_OVERLAY_DIGEST=staged.digest)
    dockerfile = (root / "docker" / f"Dockerfile.{args.platform}").read_bytes()
    files = rig_files(root)
    tag = image_tag(
        args.platform,
        dockerfile,
        rig_version((root / "pyproject.toml").read_text()),
        inputs_digest(root, files),
        bargs,
        args.registry,
    )
    # An emulated CPU class (--isa avx2, or pytest's --kvrig-isa) writes its own column's folder.
    cls, _ = isa.take_arg(args.cpu_class, args.pytest_args)
    try:
        column = column_choice.requested(
            args.platform, cls, args.emulate, gpu_arch=args.gpu_arch
        ).column
    except column_choice.ChoiceError as exc:
        raise UsageError(str(exc)) from None
    column = named_release.folder_name(column, load_for(args, root)[1])
    if staged is not None and (args.vllm_source or args.vllm_patch):
        # Beside the release's results, not over them: `kvrig compare` reads both.
        column = f"{column}-overlay-{staged.digest[:8]}"
    results = (args.results or root / results_folder(column)).resolve()
    # Always mounted: the images hold no matrix of their own.
    custom_matrix = (args.matrix or root / "matrix.yaml").resolve()
    flags = es.global_flags(settings)
    return Plan(
        platform=args.platform,
        engine=engine,
        image=tag,
        container=name,
        results=results,
        build=build_command(
            engine, root, args.platform, tag, bargs, settings, env.get("KVRIG_CACHE_FROM") or None
        ),
        build_env=build_env(engine, settings),
        run=run_command(
            engine,
            args.platform,
            tag,
            name,
            results,
            host,
            [*args.column_args, *args.pytest_args],
            custom_matrix,
            settings,
            device=args.emulate is None,
        ),
        remove=remove_command(engine, name, flags),
        digest=digest_command(engine, tag, flags),
        base_image=bargs["BASE_IMAGE"],
        global_flags=flags,
        settings=settings,
        wheel=spec.vllm.installed.wheel if spec.vllm.installed.kind == "wheel" else None,
        results_owner=results_owner(engine, host),
        overlay=staged,
        stage=root / OVERLAY_STAGE,
        passthrough=(
            passthrough_command(engine, args.platform, bargs["BASE_IMAGE"], host, settings)
            if args.emulate is None and not args.build_only
            else None
        ),
        registry=args.registry,
        pull=[engine, *flags, "pull", tag] if args.registry else [],
        push=[engine, *flags, "push", tag] if args.push else [],
        build_only=args.build_only,
        vllm_image=spec.vllm.image if spec.vllm.kind == "image" else None,
        pins=pinned,
    )
