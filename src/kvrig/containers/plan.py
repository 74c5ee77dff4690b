"""A column in its container, as commands: image tag, build, run, and the dry run's lines.

    kvrig container {cpu,cuda,xpu} [--dry-run] [--engine auto|docker|podman]
        [--matrix PATH] [--results DIR] [--podman-compat] [--isa CLASS] [--cold] [--rerun]
        [--shard I/N] [--vllm-source PATH | --vllm-patch FILE] [--from-wheels]
        [--registry REG] [--push] [--build-only] [-- pytest args...]

The column's own options are kvrig column's (kvrig.define.column_options): --results and
an overlay's are the host's side, the others are handed to the `kvrig column` inside.
Arguments it does not know (e.g. `-k qwen3_next`) go to the column's pytest, as does
everything after `--`.

Images are built once and shared through a registry (--registry REG, or KVRIG_REGISTRY):
the image is then REG/kvrig-<platform>:<tag>, pulled when it is not here and built only
when the pull fails; --push pushes it, and --build-only (a CPU runner's job in CI) builds
and pushes it and runs no column, so it needs no device. The tag keys what the image
installs, so the host that builds it and the GPU host that pulls it compute the same one.

A platform whose vLLM is a release's image (vllm/vllm-openai:v0.33.0) gets that image
with the rig layered on; --from-wheels builds the same release from the package index on
the platform's base_image instead (where no registry serves vLLM's image).

An overlay (--vllm-source, --vllm-patch, or matrix.yaml's kind: overlay) is checked on
the host, its inputs staged in docker/overlay/ and built into the image over the image's
own vLLM (kvrig.provision.overlay); their digest is part of the image's tag.

The commands are built by pure functions from matrix.yaml and the host's facts, so what
`--dry-run` prints is what runs, and unit tests check them without an engine. The image
tag is a hash of everything the image is built from, so an image is built only when one
of its inputs changed and a record's image tag names exactly what ran.

Settings for restricted hosts (sandboxed VMs: no CAP_SYS_RESOURCE, a hybrid cgroup layout,
a TLS-intercepting proxy, no image registry) are decided per host by kvrig.containers.settings
and printed one line each; `--host-settings on|off` (KVRIG_HOST_SETTINGS) forces them.
    KVRIG_ENGINE=docker|podman: the engine, as --engine.
    KVRIG_BASE_IMAGE=IMAGE: build on IMAGE instead of the platform's base_image. When the
        base cannot be pulled and a local Debian image can stand in for it, that image is
        built with debootstrap (kvrig.containers.base_image) and used, with a line saying so.
    KVRIG_CACHE_FROM=REF: an image to take BuildKit layer cache from (a CI registry).
    KVRIG_REGISTRY=REG: the registry images are pulled from and pushed to, as --registry.
"""

from __future__ import annotations

import argparse
import grp
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvrig.containers import settings as es
from kvrig.define import column_choice, column_options, named_release, releases
from kvrig.define.matrix import PLATFORMS, Matrix, MatrixError, PlatformSpec, VllmSource
from kvrig.define.matrix import load as load_matrix
from kvrig.define.paths import results_folder
from kvrig.host import isa
from kvrig.provision import install, overlay_image
from kvrig.provision import overlay as overlay_mod

IMAGE_REPO = "kvrig-{platform}"
CONTAINER_RESULTS = "/results"
CONTAINER_MATRIX = "/opt/kvrig/matrix.yaml"
# The image's own unprivileged user (docker/Dockerfile.*: ARG KVRIG_UID).
IMAGE_UID = 10001
SHM_SIZE = "8g"
# Where an overlay's inputs are staged in the build context (docker/Dockerfile.*: COPY).
OVERLAY_STAGE = Path("docker") / "overlay"
# Where a host's wheel folder is mounted during the build.
BUILD_WHEELS = "/opt/kvrig-wheels"
# What the images install besides vLLM (docker/Dockerfile.*: COPY): kvrig's dependencies
# and code. Not its README or matrix.yaml: the matrix is mounted when the column runs, so
# a typo fixed there rebuilds no image.
RIG_INPUTS = ("pyproject.toml", "src")


class UsageError(Exception):
    """A bad command line or matrix; the message is one paragraph."""


# --- facts and settings ------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """What the run command depends on about the host."""

    uid: int
    gid: int
    render_gids: tuple[int, ...] = ()
    rootless_podman: bool = False


@dataclass(frozen=True)
class Plan:
    """Everything one column needs, as argv lists; printing it is the dry run."""

    platform: str
    engine: str
    image: str
    container: str
    results: Path
    build: list[str]
    build_env: dict[str, str]
    run: list[str]
    remove: list[str]
    digest: list[str]
    base_image: str
    global_flags: list[str] = field(default_factory=list)
    settings: es.EngineSettings = es.NO_SETTINGS
    wheel: str | None = None
    results_owner: int | None = None
    overlay: overlay_image.Staged | None = None
    stage: Path | None = None  # the build context's overlay folder, filled before a build
    # The device passed into a small container before any build (None: no device).
    passthrough: list[str] | None = None
    # With a registry: the image is pulled before it is built, and pushed with --push.
    registry: str | None = None
    pull: list[str] = field(default_factory=list)
    push: list[str] = field(default_factory=list)
    build_only: bool = False  # the image, then no column
    # The prebuilt vLLM image the build starts from (a source of kind image), if any.
    vllm_image: str | None = None


# --- image tag ---------------------------------------------------------------------------


def rig_version(pyproject_text: str) -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject_text, re.MULTILINE)
    return match.group(1) if match else "0"


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


def image_tag(
    platform: str,
    dockerfile: bytes,
    version: str,
    rig_digest: str,
    build_args: dict[str, str],
    registry: str | None = None,
) -> str:
    """[REG/]kvrig-<platform>:<version>-<hash>, the hash over every input of the build.

    The build args carry the vLLM source (kind, version, image, wheel, git ref) and the base
    image, so a new vLLM gives a new tag even when no file of the checkout changed; nothing
    host-specific is in it, so a CPU runner that builds and a GPU runner that pulls name
    the same image.
    """
    h = hashlib.sha256()
    h.update(dockerfile)
    h.update(b"\0" + version.encode() + b"\0" + rig_digest.encode() + b"\0")
    h.update(json.dumps(build_args, sort_keys=True).encode())
    repo = IMAGE_REPO.format(platform=platform)
    prefix = f"{registry}/" if registry else ""
    return f"{prefix}{repo}:{version}-{h.hexdigest()[:12]}"


def registry_name(text: str) -> str:
    """A registry and namespace as an image name's prefix (ghcr.io/owner), lower-cased:
    image names must be, and GitHub's owner names need not be."""
    name = text.strip().rstrip("/").lower()
    parts = name.split("/")
    # A colon in a later part is an image's tag; in the only part, a host's port.
    tagged = len(parts) > 1 and ":" in parts[-1]
    if not name or "://" in name or any(ch.isspace() for ch in name) or tagged:
        raise UsageError(
            f"--registry {text!r} is not a registry: give its host and namespace, without a"
            " scheme or an image tag (for example --registry ghcr.io/my-org, or"
            " KVRIG_REGISTRY=registry.example.com:5000/ci); the image is then"
            " <registry>/kvrig-<platform>:<tag>."
        )
    return name


def pull_failed_line(image: str, registry: str, engine: str, output: str) -> str:
    """One line: the pull failed, so the image is built here; what would have let it pull."""
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
    host = registry.split("/")[0]
    return (
        f"kvrig.containers: {image} could not be pulled ({last or 'no output'}); building it"
        f" here (if it was pushed, log in first: `{engine} login {host}`)"
    )


def push_failure(image: str, registry: str, engine: str, code: int, output: str) -> str:
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
    host = registry.split("/")[0]
    return (
        f"Pushing {image} failed (exit {code}: {last or 'no output'}), so the image is here"
        f" but no other host can pull it. Log in to the registry first (`{engine} login"
        f" {host}`; in GitHub Actions with the job's GITHUB_TOKEN and `permissions:"
        " packages: write`), check that the registry's namespace is one you may push to, or"
        " run without --push."
    )


# --- build ---------------------------------------------------------------------------------


def _source_args(src: VllmSource) -> dict[str, str]:
    """Where the image's vLLM comes from, as the Dockerfile's VLLM_* arguments."""
    args = {"VLLM_SOURCE": src.kind}
    if src.kind == "pypi":
        args.update(VLLM_PACKAGE=str(src.package), VLLM_VERSION=str(src.version))
    elif src.kind == "image":
        # A prebuilt vLLM image is the base; the Dockerfile only adds the rig to it, and
        # checks that its vLLM is the release the tag names (the rules judging the column).
        args["BASE_IMAGE"] = str(src.image)
        # (empty: the tag names no release, and nothing is checked).
        args["VLLM_VERSION"] = releases.source_version(src) or ""
    elif src.kind == "wheel":
        wheel = Path(str(src.wheel))
        args.update(VLLM_WHEEL=wheel.name, VLLM_WHEEL_DIR=str(wheel.parent))
    elif src.kind == "git":
        args.update(VLLM_GIT_URL=str(src.git_url), VLLM_GIT_REF=str(src.git_ref))
    return args


def build_args(
    platform: str,
    spec: PlatformSpec,
    base_override: str | None = None,
    settings: es.EngineSettings = es.NO_SETTINGS,
) -> dict[str, str]:
    """The Dockerfile's build arguments for a platform of matrix.yaml."""
    src = spec.vllm.installed  # an overlay's base; the overlay itself is built on top
    args = {"BASE_IMAGE": base_override or spec.base_image, **_source_args(src)}
    # A prebuilt vLLM image brings its own torch: the index would key nothing it installs.
    args["TORCH_INDEX"] = (spec.torch_index or "") if src.kind != "image" else ""
    extra = [*spec.extra_packages]
    if platform == "cpu":
        # PyPI's CUDA builds kept out of a CPU vLLM, torchvision's CPU build taken where
        # the build can have it, as on the host (kvrig.provision.install).
        torchvision = (
            install.cpu_torchvision(
                spec.torch_version,
                settings.find_links,
                None if settings.find_links else spec.torch_index,
            )
            if src.kind != "image"
            else None
        )
        args["EXCLUDED_PACKAGES"] = " ".join(install.cpu_excluded(torchvision))
        extra = [torchvision, *extra] if torchvision else extra
    if platform == "cuda" and src.kind != "image":
        # The pins that keep the CUDA wheel's resolution importable, as on the host.
        extra = [*install.CUDA_PINS, *extra]
    if extra:
        args["EXTRA_PACKAGES"] = " ".join(extra)
    if settings.ca_bundle:
        args.update(PIP_CERT=settings.ca_bundle, SSL_CERT_FILE=settings.ca_bundle)
    if settings.find_links:
        # The local wheel folder stands in for PyTorch's index, which such hosts cannot
        # reach (the torch pin is resolved from the folder).
        args.update(UV_FIND_LINKS=BUILD_WHEELS, TORCH_INDEX="")
    if settings.extra_index_urls:
        args["UV_EXTRA_INDEX_URL"] = " ".join(settings.extra_index_urls)
    return args


def build_command(
    engine: str,
    root: Path,
    platform: str,
    tag: str,
    args: dict[str, str],
    settings: es.EngineSettings = es.NO_SETTINGS,
    cache_from: str | None = None,
) -> list[str]:
    cmd = [
        engine,
        *es.global_flags(settings),
        "build",
        "--file",
        str(root / "docker" / f"Dockerfile.{platform}"),
        "--tag",
        tag,
        "--tag",
        f"{IMAGE_REPO.format(platform=platform)}:latest",
    ]
    if engine == "docker":
        # Inline cache metadata lets a pushed image seed the next host's build.
        cmd += [
            "--build-arg",
            "BUILDKIT_INLINE_CACHE=1",
            "--cache-from",
            cache_from or f"{IMAGE_REPO.format(platform=platform)}:latest",
        ]
    elif cache_from:
        cmd += ["--cache-from", cache_from]
    else:
        cmd += ["--layers"]
    for key in sorted(args):
        cmd += ["--build-arg", f"{key}={args[key]}"]
    if engine == "podman":
        # `--format docker` keeps the SHELL instruction (the OCI format drops it).
        cmd += ["--format", "docker"]
        if settings.ca_bundle:
            cmd += ["--volume", f"{settings.ca_bundle}:{settings.ca_bundle}:ro"]
        if settings.find_links:
            cmd += ["--volume", f"{settings.find_links}:{BUILD_WHEELS}:ro"]
    if settings.host_network:
        cmd += ["--network=host"]
    cmd.append(str(root))
    return cmd


def build_env(engine: str, settings: es.EngineSettings) -> dict[str, str]:
    """Environment for the build: BuildKit for Docker, the ulimit-free config for Podman."""
    if engine == "docker":
        return {"DOCKER_BUILDKIT": "1"}
    return es.engine_env(settings)


# --- run -------------------------------------------------------------------------------------


def user_args(engine: str, host: Host) -> list[str]:
    """Who the column runs as, so that the bind-mounted results are writable.

    - A rootless Podman user: `--userns=keep-id` maps the host's uid into the container
      unchanged, so files in results/ belong to that user and the container's root is not
      the host's.
    - Any other non-root host user: `--user uid:gid`, so files in results/ belong to the
      user who ran the session and need no chown afterwards. The image's HOME is writable
      by any uid.
    - A host running as root (many CI runners): the image's own unprivileged user, never
      root; the caller hands it the results folder (chown) before the run.
    """
    if engine == "podman" and host.rootless_podman:
        return ["--userns=keep-id", "--user", f"{host.uid}:{host.gid}"]
    if host.uid != 0:
        return ["--user", f"{host.uid}:{host.gid}"]
    return ["--user", f"{IMAGE_UID}:{IMAGE_UID}"]


def device_args(platform: str, engine: str, host: Host) -> list[str]:
    if platform == "cuda":
        # Docker's --gpus needs the NVIDIA Container Toolkit; Podman reaches GPUs via CDI.
        return ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    if platform == "xpu":
        args = ["--device", "/dev/dri"]
        if engine == "podman" and host.rootless_podman:
            # A rootless container's user namespace maps no host group by number: keep
            # the user's own (render among them), as crun and runc allow with keep-groups.
            return [*args, "--group-add", "keep-groups"]
        for gid in host.render_gids:
            args += ["--group-add", str(gid)]
        return args
    return []


# Inside the pass-through container: a render node the column's user may open.
_RENDER_NODE_USABLE = (
    'for n in /dev/dri/renderD*; do [ -r "$n" ] && [ -w "$n" ] && exit 0; done;'
    " ls -ln /dev/dri >&2; echo no render node is readable and writable by uid $(id -u) >&2;"
    " exit 3"
)


def passthrough_command(
    engine: str,
    platform: str,
    image: str,
    host: Host,
    settings: es.EngineSettings = es.NO_SETTINGS,
) -> list[str] | None:
    """The device passed into a container of the base image, as the column's container
    gets it and as its user: a missing toolkit, CDI spec or render group fails here in
    seconds, with its fix named, instead of after an image build."""
    if platform not in ("cuda", "xpu"):
        return None
    cmd = [
        engine,
        *es.global_flags(settings),
        "run",
        "--rm",
        *user_args(engine, host),
        "--network",
        "none",
        *device_args(platform, engine, host),
    ]
    # The command as the entrypoint: a base that is vLLM's own image would otherwise run
    # `vllm serve` with it as arguments.
    if platform == "cuda":
        # The driver's tools are mounted in only for the utility capability.
        caps = ["--env", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
        return [*cmd, *caps, "--entrypoint", "nvidia-smi", image, "-L"]
    return [*cmd, "--entrypoint", "sh", image, "-c", _RENDER_NODE_USABLE]


def run_command(
    engine: str,
    platform: str,
    tag: str,
    name: str,
    results: Path,
    host: Host,
    pytest_args: Sequence[str] = (),
    matrix: Path | None = None,
    settings: es.EngineSettings = es.NO_SETTINGS,
    device: bool = True,
) -> list[str]:
    """The column's container; `device` False for an emulated GPU's column, which needs
    none (and proves the image's software on a host without one)."""
    cmd = [
        engine,
        *es.global_flags(settings),
        "run",
        "--rm",
        "--name",
        name,
        *user_args(engine, host),
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "ALL",
        "--shm-size",
        SHM_SIZE,
        # The column is offline by design; only hosts whose engine cannot do without it
        # get the host network.
        "--network",
        "host" if settings.host_network else "none",
        *(device_args(platform, engine, host) if device else []),
        "--volume",
        f"{results}:{CONTAINER_RESULTS}",
    ]
    if matrix is not None:
        cmd += ["--volume", f"{matrix}:{CONTAINER_MATRIX}:ro"]
    # Offline by design: every cell's own environment says so (kvrig.define.cells).
    for key, value in {"KVRIG_PLATFORM": platform, "KVRIG_IMAGE": tag}.items():
        cmd += ["--env", f"{key}={value}"]
    # Passed by name: the caller exports the digest it read from the engine.
    cmd += ["--env", "KVRIG_IMAGE_DIGEST"]
    cmd += [tag, "kvrig", "column", "--platform", platform, "--results", CONTAINER_RESULTS]
    cmd += list(pytest_args)
    return cmd


def results_owner(engine: str, host: Host) -> int | None:
    """The uid the results folder must belong to before the run, when the host's won't do."""
    if user_args(engine, host)[-1] == f"{IMAGE_UID}:{IMAGE_UID}":
        return IMAGE_UID
    return None


def remove_command(engine: str, name: str, flags: Sequence[str] = ()) -> list[str]:
    return [engine, *flags, "rm", "--force", name]


def digest_command(engine: str, tag: str, flags: Sequence[str] = ()) -> list[str]:
    return [engine, *flags, "image", "inspect", "--format", "{{.Id}}", tag]


# --- command line --------------------------------------------------------------------------


@dataclass(frozen=True)
class Args:
    platform: str
    dry_run: bool
    engine: str
    matrix: Path | None
    results: Path | None
    host_settings: str | None
    pytest_args: list[str]
    vllm_source: str | None = None
    vllm_patch: str | None = None
    # The column's options the `kvrig column` in the container is given, as its command line.
    column_args: tuple[str, ...] = ()
    cpu_class: str = isa.NATIVE  # --isa
    # The CUDA GPU's architecture (--gpu-arch, or the host's GPU's): it names the column.
    gpu_arch: str | None = None
    # The GPU the column emulates in the image (--emulate): no device is passed in.
    emulate: str | None = None
    registry: str | None = None  # --registry / KVRIG_REGISTRY
    push: bool = False
    build_only: bool = False
    from_wheels: bool = False  # the release's wheels, not its prebuilt vLLM image
    vllm: str | None = None  # --vllm: a release named instead of the matrix's pin


def with_gpu_arch(args: Args, arch: str) -> Args:
    """The CUDA column on the host's GPU: named for its architecture on the host, and the
    `kvrig column` in the container told it, so that a container seeing another GPU is
    refused there too."""
    handed = list(args.column_args)
    if "--gpu-arch" not in handed:
        handed += ["--gpu-arch", arch]
    return replace(args, gpu_arch=arch, column_args=tuple(handed))


def parse_args(argv: Sequence[str], env: dict[str, str] | None = None) -> Args:
    """Our options, with unknown ones and everything after `--` kept for pytest."""
    env = dict(os.environ) if env is None else env
    argv = list(argv)
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="kvrig container",
        allow_abbrev=False,
        description="Build a platform's image and run its column of the matrix inside it.",
        epilog="Other arguments, and all after `--`, are passed to the column's pytest.",
    )
    parser.add_argument("platform", choices=PLATFORMS)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the build and run commands and exit"
    )
    engine = env.get("KVRIG_ENGINE") or "auto"
    if engine not in ENGINES:
        raise UsageError(
            f"KVRIG_ENGINE={engine!r} is not one of {', '.join(ENGINES)}. Unset it to take"
            " Docker when its daemon answers, else Podman."
        )
    parser.add_argument("--engine", choices=ENGINES, default=engine, help="also KVRIG_ENGINE")
    parser.add_argument("--matrix", type=Path, help="matrix file (default: the checkout's)")
    parser.add_argument(
        "--host-settings",
        choices=es.MODES,
        help="restricted-host engine settings: auto (default), on or off (KVRIG_HOST_SETTINGS)",
    )
    parser.add_argument(
        "--podman-compat",
        dest="host_settings",
        action="store_const",
        const="on",
        help="same as --host-settings on (also KVRIG_PODMAN_COMPAT=1)",
    )
    _declare_image_options(parser, env)
    column_options.declare(parser.add_argument, column_options.CONTAINER)
    ns, unknown = parser.parse_known_args(argv)
    _check_gpu_arch(ns.platform, ns.gpu_arch, ns.emulate, ns.isa)
    registry = registry_name(ns.registry) if ns.registry else None
    if ns.push and registry is None:
        raise UsageError(
            "--push pushes the image to a registry, and none is named. Pass --registry REG"
            " (for example --registry ghcr.io/my-org) or set KVRIG_REGISTRY, and log in to it"
            " first (`docker login ghcr.io`)."
        )
    handed_on = {
        o.dest: getattr(ns, o.dest)
        for o in column_options.options(column_options.CONTAINER)
        if o.dest not in _HOST_SIDE
    }
    return Args(
        ns.platform,
        ns.dry_run,
        ns.engine,
        ns.matrix,
        Path(ns.results) if ns.results else None,
        ns.host_settings,
        [*unknown, *tail],
        ns.vllm_source,
        ns.vllm_patch,
        tuple(column_options.command_line(handed_on, column_options.CLI)),
        ns.isa,
        ns.gpu_arch,
        ns.emulate,
        registry,
        ns.push,
        ns.build_only,
        ns.from_wheels,
        vllm=ns.vllm,
    )


def _check_gpu_arch(platform: str, gpu_arch: str | None, emulate: str | None, cls: str) -> None:
    """--gpu-arch names the real CUDA GPU the column runs on: refused here, in this
    command's own terms (the platform is its first argument), beside a CPU class or an
    emulated device, and off CUDA."""
    if not gpu_arch:
        return
    if platform != "cuda":
        raise UsageError(
            f"--gpu-arch {gpu_arch} names the architecture of the CUDA GPU a column runs on,"
            f" and the {platform} column has none: leave it out, or run the CUDA column"
            f" (`kvrig container cuda --gpu-arch {gpu_arch}`)."
        )
    if emulate or cls != isa.NATIVE:
        given = f"--emulate {emulate}" if emulate else f"--isa {cls}"
        raise UsageError(
            f"--gpu-arch {gpu_arch} names the real GPU the CUDA column runs on, and {given}"
            " names something else to run (an emulated device's architecture is --emulate's;"
            " a CPU class is the cpu column's): give one of them."
        )


def _declare_image_options(parser: argparse.ArgumentParser, env: dict[str, str]) -> None:
    """Where the image comes from: a registry shared by the hosts, or the release's wheels."""
    parser.add_argument(
        "--registry",
        default=env.get("KVRIG_REGISTRY") or None,
        metavar="REG",
        help="pull REG/kvrig-<platform>:<tag> when absent, build only when that fails"
        " (also KVRIG_REGISTRY)",
    )
    parser.add_argument(
        "--push", action="store_true", help="push the image to the registry (built or found)"
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build (and with --push push) the image, run no column: no device needed",
    )
    parser.add_argument(
        "--from-wheels",
        action="store_true",
        help="build the platform's vLLM release from the package index on its base_image,"
        " not on the release's vLLM image (where no registry serves it)",
    )


# The column's options the host reads itself: the results folder it mounts, the overlay
# it builds into the image.
_HOST_SIDE = ("results", "vllm_source", "vllm_patch")
ENGINES = ("auto", "docker", "podman")


def requested_engine(args: Args, env: dict[str, str]) -> str:
    """Forcing the restricted-host settings on means Podman: they are Podman's settings."""
    forced = args.host_settings == "on" or (
        args.host_settings is None and env.get("KVRIG_PODMAN_COMPAT", "") not in ("", "0")
    )
    return "podman" if forced and args.engine == "auto" else args.engine


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


def render_gids(dri: Path = Path("/dev/dri")) -> tuple[int, ...]:
    """The groups owning the GPU nodes (render, sometimes video): what --group-add needs."""
    gids = (
        {p.stat().st_gid for p in sorted(dri.glob("*")) if not p.is_dir()}
        if dri.is_dir()
        else set()
    )
    if not gids:
        try:
            gids = {grp.getgrnam("render").gr_gid}
        except KeyError:
            gids = set()
    return tuple(sorted(g for g in gids if g != 0))


def load_for(args: Args, root: Path) -> tuple[Matrix, named_release.NamedRelease | None]:
    """The matrix the column runs on (a release named with --vllm in place of the pin),
    and that release when it is not the pin."""
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


def from_wheels(spec: PlatformSpec, platform: str) -> PlatformSpec:
    """The platform with its vLLM installed from the index on its base_image: a release's
    image gives way to that release's wheel (kvrig.define.matrix.VllmSource.wheels)."""
    if spec.vllm.kind != "image":
        return spec  # already installed from the index, a wheel or a git ref
    wheels = spec.vllm.wheels
    if wheels is None:
        raise UsageError(
            f"--from-wheels installs the release {platform}'s vLLM image is of, and the image"
            f" {spec.vllm.image} names none in its tag. Give it"
            f" (platforms.{platform}.vllm.version), or drop --from-wheels."
        )
    return spec.model_copy(update={"vllm": wheels})


def cache_dir(env: dict[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvrig"


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
) -> Plan:
    """The whole column as commands; reads the checkout's files but changes nothing.

    `staged`: the overlay's inputs an earlier plan of the same run read already (a
    checkout's are every file of its package, hashed), so a plan made again for another
    base image or network setting does not read them again."""
    spec = load_spec(args, root)
    if settings is None:
        settings = es.decide(engine, es.HostFacts(), env, cache_dir(env), args.host_settings)
    bargs = build_args(
        args.platform, spec, base_override or env.get("KVRIG_BASE_IMAGE") or None, settings
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
    )


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


def dry_run_lines(plan: Plan) -> list[str]:
    """The commands, shell-quoted, one per line, in the order a real run uses them."""
    q = shlex.join
    lines = [f"# {reason}" for reason in plan.settings.reasons]
    conf = plan.settings.containers_conf
    if conf is not None:
        conf_lines = " ".join(shlex.quote(ln) for ln in es.CONTAINERS_CONF_TEXT.splitlines())
        lines.append(
            f"mkdir -p {shlex.quote(str(conf.parent))} &&"
            f" printf '%s\\n' {conf_lines} > {shlex.quote(str(conf))}"
        )
    env_prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in es.engine_env(plan.settings).items())
    passage = []
    if plan.passthrough is not None:
        on = "the pulled image (the base image when the pull fails)" if plan.pull else "the base"
        passage = [
            f"# the device passed into a container of {on}, before any build:",
            env_prefix + q(passage_on(plan, plan.image if plan.pull else plan.base_image)),
        ]
    lines += image_lines(plan, passage)
    if plan.build_only:
        lines.append("# --build-only: no column is run")
        return lines
    lines.append(f"mkdir -p {shlex.quote(str(plan.results))}")
    if plan.results_owner is not None:
        owner = f"{plan.results_owner}:{plan.results_owner}"
        lines.append(f"chown {owner} {shlex.quote(str(plan.results))}")
    lines.append(f'export KVRIG_IMAGE_DIGEST="$({q(plan.digest)})"')
    lines.append(env_prefix + q(plan.run))
    return lines


def passage_on(plan: Plan, image: str) -> list[str]:
    """The plan's pass-through check run on `image`: the base image, or the image a
    registry gave in its place."""
    assert plan.passthrough is not None
    return [image if a == plan.base_image else a for a in plan.passthrough]


def image_lines(plan: Plan, passage: Sequence[str] = ()) -> list[str]:
    """The image's commands: pulled from the registry, else built; pushed with --push.
    `passage`, the device's check, comes between the pull and the build, as in a run."""
    q = shlex.join
    lines = []
    if plan.pull:
        lines.append(f"# pulled when {plan.image} is absent here:")
        lines.append(q(plan.pull))
        lines += passage
        lines.append("# built only when the pull fails:")
    else:
        lines += passage
        lines.append(f"# built only when {plan.image} is absent:")
    if plan.overlay is not None:
        lines.append(f"# with {plan.overlay.describe()}, staged in {plan.stage}")
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.build_env.items())
    lines.append(f"{prefix} {q(plan.build)}".strip())
    if plan.push:
        lines.append(q(plan.push))
    return lines


def host_facts(engine: str) -> Host:
    uid, gid = os.getuid(), os.getgid()
    return Host(
        uid=uid, gid=gid, render_gids=render_gids(), rootless_podman=engine == "podman" and uid != 0
    )
