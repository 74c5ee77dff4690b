"""A vLLM release named on the command line (`--vllm 0.33.0`, `--vllm ./vllm-...whl`), put
in place of what matrix.yaml pins, without copying the matrix.

A release gate asked on the day a release ships, and a release diff, both need a column
that follows the named release while every case and expectation stays the matrix's. The
pins are replaced in memory and checked as the loader checks a pin: a release between two
that a rule was seen in is refused, a newer one than any read is run and said to be so.

Pure: a string and a matrix in, a matrix (or one paragraph) out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvrig.define import gpus, releases
from kvrig.define.platform_spec import VllmSource
from kvrig.define.schema import Matrix, MatrixError

# A wheel's file name: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl (PEP 427).
_WHEEL = re.compile(r"(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+")


@dataclass(frozen=True)
class NamedRelease:
    """A release named by its version, or by a wheel file (a nightly's, a local build's)."""

    version: str
    wheel: str | None = None

    @property
    def slug(self) -> str:
        """What the results folder of a column of it carries: `vllm-0.33.0`."""
        cleaned = re.sub(r"[^A-Za-z0-9_.]+", "_", self.version)
        return f"vllm-{cleaned}"

    def describe(self) -> str:
        return f"wheel {self.wheel}" if self.wheel else self.version


def parse(text: str) -> NamedRelease:
    """`0.33.0`, `v0.33.0`, or a path to a vLLM wheel file; one paragraph otherwise."""
    given = text.strip()
    if given.endswith(".whl"):
        return _wheel(given)
    try:
        releases.parse(given)
    except releases.VersionError:
        raise MatrixError(
            f"--vllm {text!r} names no vLLM release: give a version as `pip show vllm`"
            " prints it (0.34.0) or a path to a vLLM wheel file (a nightly's, or a local"
            " build's, ending in .whl). Nothing was run."
        ) from None
    return NamedRelease(given.removeprefix("v"))


def _wheel(given: str) -> NamedRelease:
    path = Path(given)
    m = _WHEEL.fullmatch(path.name.removesuffix(".whl"))
    if m is None or not m.group("name").lower().replace("_", "-").startswith("vllm"):
        raise MatrixError(
            f"--vllm {given}: the file name is not a vLLM wheel's (vllm-VERSION-PY-ABI-PLATFORM"
            ".whl, as pip and uv name them). Give the wheel as it was downloaded or built."
            " Nothing was run."
        )
    if not path.is_file():
        raise MatrixError(
            f"--vllm {given}: no such wheel file. Download it first (pip download --no-deps"
            " vllm==VERSION, or the nightly's URL) and give its path. Nothing was run."
        )
    return NamedRelease(m.group("version"), wheel=str(path.resolve()))


def source_for(declared: VllmSource, named: NamedRelease) -> VllmSource:
    """The platform's source for the named release, of the kind the matrix declares: the
    image of that release (its tag rewritten), the PyPI release, the git tag; a wheel file
    wherever a wheel can be installed (an image-only platform then builds from it)."""
    base = declared.installed
    if named.wheel is not None:
        return VllmSource(
            kind="wheel", package=base.package, wheel=named.wheel, version=named.version
        )
    if base.kind == "image" and base.image and releases.image_version(base.image):
        repository = base.image.rpartition(":")[0]
        image = f"{repository}:v{named.version}"
        return VllmSource(kind="image", package=base.package, image=image)
    if base.kind == "git":
        return VllmSource(kind="git", package=base.package, git_url=base.git_url,
                          git_ref=f"v{named.version}")  # fmt: skip
    return VllmSource(kind="pypi", package=base.package, version=named.version)


def apply(matrix: Matrix, platforms: list[str], named: NamedRelease) -> Matrix:
    """The matrix with the named release in place of each given platform's pin (those the
    matrix defines), refused in one paragraph where kvrig's rules cannot know it."""
    specs = dict(matrix.platforms)
    replaced = dict(matrix._replaced_pins)
    for platform in platforms:
        spec = specs.get(platform)  # type: ignore[call-overload]
        if spec is None:
            continue
        _refuse_unknown(platform, named)
        specs[platform] = spec.model_copy(update={"vllm": source_for(spec.vllm, named)})
        replaced.setdefault(platform, spec.vllm.describe())
    changed = matrix.model_copy(update={"platforms": specs})
    changed._replaced_pins = replaced
    return changed


def _refuse_unknown(platform: str, named: NamedRelease) -> None:
    unknown = releases.unknown_at(platform, releases.parse(named.version))
    if not unknown:
        return
    raise MatrixError(
        f"--vllm {named.describe()}: {releases.not_known(platform, named.version, unknown)},"
        f" and {named.version} falls between. Name a release they know, or add what it does"
        " to kvrig.define.releases. Nothing was run."
    )


def pinned(matrix: Matrix, platform: str) -> str | None:
    """The release the matrix pins for the platform, as a version string (None: none)."""
    spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
    found = releases.source_version(spec.vllm) if spec else None
    return found.removeprefix("v") if found else None


def is_pinned(matrix: Matrix, platform: str, named: NamedRelease) -> bool:
    """Whether the named release is the one the matrix pins (then nothing changes: its
    column is the release's own, in the release's folder)."""
    pin = pinned(matrix, platform)
    if named.wheel is not None or pin is None:
        return False
    return releases.parse(pin) == releases.parse(named.version)


def platforms_for(platform: str, device_emulated: bool) -> list[str]:
    """The platforms whose pin a column's named release replaces: an emulated device runs
    the CUDA wheel (XPU's and ROCm's code from it too), so all three; otherwise the
    column's own."""
    return list(gpus.EMULATED_PLATFORMS) if device_emulated else [platform]


def folder_name(column: str, named: NamedRelease | None) -> str:
    """A column's results folder name: the release's own for the pinned release, beside it
    for another (never gated: the gate reads the pinned release's folders)."""
    return column if named is None else f"{column}-{named.slug}"


def for_column(
    matrix: Matrix, platform: str, device_emulated: bool, given: str | None
) -> tuple[Matrix, NamedRelease | None]:
    """The matrix a column runs on, and the release it names when that is not the pin."""
    if not given:
        return matrix, None
    named = parse(given)
    if is_pinned(matrix, platform, named):
        return matrix, None
    return apply(matrix, platforms_for(platform, device_emulated), named), named
