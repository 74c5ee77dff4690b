"""matrix.yaml's cases: what a case varies (knobs, crafted backends) and what it expects
on each platform, CPU class and GPU architecture.

A case's expectations are the verdicts' reference (kvrig.judge.verdict); each is checked
here for what can be seen in it alone (a pattern that compiles and names something, sizes
that agree), so a case that could never pass is refused at load, not after its run.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from kvrig.define import gpus, patterns
from kvrig.define.strict import BACKEND_NAME, NAME, Count, Strict
from kvrig.define.vllm_names import (
    DRAFT_MODEL_METHODS,
    KNOWN_KV_CACHE_DTYPES,
    MAMBA_DTYPES,
    SPECULATIVE_METHODS,
    Platform,
)


class CraftedBackend(Strict):
    """A backend the rig's vLLM plugin puts into the engine.

    exact=True overrides supports_block_size() so only the listed sizes are accepted (like
    CPU_MLA); exact=False keeps vLLM's default reading of a plain int, "any multiple".
    """

    name: str = Field(pattern=BACKEND_NAME)
    # Kernel block sizes; `aligned` stands for the size alignment lands on for the cell's
    # platform and CPU class (kvrig.rules.blocksize), so a control accepts exactly it.
    # None at all (`[]`, plain only) is a backend vLLM reads as taking any size.
    sizes: list[Count | Literal["aligned"]]
    exact: bool = True

    @model_validator(mode="after")
    def _a_number_first(self) -> CraftedBackend:
        if not self.sizes and self.exact:
            raise ValueError(
                "sizes: an exact backend declaring no size accepts none; declare one, or"
                " set exact: false for a backend that declares none and so takes any size"
            )
        if self.sizes and not any(isinstance(s, int) for s in self.sizes):
            raise ValueError("sizes: needs at least one numeric size beside `aligned`")
        return self


class Sibling(CraftedBackend):
    """A second backend given to the attention layers whose prefix starts with `layers`."""

    layers: str = Field(min_length=1)
    base: str | None = Field(default=None, pattern=BACKEND_NAME)


class Replacement(CraftedBackend):
    """Takes the place of the backend the platform picks, for every attention layer."""

    target: str | None = Field(default=None, pattern=BACKEND_NAME)


class Crafted(Strict):
    replace: Replacement | None = None
    siblings: list[Sibling] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_unique(self) -> Crafted:
        names = [s.name for s in self.siblings] + ([self.replace.name] if self.replace else [])
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"crafted backend names must be unique, repeated: {dupes}")
        return self


Ranks = Annotated[StrictInt, Field(ge=1, le=8)]
MambaDtype = Literal[MAMBA_DTYPES]  # type: ignore[valid-type]


class Speculative(Strict):
    """vLLM's --speculative-config as a case sets it: the method, the tokens it proposes
    a step, and (for a drafter of its own) a model of this matrix, written offline beside
    the target as any miniature is."""

    method: str
    num_speculative_tokens: Count
    model: str | None = Field(default=None, pattern=NAME)
    # The draft's own context (vLLM's speculative max_model_len): a draft model of its own
    # (draft_model, which takes no positions from the target) served shorter lowers the
    # target's context to it.
    max_model_len: Annotated[StrictInt, Field(ge=16)] | None = None

    @field_validator("method")
    @classmethod
    def _a_vllm_method(cls, method: str) -> str:
        if method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"{method!r} is not one of vLLM's speculative methods"
                f" ({', '.join(sorted(SPECULATIVE_METHODS))})"
            )
        return method

    @model_validator(mode="after")
    def _draft_where_read(self) -> Speculative:
        drafts = self.method in DRAFT_MODEL_METHODS
        if drafts and self.model is None:
            raise ValueError(
                f"method {self.method} reads a drafter checkpoint of its own: name a model of"
                " this matrix as `model`"
            )
        if not drafts and self.model is not None:
            raise ValueError(
                f"method {self.method} reads no drafter checkpoint of its own, so `model`"
                " would name nothing vLLM loads: leave it out"
            )
        return self


class Knobs(Strict):
    """Engine arguments a case varies; None leaves vLLM's own default."""

    block_size: Count | None = None
    enable_prefix_caching: StrictBool | None = None
    mamba_ssm_cache_dtype: MambaDtype | None = None
    # The conv and SSM states' dtype together (--mamba-cache-dtype).
    mamba_cache_dtype: MambaDtype | None = None
    # The state group's block (--mamba-block-size): kept by vLLM only without alignment;
    # vLLM refuses it without prefix caching.
    mamba_block_size: Count | None = None
    # The model's context for this case (the model's own max_model_len otherwise): the
    # state group's block without prefix caching, and the engine core's bound.
    max_model_len: Annotated[StrictInt, Field(ge=16)] | None = None
    enable_chunked_prefill: StrictBool | None = None
    disable_hybrid_kv_cache_manager: StrictBool | None = None
    kv_cache_dtype: str | None = None
    # Layers (by index or name) kept at the model dtype beside a quantized KV cache: vLLM's
    # phase 3 then sizes the shared block from the primary backend.
    kv_cache_dtype_skip_layers: list[str] | None = None
    attention_backend: str | None = Field(default=None, pattern=BACKEND_NAME)
    multiprocessing: StrictBool | None = None
    # Ranks of one engine (vLLM's multiprocess executor): KV heads per rank, replicated
    # when there are fewer than ranks, and Mamba/GDN heads split across them.
    tensor_parallel_size: Ranks | None = None
    # Stages of one engine, each a worker holding its own layers (with tensor parallel,
    # tp x pp ranks): each stage's worker sizes the block from its own layers only.
    pipeline_parallel_size: Ranks | None = None
    decode_context_parallel_size: Ranks | None = None
    # The DCP interleave (--cp-kv-cache-interleave-size): tokens a rank takes in turn,
    # which vLLM asserts divide the block.
    cp_kv_cache_interleave_size: Count | None = None
    speculative_config: Speculative | None = None
    # Prefix-cache hits at another unit than the block (--prefix-match-unit): vLLM
    # refuses one with a single KV-cache group.
    prefix_match_unit: Count | None = None
    # Multimodal input scheduled whole (--disable-chunked-mm-input): a Mamba state's
    # prefix caching needs chunks, and vLLM asserts it.
    disable_chunked_mm_input: StrictBool | None = None

    @field_validator("kv_cache_dtype")
    @classmethod
    def _a_vllm_cache_dtype(cls, name: str | None) -> str | None:
        if name is not None and name not in KNOWN_KV_CACHE_DTYPES:
            raise ValueError(
                f"{name!r} is not a KV-cache dtype vLLM knows"
                f" ({', '.join(sorted(KNOWN_KV_CACHE_DTYPES))})"
            )
        return name


class Invariants(Strict):
    """Extra facts a running cell must show, on top of the ones every `runs` cell checks."""

    block_size: Count | None = None
    block_size_in: list[Count] | None = None
    # The engine core's block: the smallest of its KV-cache groups' (max_model_len for a
    # hybrid's state without prefix caching; an unaligned pipeline stage's). `worker`: the
    # worker's own block, whatever it is, so the fact holds for every release the cell runs.
    engine_block_size: Count | Literal["worker"] | None = None
    # Each pipeline stage's worker block, stage 0 first.
    stage_block_sizes: list[Count] | None = None
    kernel_block_sizes_include: list[Count] | None = None
    # Every KV-cache group's kernel block, in the groups' order: where a group's split is
    # the point (a block-outermost layout keeps every block whole).
    kernel_block_sizes: list[Count] | None = None
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
        kernels = [*(self.kernel_block_sizes_include or []), *(self.kernel_block_sizes or [])]
        apart = [k for k in kernels if self.block_size % k]
        if apart:
            raise ValueError(
                f"kernel block sizes {apart} do not divide block_size"
                f" {self.block_size}: vLLM splits a block into kernel blocks of a size that"
                " divides it"
            )
        return self


class _Matching(Strict):
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


class Runs(Strict):
    outcome: Literal["runs"]
    invariants: Invariants = Field(default_factory=Invariants)


class EarlyError(Strict):
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


class Skip(Strict):
    outcome: Literal["skip"]
    reason: str = Field(min_length=1)


Expectation = Annotated[
    Runs | EarlyError | LateError | Unsupported | Skip, Field(discriminator="outcome")
]


class KnownDefect(Strict):
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
        that the marker stands for nothing."""
        if not shows:
            raise ValueError("a known defect must say what it shows on at least one platform")
        return shows


class ArchExpectation(Strict):
    """What a CUDA or ROCm cell does on some GPU architectures instead of the platform's
    expectation, and why vLLM's code decides so there (a backend's declared capabilities,
    a kernel's, the selector's order for a gfx target)."""

    why: str = Field(min_length=1)
    expect: Expectation


def arch_keys(key: str) -> list[str]:
    """The architectures an `expect_by_arch` key names: "9.0", or several as "8.0, 8.9";
    "gfx1201" (ROCm's)."""
    parts = [part for part in key.split(",") if part.strip()]
    return [gpus.normalize(gpus.arch_platform(part), part) for part in parts]


# Set (to anything but "" or "0") where AMD's aiter is installed beside vLLM, as in vLLM's
# ROCm image; an emulated ROCm cell then gets kvrig's stand-in for it
# (kvrig.run.emulation.rocm_platform). Unset: no aiter, as with vLLM's PyPI wheel.
AITER_ENV = "KVRIG_ROCM_AITER"
# The engine environment a case may set, each variable with the platforms whose selector
# kvrig's rules read it for: ROCm's AITER switches (VLLM_ROCM_USE_AITER and
# VLLM_ROCM_USE_AITER_MHA, vllm/envs.py, read by kvrig.rules.rocm) and AITER_ENV; XPU's
# batch invariance (VLLM_BATCH_INVARIANT, which sends XPU's selector to TRITON_ATTN); the
# KV-cache layout on CUDA (VLLM_KV_CACHE_LAYOUT: a block-outermost one packs mixed pages
# and keeps the block whole as the kernel block, kvrig.rules.backends). Any other
# variable, or one of these elsewhere, could change an outcome the rules do not know of.
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
KV_CACHE_LAYOUT_ENV = "VLLM_KV_CACHE_LAYOUT"
CASE_ENV: dict[str, tuple[str, ...]] = {
    AITER_ENV: ("rocm",),
    "VLLM_ROCM_USE_AITER": ("rocm",),
    "VLLM_ROCM_USE_AITER_MHA": ("rocm",),
    BATCH_INVARIANT_ENV: ("xpu",),
    KV_CACHE_LAYOUT_ENV: ("cuda",),
}
# The values the rules read where a variable's value is more than a switch: BLHNC is the
# block-outermost layout every CUDA backend the rules pick takes (FLASHINFER on SM10.x
# takes LBHNC and BLHNC only; vLLM refuses any other there before the first block).
CASE_ENV_VALUES: dict[str, tuple[str, ...]] = {KV_CACHE_LAYOUT_ENV: ("BLHNC",)}


class Case(Strict):
    id: str = Field(pattern=NAME)
    model: str
    doc: str = ""
    # The statement of the reviewed change this case stands for (a quote, or "control").
    review: str = ""
    known_defect: KnownDefect | None = None
    knobs: Knobs = Field(default_factory=Knobs)
    # The engine's environment beside the platform's (CASE_ENV's names, each on its
    # platforms only): where vLLM's selection differs with it.
    env: dict[str, str] = Field(default_factory=dict)
    crafted: Crafted = Field(default_factory=Crafted)
    expect: dict[Platform, Expectation]
    # CPU only: where the host's (or the emulated) class changes the outcome, the
    # expectation on that class (kvrig.host.isa); other classes keep `expect.cpu`.
    expect_by_isa: dict[str, Expectation] = Field(default_factory=dict)
    # CUDA and ROCm: where the GPU architecture changes the outcome, the expectation on
    # those architectures (kvrig.define.gpus: 9.0, gfx1201), each with its reason; others
    # keep the platform's.
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

    @field_validator("env")
    @classmethod
    def _env_the_rules_read(cls, env: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(env) - set(CASE_ENV))
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: a case sets only the variables kvrig's rules read"
                f" ({', '.join(CASE_ENV)}); another would change what vLLM does unseen"
            )
        for name, value in env.items():
            allowed = CASE_ENV_VALUES.get(name)
            if allowed is not None and value not in allowed:
                raise ValueError(
                    f"{name}={value}: kvrig's rules read {', '.join(allowed)} only there;"
                    " another value could make vLLM refuse the layout unseen"
                )
        return env

    @model_validator(mode="after")
    def _env_on_its_platforms(self) -> Case:
        for name in self.env:
            others = sorted(p for p in self.expect if p not in CASE_ENV[name])
            if others:
                raise ValueError(
                    f"env: {name} is read on {', '.join(CASE_ENV[name])} only, and the case"
                    f" expects on {', '.join(others)} too; give that expectation a case of"
                    " its own"
                )
        return self


def expectations(i: int, case: Case) -> list[tuple[str, str, Expectation]]:
    """Every expectation of a case, with where it is written and the platform it is for."""
    out: list[tuple[str, str, Expectation]] = [
        (f"cases.{i}.expect.{p}", p, e) for p, e in case.expect.items()
    ]
    out += [(f"cases.{i}.expect_by_isa.{c}", "cpu", e) for c, e in case.expect_by_isa.items()]
    out += [
        (f"cases.{i}.expect_by_arch.{k}.expect", gpus.arch_platform(k), a.expect)
        for k, a in case.expect_by_arch.items()
    ]
    if case.known_defect is not None:
        shows = case.known_defect.shows.items()
        out += [(f"cases.{i}.known_defect.shows.{p}", p, e) for p, e in shows]
    return out
