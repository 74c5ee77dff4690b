"""What a plan is made from that is read, not decided: host groups, checkout, overlay, pins.

Kept apart from kvrig.containers.plan so that the commands stay functions of values and a
test can hand them the values instead.
"""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvrig.containers import settings as es
from kvrig.containers.args import Args
from kvrig.containers.plan import Host, ImagePins, UsageError, from_wheels
from kvrig.define import named_release
from kvrig.define.matrix import Matrix, MatrixError
from kvrig.define.matrix import load as load_matrix
from kvrig.define.platform_spec import PlatformSpec
from kvrig.provision import index, install, overlay_image, pin_check, pins
from kvrig.provision import overlay as overlay_mod

# What the images install besides vLLM (docker/Dockerfile.*: COPY): kvrig's dependencies
# and code. Not its README or matrix.yaml: the matrix is mounted when the column runs, so
# a typo fixed there rebuilds no image.
RIG_INPUTS = ("pyproject.toml", "src")


def host_facts(engine: str) -> Host:
    uid, gid = os.getuid(), os.getgid()
    return Host(
        uid=uid, gid=gid, render_gids=render_gids(), rootless_podman=engine == "podman" and uid != 0
    )


def render_gids(dri: Path = Path("/dev/dri"), kfd: Path = Path("/dev/kfd")) -> tuple[int, ...]:
    """The groups owning the GPU nodes (/dev/dri, and /dev/kfd on AMD): what --group-add
    needs for the container's user to open them."""
    gids = (
        {p.stat().st_gid for p in sorted(dri.glob("*")) if not p.is_dir()}
        if dri.is_dir()
        else set()
    )
    if kfd.exists():
        gids.add(kfd.stat().st_gid)
    if not gids:
        try:
            gids = {grp.getgrnam("render").gr_gid}
        except KeyError:
            gids = set()
    return tuple(sorted(g for g in gids if g != 0))


def find_root(start: Path) -> Path:
    """The checkout: the first folder upwards holding docker/ and pyproject.toml.

    nox installs kvrig into its own venv, so the module's location says nothing about the
    checkout; the working directory does.
    """
    for folder in (start, *start.parents):
        if (folder / "docker" / "Dockerfile.cpu").is_file() and (
            folder / "pyproject.toml"
        ).is_file():
            return folder
    fallback = Path(__file__).resolve().parents[2]
    if (fallback / "docker").is_dir():
        return fallback
    raise UsageError(
        f"No kvrig checkout (a folder with docker/Dockerfile.cpu and pyproject.toml) holds"
        f" {start}. Run from the checkout, where the images are built from."
    )


def rig_files(root: Path) -> list[Path]:
    """The files COPY'd into the image, in a stable order; caches and bytecode excluded."""
    files: list[Path] = []
    for name in RIG_INPUTS:
        path = root / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
    return files


def inputs_digest(root: Path, files: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def load_for(args: Args, root: Path) -> tuple[Matrix, named_release.NamedRelease | None]:
    """The matrix the column runs on, a release named with --vllm standing in for the pin."""
    matrix_path = args.matrix or root / "matrix.yaml"
    try:
        return named_release.for_column(
            load_matrix(matrix_path), args.platform, args.emulate is not None, args.vllm
        )
    except MatrixError as exc:
        raise UsageError(str(exc)) from None


def load_spec(args: Args, root: Path) -> PlatformSpec:
    matrix_path = args.matrix or root / "matrix.yaml"
    matrix, _ = load_for(args, root)
    spec = matrix.platforms.get(args.platform)  # type: ignore[call-overload]
    if spec is None:
        raise UsageError(
            f"{matrix_path} defines no platform {args.platform!r} (it defines"
            f" {', '.join(matrix.platforms) or 'none'}). Add it under platforms, or pick one"
            " of those."
        )
    return from_wheels(spec, args.platform) if args.from_wheels else spec


def staged_overlay(args: Args, spec: PlatformSpec, root: Path) -> overlay_image.Staged | None:
    """The overlay the image is built with, its inputs read and checked on the host."""
    try:
        wanted = overlay_mod.requested(args.platform, spec.vllm, args.vllm_source, args.vllm_patch)
        if wanted.kind != "overlay":
            return None
        here = (
            Path.cwd()
            if (args.vllm_source or args.vllm_patch)
            else ((args.matrix or root / "matrix.yaml").resolve().parent)
        )
        version = str(wanted.installed.version or "")
        return overlay_image.staged_inputs(wanted, relative_to=here, base_version=version)
    except overlay_mod.OverlayError as exc:
        raise UsageError(str(exc)) from None


# The image's Python runs on Linux whatever the host is: its pins are read as they hold there.
IMAGE_MARKERS = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}


def image_pins(
    platform: str,
    spec: PlatformSpec,
    root: Path,
    env: Mapping[str, str],
    settings: es.EngineSettings = es.NO_SETTINGS,
    get: index.Get | None = None,
) -> ImagePins:
    """The platform's pin_overrides whose exact pin the release declares, read as the host's
    install reads them, so an override written for one release never reaches another's.

    Where the pins cannot be read (no index, UV_OFFLINE) the image takes every override,
    each stamped as not checked: without them the matrix's own release stops in uv's
    resolver, which a build, unlike a host's install, cannot run twice to get past."""
    src = spec.vllm.installed
    if not spec.pin_overrides or src.kind == "image":
        return ImagePins()
    where = f"platforms.{platform}.pin_overrides"
    release = install.release_of(src)
    if release is None:
        return ImagePins(
            lines=(f"a vLLM built from git: its pins are left to uv ({where} not applied)",)
        )
    if release.wheel:
        release = install.Release(release.package, release.version, str(root / release.wheel))
    try:
        declared = _declared(release, env, settings, get or index.http_get)
    except index.Unreachable as exc:
        return _unchecked(spec.pin_overrides, platform, str(release), str(exc))
    applied = pins.from_matrix(spec.pin_overrides, declared, platform, str(release))
    return ImagePins(tuple(applied), tuple(_taken(o) for o in applied))


def _declared(
    release: install.Release, env: Mapping[str, str], settings: es.EngineSettings, get: index.Get
) -> list[pins.Pin]:
    """The release's exact pins, from any index the host or the build knows of: the
    metadata is the release's wherever it is served."""
    if index.offline(env) and not release.wheel:
        raise index.Unreachable("uv is offline (UV_OFFLINE), so kvrig reads no index either")
    extra = (*index.extra_indexes(env), *settings.extra_index_urls)
    sources = pin_check.Sources(index.default_index(env), tuple(extra))
    return pin_check.release_pins(release, sources, get, IMAGE_MARKERS)


def _unchecked(mapping: Mapping[str, str], platform: str, release: str, why: str) -> ImagePins:
    """Every pin override of the platform, each saying its pin was not checked; one line."""
    applied: list[pins.Override] = []
    for old, new in mapping.items():
        was = pins.parse_pin(old)
        for o in pins.from_matrix({old: new}, [was] if was else [], platform, release):
            unread = f"{was}, if {release} pins it (its pins were not read)"
            applied.append(dataclasses.replace(o, replaces=unread))
    written = ", ".join(f"{old} -> {new}" for old, new in mapping.items())
    line = (
        f"could not read {release}'s pins ({why}); the image takes platforms.{platform}"
        f".pin_overrides as written ({written}), and its stamp says the environment is not"
        " the release's own"
    )
    return ImagePins(tuple(applied), (line,))


def _taken(o: pins.Override) -> str:
    return (
        f"{o.replaces}; {o.source} takes {o.requirement} instead: the image's environment"
        " is not the release's own"
    )


def cache_dir(env: dict[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvrig"
