"""The block size a cell should get, computed from its model config without vLLM.

vLLM's own arithmetic decides which size an engine runs at; if the rig only checked that
the engine ran, a silent change in that arithmetic (a different rounding, a lost page
term) would pass unseen. So every cell's size is derived a second time here, from the
per-layer shapes in the model's config, the platform's start size and the backends'
declared sizes, following the steps vLLM documents (phase 1, hybrid alignment, the XPU
GDN rounding, the early check). The verdict compares the two.

Everything here is pure: a config dict and a few facts in, an `Expected` out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvrig.define.cells import Cell
from kvrig.define.matrix import CraftedBackend
from kvrig.define.models import attention_layers, prefix_matches
from kvrig.host import isa

DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE, phase 1's default
# A crafted size that stands for the size alignment lands on for the cell's platform and
# CPU class: a control that must accept exactly that size, whatever the class makes it.
ALIGNED = "aligned"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class Kernel:
    """One entry of get_supported_kernel_block_sizes(): an int, or MultipleOf(size)."""

    size: int
    multiple: bool = False


@dataclass(frozen=True)
class Backend:
    """A backend as the block-size code sees it: its kernel sizes, and whether its
    supports_block_size() is overridden to accept only those exact sizes."""

    name: str
    kernels: tuple[Kernel, ...]
    exact: bool = False
    # A backend whose get_preferred_block_size() returns at least this (XPU's FLASH_ATTN:
    # 64); crafted subclasses inherit it from the backend they extend.
    preferred_floor: int | None = None

    @property
    def smallest(self) -> int:
        return min(k.size for k in self.kernels)

    def supports(self, block_size: int) -> bool:
        """AttentionBackend.supports_block_size: an int or MultipleOf accepts multiples."""
        if self.exact:
            return block_size in {k.size for k in self.kernels}
        return any(block_size % k.size == 0 for k in self.kernels)

    def preferred(self, default: int) -> int:
        """get_preferred_block_size: the default if supported, else the smallest size."""
        if self.preferred_floor is not None:
            return max(default, self.preferred_floor)
        return default if self.supports(default) else self.smallest


@dataclass(frozen=True)
class PlatformRules:
    """The per-platform facts the size depends on (vllm-blocksize-facts.md, sections 2-6)."""

    start: int  # the size before alignment when phase 1 does not run
    phase1: bool  # whether phase 1 (a size every backend accepts) runs at all
    default: Backend  # the attention backend the platform picks for these models
    # Whether these rules were confirmed by real engines: on an unconfirmed platform a
    # mismatch is reported beside the verdict instead of failing the cell.
    measured: bool = False
    mla: Backend | None = None
    indexer: Backend | None = None
    gdn_round: int | None = None  # XPU rounds the aligned size up to a multiple of 64
    gdn_checkpoint: int | None = None  # CUDA: FlashInfer GDN prefill in align mode


# Backends a case can ask for by name (--attention-backend), per platform.
SELECTABLE: dict[str, dict[str, Backend]] = {
    "cuda": {"TRITON_ATTN": Backend("TRITON_ATTN", (Kernel(16, True),))},
    "xpu": {"TRITON_ATTN": Backend("TRITON_ATTN", (Kernel(16, True),))},
}

RULES: dict[str, PlatformRules] = {
    "cpu": PlatformRules(
        start=128,
        phase1=False,
        default=Backend("CPU_ATTN", (Kernel(32, True),)),
        measured=True,
    ),
    "cuda": PlatformRules(
        start=16,
        phase1=True,
        default=Backend("FLASH_ATTN", (Kernel(16, True),)),
        mla=Backend("FLASHMLA_SPARSE", (Kernel(64, True),)),
        indexer=Backend("DEEPSEEK_V32_INDEXER", (Kernel(64),)),
        gdn_checkpoint=64,
    ),
    "xpu": PlatformRules(
        start=64,
        phase1=True,
        default=Backend("FLASH_ATTN", (Kernel(64, True),), preferred_floor=64),
        mla=Backend("XPU_MLA_SPARSE", (Kernel(1, True),)),
        indexer=Backend("DEEPSEEK_V32_INDEXER", (Kernel(64),)),
        gdn_round=64,
    ),
}


@dataclass(frozen=True)
class Pages:
    """Bytes per token of one attention layer's KV, and of one layer's whole SSM state."""

    attention_per_token: int
    mamba: int = 0
    ssm_dtype: str | None = None


@dataclass
class Expected:
    """What vLLM should do: the aligned size, or the early error and whom it names, or
    (on a CPU class that lacks what the cell needs) the refusal vLLM gives instead."""

    block_size: int | None
    rejecting: tuple[str, ...] = ()
    phase1_error: bool = False
    steps: list[str] = field(default_factory=list)
    unsupported: str | None = None

    def explain(self) -> str:
        return "; ".join(self.steps)


# --- model shapes ----------------------------------------------------------------------


def head_size(config: dict[str, Any]) -> int:
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def kv_dtype(model_dtype: str, kv_cache_dtype: str | None) -> str:
    return model_dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype


def ssm_dtype(
    config: dict[str, Any],
    model_dtype: str,
    knob: str | None,
    *,
    platform: str,
    avx512_bf16: bool,
) -> str:
    """The SSM (temporal) state dtype vLLM ends up with.

    "auto" follows the conv state (the model dtype), except that NemotronH takes the HF
    config's value or float32, and a CPU with AVX512-BF16 keeps only an explicit fp16/bf16
    state and resets everything else to float32 (its accelerated SSM kernels).
    """
    chosen = knob or "auto"
    if chosen == "auto" and config.get("architectures") == ["NemotronHForCausalLM"]:
        chosen = config.get("mamba_ssm_cache_dtype", "float32")
    if platform == "cpu" and avx512_bf16 and chosen != "float32":
        return chosen if chosen in ("float16", "bfloat16") else "float32"
    return model_dtype if chosen == "auto" else chosen


def mamba_page(config: dict[str, Any], conv: str, ssm: str) -> int:
    """One layer's state: conv (kernel-1) x conv_dim plus the SSM/GDN temporal state."""
    arch = (config.get("architectures") or [""])[0]
    if arch == "Qwen3NextForCausalLM":
        nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        conv_dim = dk * nk * 2 + dv * nv
        conv_state = (config["linear_conv_kernel_dim"] - 1) * conv_dim
        temporal = nv * dv * dk
    elif arch == "NemotronHForCausalLM":
        heads, hdim = config["mamba_num_heads"], config["mamba_head_dim"]
        state, groups = config["ssm_state_size"], config["n_groups"]
        conv_state = (config["conv_kernel"] - 1) * (heads * hdim + 2 * groups * state)
        temporal = heads * hdim * state
    elif arch == "GraniteMoeHybridForCausalLM":
        heads, hdim = config["mamba_n_heads"], config["mamba_d_head"]
        state, groups = config["mamba_d_state"], config["mamba_n_groups"]
        inner = config["mamba_expand"] * config["hidden_size"]
        conv_state = (config["mamba_d_conv"] - 1) * (inner + 2 * groups * state)
        temporal = heads * hdim * state
    else:
        raise ValueError(f"no state shape known for {arch or 'this model'}")
    return conv_state * DTYPE_BYTES[conv] + temporal * DTYPE_BYTES[ssm]


def pages(
    config: dict[str, Any],
    family: str,
    *,
    model_dtype: str,
    kv_cache_dtype: str | None = None,
    ssm_knob: str | None = None,
    platform: str = "cpu",
    avx512_bf16: bool = False,
) -> Pages:
    kv = DTYPE_BYTES[kv_dtype(model_dtype, kv_cache_dtype)]
    if family == "dsa":
        per_token = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * kv
        return Pages(per_token)
    per_token = 2 * int(config["num_key_value_heads"]) * head_size(config) * kv
    if family not in ("hybrid_mamba", "gdn"):
        return Pages(per_token)
    ssm = ssm_dtype(config, model_dtype, ssm_knob, platform=platform, avx512_bf16=avx512_bf16)
    return Pages(per_token, mamba_page(config, model_dtype, ssm), ssm)


# --- the block-size steps --------------------------------------------------------------


def concrete_sizes(sizes: Sequence[int | str], aligned: int | None) -> tuple[int, ...]:
    """A crafted backend's sizes with `aligned` replaced by the size alignment lands on
    (dropped while that size is being computed, `aligned` None)."""
    out = []
    for size in sizes:
        if size == ALIGNED:
            if aligned is not None:
                out.append(aligned)
        else:
            out.append(int(size))
    return tuple(dict.fromkeys(out))


def crafted_backend(b: CraftedBackend, extends: Backend, aligned: int | None = None) -> Backend:
    kernels = tuple(Kernel(s) for s in concrete_sizes(b.sizes, aligned))
    return Backend(b.name, kernels, exact=b.exact, preferred_floor=extends.preferred_floor)


def layer_backends(cell: Cell, config: dict[str, Any], aligned: int | None = None) -> list[Backend]:
    """The distinct non-SSM backends in layer order, as _find_non_ssm_backends lists them."""
    rules = RULES[cell.platform]
    crafted = cell.case.crafted
    default = rules.default
    asked = cell.case.knobs.attention_backend
    if asked is not None:
        default = SELECTABLE.get(cell.platform, {}).get(asked, default)
    if cell.model.family == "dsa" and rules.mla is not None:
        default = rules.mla
    if crafted.replace is not None:
        default = crafted_backend(crafted.replace, default, aligned)
    out: list[Backend] = []
    for i in attention_layers(config, cell.model.family):
        chosen = default
        for sib in crafted.siblings:
            if prefix_matches(sib.layers, i):
                chosen = crafted_backend(sib, default, aligned)
        if chosen not in out:
            out.append(chosen)
    if cell.model.family == "dsa" and rules.indexer is not None:
        out.append(rules.indexer)
    return out


def phase1(backends: Sequence[Backend], default: int) -> int | None:
    """_preferred_block_size_for_backends: a size every backend accepts, or None."""
    if len(backends) == 1:
        return backends[0].preferred(default)
    if all(b.supports(default) for b in backends):
        return default
    choices = [sorted({k.size for k in b.kernels}) for b in backends]
    candidates = sorted({math.lcm(*combo) for combo in itertools.product(*choices)})
    for size in candidates:
        if all(b.supports(size) for b in backends):
            return size
    return None


def align_hybrid(
    block_size: int,
    backends: Sequence[Backend],
    page: Pages,
    *,
    use_mla: bool = False,
    checkpoint: int | None = None,
) -> int:
    """Platform._align_hybrid_block_size: attention page >= mamba page, in kernel steps,
    then a multiple of every backend's smallest kernel block."""
    k = max(backends[0].smallest, block_size)
    if use_mla:
        k = max(k, 128)
    if checkpoint:
        k = math.lcm(k, checkpoint)
    size = k * math.ceil(page.mamba / (k * page.attention_per_token))
    every = math.lcm(*(b.smallest for b in backends))
    size = every * math.ceil(size / every)
    return max(block_size, size)


def cpu_of(cell: Cell) -> isa.Facts | None:
    """What the cell's CPU class decides, or None off CPU (or for an unknown class)."""
    return isa.facts(cell.isa) if cell.platform == "cpu" and cell.isa else None


def uses_aligned(cell: Cell) -> bool:
    crafted = cell.case.crafted
    specs = [*crafted.siblings, *([crafted.replace] if crafted.replace else [])]
    return any(ALIGNED in s.sizes for s in specs)


def expected(cell: Cell, config: dict[str, Any], *, cpu: isa.Facts | None) -> Expected:
    """Follows update_block_size_for_backend for this cell, step by step; `cpu` is what
    the cell's CPU class decides (kvrig.host.isa), None off CPU."""
    if cpu is not None and not cpu.fp8_kv_cache and "fp8" in (cell.case.knobs.kv_cache_dtype or ""):
        return Expected(
            None,
            steps=["an fp8 KV cache needs AVX-512 or AMX"],
            unsupported="FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
        )
    aligned = aligned_size(cell, config, cpu) if uses_aligned(cell) else None
    return _expected(cell, config, bool(cpu and cpu.resets_ssm_to_float32), aligned)


def aligned_size(cell: Cell, config: dict[str, Any], cpu: isa.Facts | None) -> int | None:
    """The size alignment lands on, which a crafted `aligned` entry stands for."""
    avx512_bf16 = bool(cpu and cpu.resets_ssm_to_float32)
    return _expected(cell, config, avx512_bf16, None).block_size


def _expected(
    cell: Cell, config: dict[str, Any], avx512_bf16: bool, aligned: int | None
) -> Expected:
    rules = RULES[cell.platform]
    knobs = cell.case.knobs
    family = cell.model.family
    backends = layer_backends(cell, config, aligned)
    steps: list[str] = [f"backends {', '.join(b.name for b in backends)}"]
    if knobs.block_size is not None:
        size = knobs.block_size
        steps.append(f"user block size {size}")
    elif rules.phase1:
        chosen = phase1(backends, DEFAULT_BLOCK_SIZE)
        if chosen is None:
            steps.append("phase 1: no size every backend accepts")
            return Expected(None, phase1_error=True, steps=steps)
        size = chosen
        steps.append(f"phase 1 picks {size}")
    else:
        size = rules.start
        steps.append(f"start {size}")
    pre = size
    if family in ("hybrid_mamba", "gdn"):
        page = pages(
            config,
            family,
            model_dtype=cell.model.dtype,
            kv_cache_dtype=knobs.kv_cache_dtype,
            ssm_knob=knobs.mamba_ssm_cache_dtype,
            platform=cell.platform,
            avx512_bf16=avx512_bf16,
        )
        align_mode = knobs.enable_prefix_caching is not False
        checkpoint = rules.gdn_checkpoint if family == "gdn" and align_mode else None
        size = align_hybrid(size, backends, page, checkpoint=checkpoint)
        steps.append(
            f"attention {page.attention_per_token} B/token, state {page.mamba} B"
            f" ({page.ssm_dtype} SSM): aligned to {size}"
        )
    rejecting = _check(size, pre, backends)
    if rejecting:
        steps.append(f"{size} rejected by {', '.join(rejecting)}")
        return Expected(size, rejecting, steps=steps)
    if rules.gdn_round and family == "gdn":
        rounded = rules.gdn_round * math.ceil(size / rules.gdn_round)
        if rounded != size:
            steps.append(f"GDN rounding to {rounded}")
            rejecting = _check(rounded, size, backends)
            size = rounded
    return Expected(size, rejecting, steps=steps)


def _check(size: int, pre: int, backends: Sequence[Backend]) -> tuple[str, ...]:
    """_check_aligned_block_size: only a moved size is checked, against every backend."""
    if size == pre:
        return ()
    return tuple(b.name for b in backends if not b.supports(size))
