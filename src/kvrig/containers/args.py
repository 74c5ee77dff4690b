"""The command line of `kvrig container`, read into Args.

    kvrig container {cpu,cuda,xpu,rocm} [--dry-run] [--engine auto|docker|podman]
        [--matrix PATH] [--results DIR] [--podman-compat] [--isa CLASS] [--cold] [--rerun]
        [--shard I/N] [--vllm-source PATH | --vllm-patch FILE] [--from-wheels]
        [--registry REG] [--push] [--build-only] [-- pytest args...]

Unknown arguments (e.g. `-k qwen3_next`) and everything after `--` go to the column's
pytest. A bad command line is refused here, in this command's own terms, before anything
is read from the checkout.

    KVRIG_ENGINE=docker|podman: the engine, as --engine.
    KVRIG_REGISTRY=REG: the registry images are pulled from and pushed to, as --registry.
    KVRIG_HOST_SETTINGS=auto|on|off: the restricted-host settings, as --host-settings
        (decided by kvrig.containers.settings); KVRIG_PODMAN_COMPAT=1 as --podman-compat.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvrig.containers import settings as es
from kvrig.containers.plan import UsageError
from kvrig.define import column_options, gpus
from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import isa


@dataclass(frozen=True)
class Args:
    """The command line, read: what the host does itself (engine, results, overlay, image
    source) apart from what it hands the `kvrig column` inside."""

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
    # The CUDA or ROCm GPU's architecture (--gpu-arch, or the host's GPU's): it names the
    # column (cuda-sm90, rocm-gfx942).
    gpu_arch: str | None = None
    # The GPU the column emulates in the image (--emulate): no device is passed in.
    emulate: str | None = None
    registry: str | None = None  # --registry / KVRIG_REGISTRY
    push: bool = False
    build_only: bool = False
    from_wheels: bool = False  # the release's wheels, not its prebuilt vLLM image
    vllm: str | None = None  # --vllm: a release named instead of the matrix's pin


def with_gpu_arch(args: Args, arch: str) -> Args:
    """The CUDA column named for the host GPU's architecture, and the `kvrig column` inside
    told it, so a container that sees another GPU is refused there too."""
    handed = list(args.column_args)
    if "--gpu-arch" not in handed:
        handed += ["--gpu-arch", arch]
    return replace(args, gpu_arch=arch, column_args=tuple(handed))


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


def parse_args(argv: Sequence[str], env: dict[str, str] | None = None) -> Args:
    """This command's options, with unknown ones and everything after `--` kept for pytest."""
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
    if ns.platform == "rocm" and ns.from_wheels:
        raise UsageError(
            "--from-wheels installs the release from the package index, which serves only"
            " CUDA's build of vLLM: the ROCm column runs in vLLM's own ROCm image of the"
            " release (platforms.rocm.vllm). Drop --from-wheels; where no registry serves"
            " that image, copy it from a host that can pull it (`docker save`, `docker load`)."
        )
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
    """--gpu-arch names a real CUDA or ROCm GPU, so it is refused here, in this command's own
    terms, beside a CPU class, an emulated device or a platform without architectures."""
    if not gpu_arch:
        return
    if platform not in gpus.BY_ARCH:
        raise UsageError(
            f"--gpu-arch {gpu_arch} names the architecture of the CUDA or ROCm GPU a column"
            f" runs on, and the {platform} column has none: leave it out, or run the column"
            f" of that GPU (`kvrig container {gpus.arch_platform(gpu_arch)} --gpu-arch"
            f" {gpu_arch}`)."
        )
    if emulate or cls != isa.NATIVE:
        given = f"--emulate {emulate}" if emulate else f"--isa {cls}"
        raise UsageError(
            f"--gpu-arch {gpu_arch} names the real GPU the {gpus.TITLES[platform]} column runs"
            f" on, and {given} names something else to run (an emulated device's architecture"
            " is --emulate's; a CPU class is the cpu column's): give one of them."
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
