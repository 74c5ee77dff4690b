"""A column in its container, as commands: image tag, build, run, and the dry run's lines.

Decided, not read: every function works on what it is given, so what `--dry-run` prints is
what runs and unit tests check the commands without an engine (the one look at the host is
build_args' wheel folder, for torchvision's CPU build).

The image tag is a hash of everything the image is built from and nothing host-specific,
so an image is built only when an input changed, the CPU runner that builds it and the GPU
runner that pulls it name the same one, and a record's tag names exactly what ran.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvrig.containers import settings as es
from kvrig.define import releases
from kvrig.define.platform_spec import PlatformSpec, VllmSource
from kvrig.provision import install, overlay_image, stamp
from kvrig.provision.pins import Override

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
# What an image's stamp says installed its vLLM (kvrig.provision.stamp; the tag says the rest).
IMAGE_ASKED = "kvrig container {platform}"


class UsageError(Exception):
    """A bad command line or matrix; the message is one paragraph."""


# --- the host and the plan -------------------------------------------------------------


@dataclass(frozen=True)
class ImagePins:
    """The pin overrides the image's vLLM install takes (kvrig.containers.facts.image_pins),
    with the lines that say so in the dry run and before a build."""

    applied: tuple[Override, ...] = ()
    lines: tuple[str, ...] = ()


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
    # The matrix's pin overrides the build takes (PIN_OVERRIDES), decided once per run.
    pins: ImagePins = ImagePins()


# --- image tag ---------------------------------------------------------------------------


def rig_version(pyproject_text: str) -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject_text, re.MULTILINE)
    return match.group(1) if match else "0"


def image_tag(
    platform: str,
    dockerfile: bytes,
    version: str,
    rig_digest: str,
    build_args: dict[str, str],
    registry: str | None = None,
) -> str:
    """[REG/]kvrig-<platform>:<version>-<hash>, the hash over every input of the build.

    The build args are hashed too, so a new vLLM or base image gives a new tag even when no
    file of the checkout changed.
    """
    h = hashlib.sha256()
    h.update(dockerfile)
    h.update(b"\0" + version.encode() + b"\0" + rig_digest.encode() + b"\0")
    h.update(json.dumps(build_args, sort_keys=True).encode())
    repo = IMAGE_REPO.format(platform=platform)
    prefix = f"{registry}/" if registry else ""
    return f"{prefix}{repo}:{version}-{h.hexdigest()[:12]}"


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


def from_wheels(spec: PlatformSpec, platform: str) -> PlatformSpec:
    """The platform with its release's wheel installed on its base_image instead of the
    release's image, for hosts no registry serves vLLM's image to."""
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


def _install_record(
    platform: str, src: VllmSource, pinned: Sequence[Override], excluded: Sequence[str]
) -> dict[str, str]:
    """PIN_OVERRIDES for uv's install in the image and the VLLM_STAMP it leaves, planned here
    because the host knows why each override is taken and the image only what landed."""
    if src.kind == "image":
        return {}
    asked = IMAGE_ASKED.format(platform=platform)
    planned = stamp.planned(install.release_of(src), pinned, excluded, asked)
    args = {"VLLM_STAMP": json.dumps(planned, sort_keys=True, separators=(",", ":"))}
    if pinned:
        args["PIN_OVERRIDES"] = " ".join(o.requirement for o in pinned)
    return args


def build_args(
    platform: str,
    spec: PlatformSpec,
    base_override: str | None = None,
    settings: es.EngineSettings = es.NO_SETTINGS,
    pinned: Sequence[Override] = (),
) -> dict[str, str]:
    """The Dockerfile's build arguments for a platform of matrix.yaml; `pinned`, the
    matrix's pin overrides its release calls for (kvrig.containers.facts.image_pins)."""
    src = spec.vllm.installed  # an overlay's base; the overlay itself is built on top
    args = {"BASE_IMAGE": base_override or spec.base_image, **_source_args(src)}
    # A prebuilt vLLM image brings its own torch: the index would key nothing it installs.
    args["TORCH_INDEX"] = (spec.torch_index or "") if src.kind != "image" else ""
    extra = [*spec.extra_packages]
    excluded: tuple[str, ...] = ()
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
        excluded = install.cpu_excluded(torchvision)
        args["EXCLUDED_PACKAGES"] = " ".join(excluded)
        extra = [torchvision, *extra] if torchvision else extra
    if platform == "cuda" and src.kind != "image":
        # The pins that keep the CUDA wheel's resolution importable, as on the host.
        extra = [*install.CUDA_PINS, *extra]
    if extra:
        args["EXTRA_PACKAGES"] = " ".join(extra)
    args.update(_install_record(platform, src, pinned, excluded))
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
    """Who the column runs as, so that the bind-mounted results are writable and belong to
    the host's user; a root host (many CI runners) gets the image's unprivileged user, never
    root, and hands it the results folder first."""
    if engine == "podman" and host.rootless_podman:
        return ["--userns=keep-id", "--user", f"{host.uid}:{host.gid}"]
    if host.uid != 0:
        return ["--user", f"{host.uid}:{host.gid}"]
    return ["--user", f"{IMAGE_UID}:{IMAGE_UID}"]


def device_args(platform: str, engine: str, host: Host) -> list[str]:
    if platform == "cuda":
        # Docker's --gpus needs the NVIDIA Container Toolkit; Podman reaches GPUs via CDI.
        return ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    if platform in ("xpu", "rocm"):
        # ROCm's compute goes through /dev/kfd beside the render node; AMD's documented
        # container command also lifts seccomp's filter, which blocks the memory-policy
        # calls (get_mempolicy, mbind) the HIP runtime makes.
        args = ["--device", "/dev/dri"]
        if platform == "rocm":
            args = ["--device", "/dev/kfd", *args, "--security-opt", "seccomp=unconfined"]
        if engine == "podman" and host.rootless_podman:
            # A rootless container's user namespace maps no host group by number: keep
            # the user's own (render, video among them), as crun and runc allow with
            # keep-groups.
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
    """The device passed into a small container as the column's will get it: a missing
    toolkit, CDI spec or render group fails in seconds, not after an image build."""
    if platform not in ("cuda", "xpu", "rocm"):
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
    if platform == "rocm":
        # rocminfo opens /dev/kfd and lists the GPU's agent: what the HIP runtime needs.
        return [*cmd, "--entrypoint", "rocminfo", image]
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


# --- dry run -----------------------------------------------------------------------------


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
    `passage` comes between the pull and the build, as in a run."""
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
    lines += [f"# {line}" for line in plan.pins.lines]
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.build_env.items())
    lines.append(f"{prefix} {q(plan.build)}".strip())
    if plan.push:
        lines.append(q(plan.push))
    return lines
