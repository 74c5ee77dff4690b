"""The block size a cell should get, computed from its model config without vLLM.

If the rig only checked that the engine ran, a silent change in vLLM's arithmetic (a
different rounding, a lost page term) would pass unseen. So every cell's size is derived
a second time here, following vLLM's steps (phase 1, hybrid alignment, the XPU GDN
rounding, the early check) at the release the platform installs; `kvrig predict` runs the
same steps (`decide`) for a real checkpoint.

Everything here is pure: a config dict and a few facts in, an `Expected` out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvrig.define.case_spec import (
    BATCH_INVARIANT_ENV,
    KV_CACHE_LAYOUT_ENV,
    Crafted,
    CraftedBackend,
)
from kvrig.define.cells import Cell
from kvrig.define.models import prefix_matches
from kvrig.define.vllm_models import (
    HYBRID_FAMILIES,
    MLA_FAMILIES,
    Family,
    architecture,
    attention_layers,
    layer_count,
    text_config,
)
from kvrig.facts import backends as facts
from kvrig.facts.platforms import PLATFORMS
from kvrig.host import isa
from kvrig.rules import choices, cuda, refusals, rocm, shapes, versions
from kvrig.rules.backends import Backend, Kernel, PlatformRules
from kvrig.rules.planning import core_blocks, pipeline_split, served_context

# A crafted size that stands for the size alignment lands on for the cell's platform and
# CPU class: a control that must accept exactly that size, whatever the class makes it.
ALIGNED = "aligned"
DTYPE_BYTES = shapes.DTYPE_BYTES
# FLASHINFER_GDN_CHECKPOINT_ALIGNMENT: the prefill checkpoint GDN layers on FlashInfer's
# prefill ask for in align mode (vllm/model_executor/layers/mamba/gdn/).
GDN_CHECKPOINT = 64
# XPUPlatform.update_block_size_for_backend: GDN kernels need a multiple of 64.
XPU_GDN_ROUND = 64


def _stock(platform: str) -> Backend:
    return facts.backend(platform, PLATFORMS[platform].default_backend)


# The backends of the platforms whose choice reads no release (ROCm's does: platform_rules).
# CUDA's default on an SM10.x GPU or with a quantized KV cache is FLASHINFER
# (platform_rules, kvrig.rules.cuda).
RULES: dict[str, PlatformRules] = {
    "cpu": PlatformRules(default=_stock("cpu"), measured=True),
    "cuda": PlatformRules(
        default=_stock("cuda"),
        measured=True,
        mla=facts.backend("cuda", "FLASHMLA_SPARSE"),
        indexer=facts.backend("cuda", "DEEPSEEK_V32_INDEXER"),
    ),
    "xpu": PlatformRules(
        default=_stock("xpu"),
        mla=facts.backend("xpu", "XPU_MLA_SPARSE"),
        indexer=facts.backend("xpu", "DEEPSEEK_V32_INDEXER"),
        dense_mla=facts.backend("xpu", "FLASH_ATTN_MLA"),
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
    (on a CPU class that lacks what the cell needs) the refusal vLLM gives instead.

    `page` and `padded` are the pages phase 2 worked with (the attention page per token,
    the mamba page, and the attention page of the chosen size the mamba page is padded
    to); `log` holds the lines vLLM itself logs on the way."""

    block_size: int | None
    rejecting: tuple[str, ...] = ()
    phase1_error: bool = False
    steps: list[str] = field(default_factory=list)
    unsupported: str | None = None
    page: Pages | None = None
    padded: int | None = None
    # The page every group ends on when the engine core unifies them (unify_kv_cache_
    # spec_page_size): skip layers at the model dtype hold a wider page than the
    # quantized ones, and the state pads again to it; None where it is `padded`.
    unified: int | None = None
    log: list[str] = field(default_factory=list)
    # The engine core's block (the smallest of its KV-cache groups' blocks), the state
    # group's block, and with pipeline parallelism each stage's worker block.
    engine_block_size: int | None = None
    mamba_block_size: int | None = None
    stage_block_sizes: tuple[int, ...] = ()

    def explain(self) -> str:
        return "; ".join(self.steps)

    @property
    def padding_pct(self) -> float:
        """The padding vLLM logs, 100 x (attention page - mamba page) / mamba page."""
        if not self.page or not self.page.mamba or self.padded is None:
            return 0.0
        return 100 * (self.padded - self.page.mamba) / self.page.mamba


# --- model shapes ----------------------------------------------------------------------


def kv_dtype(model_dtype: str, kv_cache_dtype: str | None) -> str:
    return model_dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype


def conv_dtype(model_dtype: str, mamba_cache_dtype: str | None) -> str:
    """The conv state's dtype (MambaStateDtypeCalculator: get_kv_cache_torch_dtype of
    --mamba-cache-dtype), which an "auto" SSM state follows."""
    return (
        model_dtype if mamba_cache_dtype in (None, "auto") else shapes.dtype_name(mamba_cache_dtype)
    )


def ssm_dtype(
    config: dict[str, Any],
    model_dtype: str,
    knob: str | None,
    *,
    platform: str,
    avx512_bf16: bool,
    rules: versions.Rules | None = None,
) -> str:
    """The SSM state dtype (kvrig.rules.choices.ssm_dtype) for a config, at the release
    of `rules` (default: the platform's newest rules); `model_dtype` is the conv state's,
    which an "auto" state follows."""
    cfg = text_config(config)
    arch = architecture(cfg) or ""
    return choices.ssm_dtype(
        arch,
        shapes.config_ssm_dtype(cfg, arch),
        model_dtype,
        knob,
        rules or versions.rules(platform, versions.NEWEST),
        cpu_resets_to_float32=platform == "cpu" and avx512_bf16,
    )


def pages(
    config: dict[str, Any],
    family: Family,
    *,
    model_dtype: str,
    kv_cache_dtype: str | None = None,
    ssm_knob: str | None = None,
    platform: str = "cpu",
    avx512_bf16: bool = False,
    rules: versions.Rules | None = None,
    tp: int = 1,
    num_speculative_tokens: int = 0,
    conv_knob: str | None = None,
) -> Pages:
    """One rank's attention page per token and mamba page (kvrig.rules.shapes)."""
    if family == Family.DSA:
        kv = shapes.dtype_bytes(kv_dtype(model_dtype, kv_cache_dtype))
        return Pages((config["kv_lora_rank"] + config["qk_rope_head_dim"]) * kv)
    s = shapes.shapes(config, tp=tp, num_speculative_tokens=num_speculative_tokens)
    per_token = shapes.attention_page_per_token(s, kv_dtype(model_dtype, kv_cache_dtype))
    if not s.hybrid:
        return Pages(per_token)
    conv = conv_dtype(model_dtype, conv_knob)
    ssm = ssm_dtype(config, conv, ssm_knob, platform=platform, avx512_bf16=avx512_bf16, rules=rules)
    return Pages(per_token, shapes.mamba_page(s, conv, ssm), ssm)


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
    """A crafted backend: its own name and sizes, and the preference of the class it
    subclasses (kvrig.run.vllm_plugin.crafted), which it inherits."""
    kernels = tuple(Kernel(s) for s in concrete_sizes(b.sizes, aligned))
    return replace(extends, name=b.name, kernels=kernels, exact=b.exact)


def platform_rules(cell: Cell, release: versions.Rules | None = None) -> PlatformRules:
    """The backends the cell's platform gives its layers. CUDA's default depends on the
    compute capability and the KV-cache dtype (kvrig.rules.cuda); ROCm's on the gfx
    target, the release, AITER and the KV-cache dtype (kvrig.rules.rocm), a ROCm cell
    without a target taken for the Instinct boards'."""
    knobs = cell.case.knobs
    if cell.platform == "cuda":
        chosen = cuda.default_backend(cell.gpu_arch, knobs.kv_cache_dtype)
        mla = cuda.mla_backend(cell.gpu_arch, knobs.block_size)
        return replace(RULES["cuda"], default=chosen, dense_mla=mla)
    rules = RULES[cell.platform] if cell.platform != "rocm" else None
    if cell.platform == "xpu" and _xpu_falls_back_to_triton(cell):
        rules = replace(RULES["xpu"], default=facts.backend("xpu", "TRITON_ATTN"))
    if rules is None:
        rules = rocm.platform_rules(**rocm_selection(cell, release))
    if cell.platform != "cpu" and (knobs.kv_cache_dtype or "").startswith("turboquant_"):
        # TURBOQUANT is the one backend that takes its caches, on every GPU platform.
        rules = replace(rules, default=cuda.TURBOQUANT)
    return rules


def _xpu_falls_back_to_triton(cell: Cell) -> bool:
    """FlashAttention on XPU takes no float32 model (XPUPlatform.get_attn_backend_cls), and
    a batch-invariant engine (VLLM_BATCH_INVARIANT) with no backend named defaults to
    TRITON_ATTN (EngineArgs); XPU's selector honours a named FLASH_ATTN there."""
    if cell.model.dtype == "float32":
        return True
    invariant = cell.env.get(BATCH_INVARIANT_ENV, "0") not in ("", "0")
    return invariant and cell.case.knobs.attention_backend != "FLASH_ATTN"


def block_outermost(cell: Cell) -> bool:
    """The cell's KV-cache layout puts the block outermost (VLLM_KV_CACHE_LAYOUT BLHNC,
    BLNHC, BHLNC): the engine core packs mixed pages into each block, and the worker keeps
    every block whole as its kernel block (kvrig.rules.backends.kernel_block_size)."""
    return cell.env.get(KV_CACHE_LAYOUT_ENV, "").upper().startswith("B")


def rocm_selection(cell: Cell, release: versions.Rules | None = None) -> dict[str, Any]:
    """What ROCm's selector reads for a cell, as kvrig.rules.rocm takes it: the gfx target
    (the Instinct boards' without one), the release's rules, AITER and the KV-cache dtype.
    The rules' backends and the crafted backends' base (kvrig.run.cell) both read it here."""
    return {
        "arch": cell.gpu_arch or rocm.DEFAULT_ARCH,
        "rules": release or cell_rules(cell),
        "aiter": rocm.aiter_of(cell.env),
        "kv_cache_dtype": cell.case.knobs.kv_cache_dtype,
    }


def selected(cell: Cell, release: versions.Rules | None = None) -> Backend:
    """The backend the platform's selector gives the cell's attention layers, before any
    crafted one: the knob's, else the sparse-MLA, dense-MLA or plain default."""
    rules = platform_rules(cell, release)
    asked = cell.case.knobs.attention_backend
    dsa = cell.model.family == Family.DSA and rules.mla is not None
    if asked is not None and not (dsa and asked == rules.mla.name):  # type: ignore[union-attr]
        return (rules.selectable or facts.nameable(cell.platform)).get(asked, rules.default)
    if dsa:
        return rules.mla  # type: ignore[return-value]
    if cell.model.family in MLA_FAMILIES and rules.dense_mla is not None:
        return rules.dense_mla
    return rules.default


def layer_backends(
    cell: Cell,
    config: dict[str, Any],
    aligned: int | None = None,
    release: versions.Rules | None = None,
    layers: Sequence[int] | None = None,
) -> list[Backend]:
    """The distinct non-SSM backends in layer order, as _find_non_ssm_backends lists them
    (of `layers` only: a pipeline stage's worker sees its own)."""
    rules = platform_rules(cell, release)
    crafted = cell.case.crafted
    default = selected(cell, release)
    dsa = cell.model.family == Family.DSA and rules.mla is not None
    if crafted.replace is not None:
        default = crafted_backend(crafted.replace, default, aligned)
    # A DSA layer registers its indexer's cache before its attention, so the indexer is
    # the first backend _find_non_ssm_backends lists (the one phases 2 and 3 size from).
    out: list[Backend] = [rules.indexer] if dsa and rules.indexer is not None else []
    for i in attention_layers(config, cell.model.family):
        if layers is not None and i not in layers:
            continue
        chosen = default
        for sib in crafted.siblings:
            if prefix_matches(sib.layers, i, config):
                chosen = crafted_backend(sib, default, aligned)
        if chosen not in out:
            out.append(chosen)
    return out


def phase1(backends: Sequence[Backend], default: int) -> int | None:
    """_preferred_block_size_for_backends: a size every backend accepts, or None."""
    if len(backends) == 1:
        return backends[0].preferred(default)
    if all(b.supports(default) for b in backends):
        return default
    # A backend declaring no sizes accepts any, so it contributes 1.
    choices = [sorted({k.size for k in b.kernels}) or [1] for b in backends]
    candidates = sorted({math.lcm(*combo) for combo in itertools.product(*choices)})
    for size in candidates:
        if all(b.supports(size) for b in backends):
            return size
    return None


def kernel_step(
    block_size: int,
    backends: Sequence[Backend],
    *,
    use_mla: bool = False,
    checkpoint: int | None = None,
) -> int:
    """_align_hybrid_block_size's kernel_block_alignment_size: the step the attention
    block grows in (the first backend's smallest kernel block or the size so far, 128 for
    MLA, and the LCM with a prefill checkpoint)."""
    k = max(backends[0].smallest, block_size)
    if use_mla:
        k = max(k, 128)
    return math.lcm(k, checkpoint) if checkpoint else k


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
    k = kernel_step(block_size, backends, use_mla=use_mla, checkpoint=checkpoint)
    size = k * math.ceil(page.mamba / (k * page.attention_per_token))
    every = math.lcm(*(b.smallest for b in backends))
    size = every * math.ceil(size / every)
    return max(block_size, size)


def cpu_of(cell: Cell) -> isa.Facts | None:
    """What the cell's CPU class decides, or None off CPU (or for an unknown class)."""
    return isa.facts(cell.isa) if cell.platform == "cpu" and cell.isa else None


def uses_aligned(crafted: Crafted) -> bool:
    """Whether a crafted backend declares the size alignment lands on (ALIGNED)."""
    specs = [*crafted.siblings, *([crafted.replace] if crafted.replace else [])]
    return any(ALIGNED in s.sizes for s in specs)


def expected(
    cell: Cell,
    config: dict[str, Any],
    *,
    cpu: isa.Facts | None,
    gpu_arch: str | None = None,
    rules: versions.Rules | None = None,
) -> Expected:
    """Follows update_block_size_for_backend for this cell, step by step, at the release
    its platform installs; `cpu` is what the cell's CPU class decides (kvrig.host.isa),
    None off CPU; `gpu_arch` the CUDA compute capability, which decides the GDN prefill
    kernel (None: unknown, and a size that depends on it raises ConfigError). `rules`
    stands in for the release's own (a release diff asks what one switch explains)."""
    if cpu is not None and not cpu.fp8_kv_cache and "fp8" in (cell.case.knobs.kv_cache_dtype or ""):
        return Expected(
            None,
            steps=["an fp8 KV cache needs AVX-512 or AMX"],
            unsupported="FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
        )
    refusal = choices.sparse_mla_refusal(
        cell.platform, cell.model.family, gpu_arch, cell.case.knobs.attention_backend
    )
    if refusal is not None:
        return Expected(None, steps=[refusal], unsupported=refusal)
    aligned = (
        _expected(cell, config, cpu, None, gpu_arch, rules).block_size
        if uses_aligned(cell.case.crafted)
        else None
    )
    return _expected(cell, config, cpu, aligned, gpu_arch, rules)


def aligned_size(
    cell: Cell, config: dict[str, Any], cpu: isa.Facts | None, gpu_arch: str | None = None
) -> int | None:
    """The size alignment lands on, which a crafted `aligned` entry stands for."""
    return _expected(cell, config, cpu, None, gpu_arch).block_size


def cell_rules(cell: Cell) -> versions.Rules:
    """The rules of the release the cell's platform installs (matrix.yaml's `vllm`)."""
    release = versions.source_version(cell.platform_spec.vllm)
    if release is None:
        raise shapes.ConfigError(
            f"The {cell.platform} platform's vLLM ({cell.platform_spec.vllm.describe()})"
            " names no release, so which release's block-size rules apply is unknown; pin"
            " a version (or a git tag like v0.33.0) in matrix.yaml."
        )
    return versions.rules(cell.platform, release)


def checkpoint_for(
    family: Family,
    config: dict[str, Any],
    rules: versions.Rules,
    *,
    align_mode: bool,
    gpu_arch: str | None,
) -> int | None:
    """The prefill-checkpoint alignment phase 2 takes the LCM with, or None: only in
    align mode, only from the release that has the term, only for GDN layers on
    FlashInfer's prefill (kvrig.rules.choices.flashinfer_gdn_prefill)."""
    if family != Family.GDN or not align_mode or not rules.checkpoint_term:
        return None
    flashinfer = choices.flashinfer_gdn_prefill(shapes.shapes(config), rules.platform, gpu_arch)
    if flashinfer is None:
        raise shapes.ConfigError(
            "With prefix caching on (mamba_cache_mode align), a GDN model's size on CUDA"
            f" at vLLM {versions.shown(rules.version)} depends on the GPU: FlashInfer's GDN"
            " prefill (SM90, or SM10.x/SM12.x with head_k_dim 128) adds a 64-token"
            " checkpoint alignment. The GPU's compute capability is unknown; give it"
            " (--gpu-arch, or a record whose host facts carry it)."
        )
    return GDN_CHECKPOINT if flashinfer else None


def _expected(
    cell: Cell,
    config: dict[str, Any],
    cpu: isa.Facts | None,
    aligned: int | None,
    gpu_arch: str | None,
    rules: versions.Rules | None = None,
) -> Expected:
    rules = rules or cell_rules(cell)
    knobs = cell.case.knobs
    family = cell.model.family
    avx512_bf16 = bool(cpu and cpu.resets_ssm_to_float32)
    head = None if family in MLA_FAMILIES else shapes.shapes(config).head_size
    refusal = refusals.refusal(replace(asked(cell, rules), head_size=head))
    if refusal is not None:
        return Expected(None, steps=[refusal], unsupported=refusal)
    if cell.platform == "cpu" and family == Family.MLA:
        return with_core_blocks(cell, cpu_mla(cell, cpu, rules), [], rules)
    page = None
    checkpoint = None
    if family in HYBRID_FAMILIES:
        spec = knobs.speculative_config
        page = pages(
            config,
            family,
            model_dtype=cell.model.dtype,
            kv_cache_dtype=knobs.kv_cache_dtype,
            ssm_knob=knobs.mamba_ssm_cache_dtype,
            platform=cell.platform,
            avx512_bf16=avx512_bf16,
            rules=rules,
            tp=knobs.tensor_parallel_size or 1,
            num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
            conv_knob=knobs.mamba_cache_dtype,
        )
        checkpoint = checkpoint_for(
            family, config, rules, align_mode=align_mode(cell), gpu_arch=gpu_arch
        )

    def stage(layers: Sequence[int] | None) -> Expected:
        return decide(
            layer_backends(cell, config, aligned, rules, layers),
            rules,
            user_block_size=knobs.block_size,
            page=page,
            checkpoint=checkpoint,
            gdn=family == Family.GDN,
            skip=skip_pages(cell, config, rules),
            mla=family in MLA_FAMILIES,
        )

    if family == Family.MAMBA:  # nothing to choose a size for, nothing to align
        return with_core_blocks(cell, unaligned_stage(cell, rules, None), [], rules)
    split = pipeline_stages(cell.case.knobs.pipeline_parallel_size, config)
    if split is None:
        return held(cell, with_core_blocks(cell, stage(None), [], rules), rules)
    own = [set(attention_layers(config, family)) & set(layers) for layers in split]
    names = [
        frozenset(b.name for b in layer_backends(cell, config, aligned, rules, sorted(layers)))
        if layers
        else frozenset()
        for layers in own
    ]
    disagree = refusals.layouts_disagree(names, rules.kv_layouts_merged)
    if disagree is not None:
        why = f"{disagree}: the stages' backends {[sorted(n) for n in names]} ({rules.label})"
        return Expected(None, steps=[why], unsupported=disagree)
    decided = [
        stage(sorted(layers)) if layers else unaligned_stage(cell, rules, i)
        for i, layers in enumerate(own)
    ]
    return with_core_blocks(cell, _first_failing(decided), decided, rules)


def cpu_mla(cell: Cell, cpu: isa.Facts | None, rules: versions.Rules) -> Expected:
    """CpuPlatform's MLA (check_and_update_config, get_attn_backend_cls): AMX_MLA where the
    class has AMX, at the user's size or the CPU's 128; else the reference CPU_MLA, whose
    decode kernel is built for 16 only, so the block is 16 whatever the user asked."""
    if cpu is not None and cpu.amx:
        size = cell.case.knobs.block_size or rules.start
        return Expected(size, steps=[f"rules {rules.label}; backends AMX_MLA", f"start {size}"])
    steps = [
        f"rules {rules.label}; backends CPU_MLA",
        "the reference CPU MLA kernel runs 16 only: the block is 16, the user's overridden",
    ]
    return Expected(16, steps=steps)


def align_mode(cell: Cell) -> bool:
    """mamba_cache_mode "align": prefix caching on, which a hybrid's state then follows
    block by block. It is vLLM's default except for an attention-free model
    (ModelConfig.is_prefix_caching_supported)."""
    knob = cell.case.knobs.enable_prefix_caching
    return knob if knob is not None else cell.model.family != Family.MAMBA


def context(cell: Cell) -> int:
    """The context the cell's engine serves: its own, or a shorter drafter's."""
    spec = cell.case.knobs.speculative_config
    if spec is None:
        return cell.max_model_len
    return served_context(cell.max_model_len, spec.method, spec.max_model_len)


def asked(cell: Cell, rules: versions.Rules | None = None) -> refusals.Asked:
    """The cell's settings under a release's rules, as vLLM's refusals read them
    (kvrig.rules.refusals)."""
    knobs = cell.case.knobs
    release = rules.version if rules is not None else None
    return refusals.Asked(
        platform=cell.platform,
        family=cell.model.family,
        align=align_mode(cell),
        max_model_len=context(cell),
        block_size=knobs.block_size,
        mamba_block_size=knobs.mamba_block_size,
        chunked_prefill=knobs.enable_chunked_prefill,
        hybrid_kv_cache_manager=not knobs.disable_hybrid_kv_cache_manager,
        kv_cache_dtype=knobs.kv_cache_dtype,
        skip_layers=bool(knobs.kv_cache_dtype_skip_layers),
        decode_context_parallel=knobs.decode_context_parallel_size or 1,
        aiter=rocm.aiter_mla_prefill(cell.gpu_arch or rocm.DEFAULT_ARCH, rocm.aiter_of(cell.env)),
        release=release,
        attention_backend=knobs.attention_backend,
        gpu_major=(
            choices.compute_capability(cell.gpu_arch)[0]
            if cell.platform == "cuda" and cell.gpu_arch
            else None
        ),
        chunked_mm_input=not knobs.disable_chunked_mm_input,
        prefix_match_unit=knobs.prefix_match_unit,
        one_group=(
            cell.model.family not in HYBRID_FAMILIES | {Family.MAMBA}
            and not knobs.kv_cache_dtype_skip_layers
            and knobs.speculative_config is None
        ),
        prefix_caching=knobs.enable_prefix_caching is not False,
        cp_interleave=knobs.cp_kv_cache_interleave_size or 1,
        draft_lowered=context(cell) < cell.max_model_len,
        draft_context_first=rules.draft_context_first if rules is not None else True,
    )


def held(cell: Cell, exp: Expected, rules: versions.Rules) -> Expected:
    """The sized block held to what vLLM checks of it after sizing (refusals.after_sizing)."""
    if exp.block_size is None or exp.rejecting or exp.phase1_error:
        return exp
    refusal = refusals.after_sizing(asked(cell, rules), exp.block_size)
    if refusal is not None:
        exp.steps.append(refusal)
        exp.unsupported = refusal
    return exp


def pipeline_stages(pp: int | None, config: dict[str, Any]) -> list[range] | None:
    """The layers of each of `pp` pipeline stages, or None without pipeline parallelism."""
    pp = pp or 1
    return pipeline_split(layer_count(config), pp) if pp > 1 else None


def unaligned_stage(cell: Cell, rules: versions.Rules, stage: int | None) -> Expected:
    """A worker whose layers hold no attention (an attention-free model, or a pipeline
    stage of state layers only): update_block_size_for_backend finds no non-SSM backend
    and returns before phase 1, so it keeps the configured block (the user's, else the
    start) and aligns nothing."""
    size = cell.case.knobs.block_size or rules.start
    who = "the model" if stage is None else f"stage {stage}"
    return Expected(
        size,
        steps=[
            f"{who} holds no attention layer: update_block_size_for_backend returns before"
            f" phase 1, the block stays {size}, unaligned"
        ],
    )


def _first_failing(decided: Sequence[Expected]) -> Expected:
    """The outcome of an engine whose stages decided apart: the first stage that fails
    (its error stops the engine), else stage 0's, each stage's size and steps beside it."""
    failing = [e for e in decided if e.rejecting or e.phase1_error or e.block_size is None]
    first = replace(failing[0] if failing else decided[0])
    first.steps = [f"stage {i}: {e.explain()}" for i, e in enumerate(decided)]
    first.stage_block_sizes = tuple(e.block_size or 0 for e in decided)
    return first


def with_core_blocks(
    cell: Cell, exp: Expected, stages: Sequence[Expected], rules: versions.Rules
) -> Expected:
    """The expected outcome with the state group's block and the engine core's, over
    every stage's groups."""
    if exp.block_size is None or exp.rejecting or exp.phase1_error:
        return exp
    blocks = [e.block_size for e in (stages or [exp]) if e.block_size is not None]
    configured = cell.case.knobs.block_size or versions.DEFAULT_START.at(rules.version)
    exp.mamba_block_size, exp.engine_block_size = core_blocks(
        cell.model.family,
        blocks,
        align=align_mode(cell),
        max_model_len=context(cell),
        configured=configured,  # type: ignore[arg-type]
    )
    if exp.engine_block_size != exp.block_size:
        exp.steps.append(f"engine core: the smallest group block, {exp.engine_block_size}")
    return exp


def skip_pages(cell: Cell, config: dict[str, Any], rules: versions.Rules) -> tuple[int, int] | None:
    """(primary, padded) bytes per token of phase 3 for a cell (skip_page_sizes)."""
    knobs = cell.case.knobs
    if not knobs.kv_cache_dtype_skip_layers or rules.platform == "cpu":
        return None
    return skip_page_sizes(
        config,
        cell.model.family,
        model_dtype=cell.model.dtype,
        kv_cache_dtype=knobs.kv_cache_dtype,
        tp=knobs.tensor_parallel_size or 1,
    )


def skip_page_sizes(
    config: dict[str, Any], family: Family, *, model_dtype: str, kv_cache_dtype: str | None, tp: int
) -> tuple[int, int]:
    """(primary, padded) bytes per token of phase 3, when some layers keep the model dtype
    beside a quantized KV cache: Platform._align_heterogeneous_kv_block_size builds a
    FullAttentionSpec (K and V, one rank's KV heads; one "head" of the latent width for
    MLA) at each dtype. CpuPlatform runs no phase 3."""
    quantized = kv_dtype(model_dtype, kv_cache_dtype)
    if family in MLA_FAMILIES:
        cfg = text_config(config)
        width = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
        return 2 * width * shapes.dtype_bytes(quantized), 2 * width * shapes.dtype_bytes(
            model_dtype
        )
    s = shapes.shapes(config, tp=tp)
    return (
        shapes.attention_page_per_token(s, quantized),
        shapes.attention_page_per_token(s, model_dtype),
    )


def decide(
    backends: Sequence[Backend],
    rules: versions.Rules,
    *,
    user_block_size: int | None,
    page: Pages | None,
    checkpoint: int | None = None,
    gdn: bool = False,
    skip: tuple[int, int] | None = None,
    mla: bool = False,
) -> Expected:
    """update_block_size_for_backend's steps, for the cells and for `kvrig predict`:
    phase 1 (or the start size, or the user's), phase 2 for a hybrid (`page` given),
    phase 3 for a quantized KV cache beside skip layers (`skip`: the primary and padded
    bytes per token), the early check, XPU's GDN rounding and its check."""
    steps: list[str] = [f"rules {rules.label}; backends {', '.join(b.name for b in backends)}"]
    log: list[str] = []
    start = _start_size(backends, rules, user_block_size, steps)
    if start is None:
        return Expected(None, phase1_error=True, steps=steps)
    size, padded = start, None
    if page is not None and page.mamba:
        size, padded = _phase2(size, backends, page, checkpoint, steps, log, mla)
    unified = None
    if skip is not None:
        size, padded = _phase3(size, backends, skip, padded, steps, log)
        if padded is not None and skip[1] > skip[0]:
            unified = size * skip[1]
            steps.append(f"the engine core pads every page to the skip layers' {unified} B")
    rejecting = _check(size, start, backends)
    if rejecting:
        steps.append(f"{size} rejected by {', '.join(rejecting)}")
    elif gdn and rules.platform == "xpu":
        size, padded, rejecting = _xpu_gdn_round(size, padded, backends, rules, page, steps, log)
    return Expected(
        size, rejecting, steps=steps, page=page, padded=padded, unified=unified, log=log
    )


def _start_size(
    backends: Sequence[Backend], rules: versions.Rules, user: int | None, steps: list[str]
) -> int | None:
    """The size the alignment starts from: the user's, phase 1's (None when no size is
    accepted by every backend) or the release's fixed start."""
    if user is not None:
        steps.append(f"user block size {user}")
        return user
    if not rules.phase1:
        steps.append(f"start {rules.start}")
        return rules.start
    chosen = phase1(backends, rules.start)
    steps.append(
        "phase 1: no size every backend accepts" if chosen is None else f"phase 1 picks {chosen}"
    )
    return chosen


def _phase2(
    size: int,
    backends: Sequence[Backend],
    page: Pages,
    checkpoint: int | None,
    steps: list[str],
    log: list[str],
    mla: bool = False,
) -> tuple[int, int]:
    """The hybrid alignment (_align_hybrid_block_size): the attention size grows until its
    page holds a mamba state page, which then pads to the attention page; the lines vLLM
    logs for either go to `log`. (size, padded mamba page)."""
    k = kernel_step(size, backends, use_mla=mla, checkpoint=checkpoint)
    aligned = align_hybrid(size, backends, page, use_mla=mla, checkpoint=checkpoint)
    padded = aligned * page.attention_per_token
    term = f", K = lcm with the {checkpoint}-token checkpoint" if checkpoint else ""
    steps.append(
        f"attention {page.attention_per_token} B/token, state {page.mamba} B"
        f" ({page.ssm_dtype} SSM{term}): {k} x cdiv({page.mamba}, {k} x"
        f" {page.attention_per_token}), aligned to {aligned}"
    )
    if aligned > size:
        log.append(
            f"Setting attention block size to {aligned} tokens to ensure that attention"
            " page size is >= mamba page size."
        )
    if padded != page.mamba:
        pct = 100 * (padded - page.mamba) / page.mamba
        log.append(
            f"Padding mamba page size by {pct:.2f}% to ensure that mamba page size and"
            " attention page size are exactly equal."
        )
    return aligned, padded


def _xpu_gdn_round(
    size: int,
    padded: int | None,
    backends: Sequence[Backend],
    rules: versions.Rules,
    page: Pages | None,
    steps: list[str],
    log: list[str],
) -> tuple[int, int | None, tuple[str, ...]]:
    """XPU rounds a GDN model's size that passed the early check up to a multiple of
    XPU_GDN_ROUND and checks the rounded size again. (size, padded page, rejecting)."""
    if rules.xpu_gdn_round is None:
        raise shapes.ConfigError(
            f"XPU's GDN rounding at vLLM {versions.shown(rules.version)} is not known to"
            " kvrig (read in 0.32.0 and 0.33.0 only); give one of those releases."
        )
    rounded = XPU_GDN_ROUND * math.ceil(size / XPU_GDN_ROUND)
    if rounded == size:
        return size, padded, ()
    steps.append(f"GDN rounding to {rounded}")
    log.append(
        f"[XPU]Setting attention block size to {rounded} tokens to ensure multiple"
        f" of {XPU_GDN_ROUND}."
    )
    if padded is not None and page is not None:
        padded = rounded * page.attention_per_token
    return rounded, padded, _check(rounded, size, backends)


def _phase3(
    size: int,
    backends: Sequence[Backend],
    skip: tuple[int, int],
    padded: int | None,
    steps: list[str],
    log: list[str],
) -> tuple[int, int | None]:
    """Platform._align_heterogeneous_kv_block_size: the primary block grows (in steps of
    the first backend's smallest kernel block, never below the size so far) until its
    page covers the padded spec's page at that smallest block, or a mamba page already
    padded; the mamba page then pads to the shared page. (size, padded mamba page)."""
    primary, wider = skip
    if wider <= primary:
        steps.append(f"phase 3: the skip layers' page ({wider} B/token) needs no padding")
        return size, padded
    smallest = backends[0].smallest
    step = max(smallest, size)
    required = max(wider * smallest, padded or 0)
    grown = step * math.ceil(required / (step * primary))
    steps.append(
        f"phase 3: {wider} B/token skip pages at {smallest} tokens need {step} x"
        f" cdiv({required}, {step} x {primary}) = {grown}"
    )
    if size < grown:
        size = grown
        log.append(
            f"Setting attention block size to {size} tokens so the quantized primary KV page"
            " covers the higher-precision padded-spec page."
        )
    return size, (size * primary if padded is not None else None)


def _check(size: int, pre: int, backends: Sequence[Backend]) -> tuple[str, ...]:
    """_check_aligned_block_size: only a moved size is checked, against every backend."""
    if size == pre:
        return ()
    return tuple(b.name for b in backends if not b.supports(size))
