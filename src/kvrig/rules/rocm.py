"""ROCm's block-size rules: which backend vLLM's RocmPlatform picks, and what it prefers.

RocmPlatform overrides none of the block-size steps, so a ROCm size differs from a CUDA
one only through the backends: which one the selector puts first for a gfx target,
release and AITER's state, the start size it prefers, the kernel sizes it declares. Each
is restated here as data naming the vLLM file it follows, and held to vLLM's own code
emulated on each gfx target (tests/unit/rules/test_rocm_rules.py). What changed between
releases is a switch of kvrig.define.releases, so a release diff can name it.

Pure: a gfx target, a release's rules and AITER's state in, backends out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvrig.define.case_spec import AITER_ENV
from kvrig.define.gpus import ROCM_GPUS
from kvrig.facts import backends as facts
from kvrig.rules import versions
from kvrig.rules.backends import Backend, PlatformRules
from kvrig.rules.shapes import ConfigError

ARCHS = tuple(ROCM_GPUS)
# The target a prediction answers for when none is given: the Instinct boards (gfx942,
# gfx950) choose alike, and users run them most.
DEFAULT_ARCH = "gfx942"
# The first release whose ROCm selection was read (kvrig.define.releases.READ).
FIRST_READ: versions.Version = (0, 33, 0)


class RocmRuleError(ConfigError):
    """A gfx target, release or setting the ROCm rules do not cover; one paragraph."""


@dataclass(frozen=True)
class Aiter:
    """AITER as vLLM's selection sees it (vllm/_aiter_ops.py): `found` is whether a module
    named `aiter` is importable (IS_AITER_FOUND, find_spec("aiter"): AMD's distribution
    amd-aiter, which vLLM's ROCm image installs; PyPI's `aiter` is another project), read
    once at import; `enabled` is VLLM_ROCM_USE_AITER (off by default), `mha`
    VLLM_ROCM_USE_AITER_MHA (on by default)."""

    found: bool = False
    enabled: bool = False
    mha: bool = True

    @property
    def label(self) -> str:
        if not self.found:
            return "no aiter"
        return "AITER on" if self.enabled else "aiter found, AITER off"


NO_AITER = Aiter()


def aiter_installed(env: Mapping[str, str]) -> bool:
    """Whether an engine's environment says AMD's aiter is installed."""
    return env.get(AITER_ENV, "") not in ("", "0")


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean as vllm/envs.py reads it: "true" or "1", case aside."""
    return env.get(name, str(default)).lower() in ("true", "1")


def aiter_of(env: Mapping[str, str]) -> Aiter:
    return Aiter(
        found=aiter_installed(env),
        enabled=_env_flag(env, "VLLM_ROCM_USE_AITER", False),
        mha=_env_flag(env, "VLLM_ROCM_USE_AITER_MHA", True),
    )


# The Instinct MI300 and MI350 targets (vllm/platforms/rocm.py: on_mi3xx): the only ones
# AITER's MLA prefill (ROCM_AITER_FA) is valid on.
MI3XX = ("gfx942", "gfx950")


def aiter_mla_prefill(arch: str, aiter: Aiter) -> bool:
    """Whether ROCm has an MLA prefill backend for dense MLA: only AITER's, and only with
    AITER on and on MI3xx (mla/prefill/aiter_flash_attn.py); FLASH_ATTN's needs the upstream
    flash-attn package, which vLLM's ROCm image does not ship."""
    return aiter.found and aiter.enabled and arch in MI3XX


# The backends a decoder layer of kvrig's (non-DSA) models can get on ROCm: what
# `kvrig predict --platform rocm --backend` may name, by AttentionBackendEnum's names.
ATTENTION = tuple(facts.nameable("rocm", "attention"))
ROCM_AITER_MLA = facts.backend("rocm", "ROCM_AITER_MLA")


def backends(rules: versions.Rules) -> dict[str, Backend]:
    """The backends ROCm's selection reaches for kvrig's models at a release, by the name
    --attention-backend takes (AttentionBackendEnum's)."""
    table = {**facts.nameable("rocm", "attention"), **facts.on("rocm", "sparse_mla", "indexer")}
    if rules.rocm_attn_prefers_16:
        table["ROCM_ATTN"] = replace(table["ROCM_ATTN"], preferred_fixed=16)
    return table


# Listed last for every layer; each takes only its own KV-cache dtypes (turboquant_*,
# ultraquant_4bit, ROCM_OCTAVE's), so none serves these models' layers.
_OWN_DTYPES_ONLY = ("TURBOQUANT", "ROCM_OCTAVE", "ULTRAQUANT")
PRIORITIES_WHERE = (
    "vllm/platforms/rocm.py: _get_backend_priorities (the list) and"
    " RocmPlatform.get_valid_backends (0.34.0's gfx1201 swap); the first valid one is chosen"
)


def known_arch(arch: str) -> str:
    """The gfx target as the tables key it ("gfx942" for "gfx942:sramecc+:xnack-"), or
    RocmRuleError naming those kvrig keeps rules for."""
    key = arch.strip().lower().split(":", 1)[0]
    if key in ROCM_GPUS:
        return key
    listed = ", ".join(f"{g.arch} ({g.examples})" for g in ROCM_GPUS.values())
    raise RocmRuleError(
        f"kvrig keeps no ROCm rules for the gfx target {arch!r}: it knows {listed}. Give the"
        " target amd-smi or rocminfo prints for one of those; for another GPU, name the"
        " backend the engine logged with --backend."
    )


def read_release(rules: versions.Rules) -> None:
    """Refuses a release older than the ROCm selection kvrig read: which backend it picks
    there is not restated (a named backend's size still is)."""
    if rules.version < FIRST_READ:
        raise RocmRuleError(
            f"kvrig's ROCm selection was read in vLLM {versions.shown(FIRST_READ)} and later;"
            f" which backend vLLM {versions.shown(rules.version)} picks on ROCm is not"
            " restated. Name the backend the engine logged (--backend ROCM_ATTN, ...), or give"
            " a release kvrig read."
        )


def priorities(
    arch: str,
    rules: versions.Rules,
    *,
    aiter: Aiter = NO_AITER,
    kv_cache_dtype: str | None = None,
    use_mla: bool = False,
    use_sparse: bool = False,
) -> tuple[str, ...]:
    """The selector's order of backends for a decoder layer without a KV connector, as
    _get_backend_priorities builds it and get_valid_backends reorders it."""
    arch = known_arch(arch)
    read_release(rules)
    if use_sparse:
        return ("ROCM_AITER_MLA_SPARSE",)
    gpu = ROCM_GPUS[arch]
    supported = aiter.found and gpu.cdna > 2  # is_aiter_found_and_supported()
    if use_mla:
        if supported and aiter.enabled:  # rocm_aiter_ops.is_mla_enabled()
            return ("ROCM_AITER_MLA", "TRITON_MLA", "ROCM_AITER_TRITON_MLA")
        return ("TRITON_MLA",)
    out = ["ROCM_ATTN"]
    if supported and aiter.enabled and aiter.mha:  # rocm_aiter_ops.is_mha_enabled()
        out.append("ROCM_AITER_FA")
    if supported:  # found on CDNA 3+, whether AITER is on or not
        out.append("ROCM_AITER_UNIFIED_ATTN")
    elif aiter.found and aiter.enabled and gpu.rdna4:  # is_rdna_aiter_enabled()
        out.insert(0, "ROCM_AITER_UNIFIED_ATTN")
    out += ["TRITON_ATTN", *_OWN_DTYPES_ONLY]
    if rules.rocm_triton_first and gpu.triton_first and kv_cache_dtype != "fp8_e5m2":
        i, j = out.index("ROCM_ATTN"), out.index("TRITON_ATTN")
        out[i], out[j] = out[j], out[i]
    return tuple(out)


def default_backend(
    arch: str,
    rules: versions.Rules,
    *,
    aiter: Aiter = NO_AITER,
    kv_cache_dtype: str | None = None,
) -> str:
    """The backend the selector picks for the hybrid, GDN and dense models kvrig restates
    (head sizes 32 to 256, float16 or bfloat16, no sinks): the first of the list, every
    one before the dtype-only backends being valid for them."""
    order = priorities(arch, rules, aiter=aiter, kv_cache_dtype=kv_cache_dtype)
    return next(b for b in order if b not in _OWN_DTYPES_ONLY)


def platform_rules(
    arch: str, rules: versions.Rules, aiter: Aiter = NO_AITER, kv_cache_dtype: str | None = None
) -> PlatformRules:
    """One gfx target's backends at one release: what the block-size steps read. DSA
    layers take ROCm's sparse MLA backend by name (vllm/models/deepseek_v32/amd/rocm.py:
    DeepseekV32MLAAttention passes attn_backend=ROCMAiterMLASparseBackend), with the
    ROCm indexer's cache registered before them. Confirmed by published engine logs
    (MI300X-class: ROCM_ATTN's sizes), so `measured`."""
    table = backends(rules)
    chosen = default_backend(arch, rules, aiter=aiter, kv_cache_dtype=kv_cache_dtype)
    return PlatformRules(
        default=table[chosen],
        measured=True,
        mla=table["ROCM_AITER_MLA_SPARSE"],
        indexer=table["DEEPSEEK_V32_INDEXER"],
        selectable=table,
        # Dense MLA layers with AITER on (without it vLLM finds no MLA prefill backend:
        # kvrig.rules.refusals).
        dense_mla=ROCM_AITER_MLA if aiter.found and aiter.enabled else None,
    )


def arch_choices(rules: versions.Rules, aiter: Aiter = NO_AITER) -> dict[str, str]:
    """The default backend of every gfx target kvrig knows, at a release."""
    return {a: default_backend(a, rules, aiter=aiter) for a in ARCHS}


def selection_text(
    arch: str, rules: versions.Rules, aiter: Aiter = NO_AITER, kv_cache_dtype: str | None = None
) -> str:
    """Why the selector picks its backend on a gfx target, in a line for explanations."""
    order = priorities(arch, rules, aiter=aiter, kv_cache_dtype=kv_cache_dtype)
    chosen = default_backend(arch, rules, aiter=aiter, kv_cache_dtype=kv_cache_dtype)
    b = backends(rules)[chosen]
    start = (
        f"prefers {b.preferred_fixed} whatever the start"
        if b.preferred_fixed is not None
        else f"takes the start, {rules.start}"
    )
    return (
        f"{chosen} on {known_arch(arch)} ({aiter.label}): the first valid of"
        f" [{', '.join(order)}] (vllm/platforms/rocm.py); it {start}"
    )
