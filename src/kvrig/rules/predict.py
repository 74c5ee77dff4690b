"""The block size vLLM picks for a real checkpoint, predicted without vLLM (`kvrig predict`).

Where no engine can run here (CUDA, XPU, ROCm), a maintainer still needs to know what an
engine of some release will choose for a given checkpoint and settings, and to hold that
against what engines logged. This is the verdicts' own computation
(kvrig.rules.blocksize.decide) fed the stock backend of the platform instead of a cell,
so a prediction and a verdict can never disagree about the same inputs.

Pure: a config dict and Settings in, a Prediction (or ConfigError) out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvrig.define.vllm_models import (
    MLA_FAMILIES,
    Family,
    attention_layers,
    layer_count,
    state_layers,
    text_config,
)
from kvrig.define.vllm_names import DRAFT_MODEL_METHODS
from kvrig.facts import backends as facts
from kvrig.facts.platforms import PLATFORMS as FACTS
from kvrig.host import isa
from kvrig.rules import choices, cuda, planning, refusals, rocm, shapes, versions
from kvrig.rules.blocksize import (
    RULES,
    Backend,
    Expected,
    Pages,
    checkpoint_for,
    conv_dtype,
    decide,
    kv_dtype,
    skip_page_sizes,
)

# The stock backends `--backend` can name. ROCm's preferences move with the release, so a
# prediction takes them from rocm.backends at its own release; these are the newest read.
BACKENDS: dict[str, dict[str, Backend]] = {
    **{p: facts.nameable(p, "attention") for p in ("cpu", "cuda", "xpu")},
    "rocm": {
        name: b
        for name, b in rocm.backends(versions.rules("rocm", versions.NEWEST)).items()
        if name in rocm.ATTENTION
    },
}
PLATFORMS = tuple(BACKENDS)
# The backend each platform picks for these models when none is asked for (on ROCm it
# depends on the gfx target and the release: kvrig.rules.rocm.default_backend).
DEFAULT = {p: platform.default_backend for p, platform in FACTS.items() if p != "rocm"}
CACHE_MODES = ("align", "none")


@dataclass(frozen=True)
class Settings:
    """The engine arguments (and the hardware facts) the size depends on."""

    platform: str
    vllm: str
    backend: str | None = None
    tp: int = 1
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    block_size: int | None = None
    prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    num_speculative_tokens: int = 0
    gpu_arch: str | None = None
    isa: str | None = None  # the CPU class (kvrig.host.isa), on CPU
    # On ROCm: VLLM_ROCM_USE_AITER=1 with AMD's aiter installed (vLLM's ROCm image has it)
    aiter: bool = False
    pp: int = 1
    # The context a deployment serves (default: the config's max_position_embeddings, as
    # vLLM derives it).
    max_model_len: int | None = None
    mamba_block_size: int | None = None
    mamba_cache_dtype: str | None = None
    kv_cache_dtype_skip_layers: tuple[str, ...] = ()
    # --speculative-config's method and its drafter's context (its max_model_len): a
    # drafter of its own served shorter lowers the deployment's context.
    speculative_method: str | None = None
    draft_max_model_len: int | None = None
    # What vLLM checks of the configuration or of the sized block rather than sizes with
    # (kvrig.rules.refusals): a setting it refuses is answered with its refusal.
    enable_chunked_prefill: bool | None = None
    disable_hybrid_kv_cache_manager: bool = False
    decode_context_parallel_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    prefix_match_unit: int | None = None
    disable_chunked_mm_input: bool = False


@dataclass(frozen=True)
class Prediction:
    """What the engine will choose, and the steps and log lines that lead there."""

    block_size: int
    attention_page_bytes_per_token: int
    mamba_page_bytes: int
    padded_mamba_page_bytes: int | None
    padding_pct: float
    rules: str
    backend: str
    ssm_dtype: str | None
    mamba_cache_mode: str
    steps: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    # Without --gpu-arch where the GPU decides: the size on the GPUs where vLLM picks
    # FlashInfer's GDN prefill (the main answer is Triton's).
    flashinfer_block_size: int | None = None
    # What the engine core plans (kvrig.rules.planning): its block, the state group's,
    # each pipeline stage's worker block, the context, and its KV-cache groups.
    engine_block_size: int | None = None
    mamba_block_size: int | None = None
    stage_block_sizes: tuple[int, ...] = ()
    max_model_len: int | None = None
    kv_cache_groups: int = 0
    prefix_caching: bool = True
    warnings: list[str] = field(default_factory=list)

    @property
    def cacheable_prefix(self) -> int | None:
        """The shortest prefix a later request can reuse: one whole block of the engine
        core's (prefix caching matches whole blocks); None without prefix caching."""
        return self.engine_block_size if self.prefix_caching else None

    @property
    def pinned_tokens(self) -> int | None:
        """The KV cache one request holds at least: a block of every group."""
        if self.engine_block_size is None:
            return None
        return self.kv_cache_groups * self.engine_block_size

    def as_json(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "attention_page_bytes_per_token": self.attention_page_bytes_per_token,
            "mamba_page_bytes": self.mamba_page_bytes,
            "padded_mamba_page_bytes": self.padded_mamba_page_bytes,
            "padding_pct": round(self.padding_pct, 4),
            "rule_version": self.rules,
            "backend": self.backend,
            "ssm_dtype": self.ssm_dtype,
            "mamba_cache_mode": self.mamba_cache_mode,
            "vllm_log": self.log,
            "steps": [f"{k}: {v}" for k, v in self.steps],
            "flashinfer_gdn_prefill_block_size": self.flashinfer_block_size,
            "engine_block_size": self.engine_block_size,
            "mamba_block_size": self.mamba_block_size,
            "stage_block_sizes": list(self.stage_block_sizes),
            "max_model_len": self.max_model_len,
            "kv_cache_groups": self.kv_cache_groups,
            "cacheable_prefix_tokens": self.cacheable_prefix,
            "pinned_tokens_per_request": self.pinned_tokens,
            "warnings": self.warnings,
        }


def backend(settings: Settings, family: Family | None = None) -> Backend:
    """The attention backend: the one asked for, else the platform's default (on CUDA
    per compute capability and KV-cache dtype, kvrig.rules.cuda; an MLA one for latent
    layers)."""
    known = BACKENDS.get(settings.platform)
    if known is None:
        raise shapes.ConfigError(
            f"Unknown platform {settings.platform!r}; kvrig predicts for {', '.join(PLATFORMS)}."
        )
    if family in MLA_FAMILIES and settings.backend is None:
        return _mla_backend(settings)
    turboquant = (settings.kv_cache_dtype or "").startswith("turboquant_")
    if turboquant and settings.backend is None and settings.platform != "cpu":
        return cuda.TURBOQUANT  # the one backend that takes its caches
    if settings.platform == "rocm":
        return _rocm_backend(settings)
    name = settings.backend
    if name is None and settings.platform == "cuda":
        name = cuda.default_backend(settings.gpu_arch, settings.kv_cache_dtype).name
    if name is None:
        name = DEFAULT[settings.platform]
    if name.upper() not in known:
        raise shapes.ConfigError(
            f"Unknown attention backend {name!r} for {settings.platform}; kvrig knows"
            f" {', '.join(known)} there (CPU always uses CPU_ATTN for these models)."
        )
    return known[name.upper()]


def _mla_backend(settings: Settings) -> Backend:
    """The dense MLA backend the platform's selector gives latent layers."""
    if settings.platform == "cuda":
        return cuda.mla_backend(settings.gpu_arch, settings.block_size)
    mla = RULES[settings.platform].dense_mla if settings.platform in RULES else None
    if mla is None:
        raise shapes.ConfigError(
            f"kvrig restates no dense MLA backend on {settings.platform}: on ROCm vLLM finds"
            " no MLA prefill backend without AMD's aiter, and on CPU CPU_MLA's choice is not"
            " restated. Predict for cuda or xpu."
        )
    return mla


def _rocm_backend(settings: Settings) -> Backend:
    """ROCm's backend at the settings' release: the one named, else the one the selector
    puts first on the gfx target (the Instinct boards' when none is given)."""
    rules = versions.rules("rocm", settings.vllm)
    name = settings.backend
    if name is None:
        name = rocm.default_backend(
            settings.gpu_arch or rocm.DEFAULT_ARCH,
            rules,
            aiter=_aiter(settings),
            kv_cache_dtype=settings.kv_cache_dtype,
        )
    if name.upper() not in rocm.ATTENTION:
        raise shapes.ConfigError(
            f"Unknown attention backend {name!r} for rocm; kvrig knows"
            f" {', '.join(rocm.ATTENTION)} there (ROCM_AITER_FA logs itself as FLASH_ATTN)."
        )
    return rocm.backends(rules)[name.upper()]


def _asked(
    settings: Settings,
    s: shapes.Shapes,
    rules: versions.Rules,
    *,
    align: bool,
    max_len: int | None,
    own_len: int | None,
) -> refusals.Asked:
    """The settings as vLLM's refusals read them (kvrig.rules.refusals), as a cell's are;
    `own_len` is the context before a drafter lowered it to `max_len`."""
    arch = settings.gpu_arch
    return refusals.Asked(
        platform=settings.platform,
        family=s.family,
        align=align,
        max_model_len=max_len or 0,
        block_size=settings.block_size,
        mamba_block_size=settings.mamba_block_size,
        chunked_prefill=settings.enable_chunked_prefill,
        hybrid_kv_cache_manager=not settings.disable_hybrid_kv_cache_manager,
        kv_cache_dtype=settings.kv_cache_dtype,
        skip_layers=bool(settings.kv_cache_dtype_skip_layers),
        decode_context_parallel=settings.decode_context_parallel_size,
        aiter=rocm.aiter_mla_prefill(arch or rocm.DEFAULT_ARCH, _aiter(settings)),
        release=rules.version,
        attention_backend=settings.backend and settings.backend.upper(),
        gpu_major=(
            choices.compute_capability(arch)[0] if settings.platform == "cuda" and arch else None
        ),
        head_size=None if s.family in MLA_FAMILIES else s.head_size,
        chunked_mm_input=not settings.disable_chunked_mm_input,
        prefix_match_unit=settings.prefix_match_unit,
        one_group=(
            s.family not in planning.STATE_FAMILIES
            and not settings.kv_cache_dtype_skip_layers
            and not settings.num_speculative_tokens
        ),
        prefix_caching=settings.prefix_caching is not False,
        cp_interleave=settings.cp_kv_cache_interleave_size,
        draft_lowered=max_len is not None and own_len is not None and max_len < own_len,
        draft_context_first=rules.draft_context_first,
    )


def _aiter(settings: Settings) -> rocm.Aiter:
    return rocm.Aiter(found=True, enabled=True) if settings.aiter else rocm.NO_AITER


def cache_mode(settings: Settings, rules: versions.Rules, family: Family) -> tuple[str, str]:
    """(mamba_cache_mode, why): "align" with prefix caching (vLLM's default for these
    hybrids), "none" without."""
    if settings.mamba_cache_mode is not None:
        if settings.mamba_cache_mode not in CACHE_MODES:
            raise shapes.ConfigError(
                f"mamba_cache_mode {settings.mamba_cache_mode!r} is not restated by kvrig;"
                f" it knows {', '.join(CACHE_MODES)}."
            )
        mode, why = settings.mamba_cache_mode, "as asked"
    elif settings.prefix_caching is False:
        mode, why = "none", "prefix caching off"
    else:
        mode = "align"
        why = "prefix caching on" + (" (vLLM's default)" if settings.prefix_caching is None else "")
    if mode == "align" and rules.plain_align_mode(family) is None:
        # The matrix's loader refuses such a pin in the same words; the size without
        # prefix caching reads no unknown rule, so it stays an answer.
        align = versions.PLAIN_ALIGN_GDN if family == Family.GDN else versions.PLAIN_ALIGN_MAMBA2
        unknown = versions.not_known(settings.platform, versions.shown(rules.version), (align,))
        raise shapes.ConfigError(
            f"{unknown}; a {family} model's size rests on it with {why}: earlier releases"
            " aligned a prefix-cached Mamba block to the SSD chunk size"
            " (HybridAttentionMambaModelConfig), which kvrig does not restate. Predict with"
            " --no-prefix-caching, or for a release they know"
            f" ({versions.known_text(settings.platform)})."
        )
    return mode, why


# Compute capabilities standing for each GDN prefill kernel when the GPU is not given.
TRITON_GPU, FLASHINFER_GPU = "8.0", "9.0"


_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number"}


def check_input(config: object, settings: Settings) -> None:
    """Refuses, in one paragraph each, what no engine starts with, or no rule of kvrig's
    answers, before any shape is read: a config.json that is not one JSON object, then
    the settings (check_settings)."""
    if not isinstance(config, dict):
        kind = "null" if config is None else _JSON_KINDS.get(type(config), type(config).__name__)
        raise shapes.ConfigError(
            f"The config is {kind}, not a JSON object: a checkpoint's config.json is one"
            " object of fields (architectures, num_key_value_heads, ...). Pass the"
            " checkpoint's config.json or its folder."
        )
    check_settings(settings)


def check_settings(settings: Settings) -> None:
    """A user block size of at least one token, dtypes vLLM's options take, and a GPU
    architecture only on CUDA or ROCm, one kvrig keeps rules for."""
    if settings.block_size is not None and settings.block_size < 1:
        raise shapes.ConfigError(
            f"--block-size {settings.block_size} is no block size: a KV-cache block holds a"
            " whole number of tokens, at least 1. Give a positive size, or leave it out for"
            " the size vLLM chooses."
        )
    for option, value in (
        ("--dtype", settings.dtype),
        ("--kv-cache-dtype", settings.kv_cache_dtype),
        ("--mamba-ssm-cache-dtype", settings.mamba_ssm_cache_dtype),
    ):
        if value is not None:
            shapes.option_dtype(option, value)
    if settings.aiter and settings.platform != "rocm":
        raise shapes.ConfigError(
            f"--aiter switches AMD's AITER on, which only vLLM's ROCm platform reads; kvrig's"
            f" {settings.platform} rules have none. Leave it out."
        )
    if settings.gpu_arch is None:
        return
    if settings.platform == "rocm":
        rocm.known_arch(settings.gpu_arch)
        return
    if settings.platform != "cuda":
        raise shapes.ConfigError(
            f"--gpu-arch {settings.gpu_arch} names a CUDA GPU's compute capability or a ROCm"
            f" gfx target, and kvrig's {settings.platform} rules read none; leave it out."
        )
    choices.known_gpu_arch(settings.gpu_arch)


def _no_attention(config: dict[str, Any], s: shapes.Shapes, settings: Settings) -> str | None:
    """Why there is no aligned size to predict, for a hybrid that states no attention layer
    (vLLM's update_block_size_for_backend returns early: no layer has an attention
    backend, so the block size is left as it is); None when it has one."""
    layers = shapes.attention_layers(text_config(config), s.architecture, s.family)
    if not s.hybrid or layers is None or layers:
        return None
    as_is = (
        f"your --block-size {settings.block_size}"
        if settings.block_size is not None
        else "the size the platform set before"
    )
    return (
        f"The {s.architecture} config states no attention layer (every layer is a"
        " state-space one), so vLLM selects no attention backend for it and returns before"
        f" aligning anything: the block size is left as it is ({as_is}), and there is no"
        " attention page for a block size to fit. kvrig predicts no aligned size for it;"
        " if that is not the model, pass the checkpoint's own config.json."
    )


def predict(config: dict[str, Any], settings: Settings) -> Prediction:
    """The size an engine of `settings.vllm` on `settings.platform` picks for `config`;
    where the GPU decides and is not given, Triton's answer with FlashInfer's beside it."""
    check_input(config, settings)
    try:
        out = _predict(config, settings)
    except GpuDecides:
        pass
    else:
        return _other_targets(config, settings, out) if settings.platform == "rocm" else out
    triton = _predict(config, replace(settings, gpu_arch=TRITON_GPU))
    flashinfer = _predict(config, replace(settings, gpu_arch=FLASHINFER_GPU))
    note = (
        "not given; this prediction is for GPUs whose GDN prefill runs on Triton (before"
        f" SM90, or Blackwell with head_k_dim != 128); {flashinfer.block_size} where vLLM"
        " picks FlashInfer's (SM90; SM10.x/SM12.x with head_k_dim 128). Pass --gpu-arch."
    )
    return replace(
        triton,
        steps=[*triton.steps, ("gpu", note)],
        flashinfer_block_size=flashinfer.block_size,
    )


def _other_targets(config: dict[str, Any], settings: Settings, out: Prediction) -> Prediction:
    """Without --gpu-arch or --backend, ROCm's answer is the Instinct boards'; each gfx
    target whose selector picks another backend is named beside it, with its size."""
    if settings.gpu_arch is not None or settings.backend is not None:
        return out
    rules = versions.rules("rocm", settings.vllm)
    picks = {
        arch: rocm.default_backend(
            arch, rules, aiter=_aiter(settings), kv_cache_dtype=settings.kv_cache_dtype
        )
        for arch in rocm.ARCHS
    }
    alike = [a for a, name in picks.items() if name == picks[rocm.DEFAULT_ARCH]]
    others = [
        f"{name} on {arch} ({rocm.ROCM_GPUS[arch].examples}):"
        f" {_predict(config, replace(settings, gpu_arch=arch)).block_size}"
        for arch, name in picks.items()
        if arch not in alike
    ]
    boards = ", ".join(f"{a} {rocm.ROCM_GPUS[a].examples}" for a in alike)
    note = f"not given; this prediction is for {boards} ({picks[rocm.DEFAULT_ARCH]})" + (
        f"; vLLM {versions.shown(rules.version)} picks {'; '.join(others)}" if others else ""
    )
    return replace(out, steps=[*out.steps, ("gpu", note + ". Pass --gpu-arch.")])


class GpuDecides(Exception):
    """The size depends on the GPU's GDN prefill kernel and no GPU was given."""


def _predict(config: dict[str, Any], settings: Settings) -> Prediction:
    rules = versions.rules(settings.platform, settings.vllm)
    s = shapes.shapes(
        config, tp=settings.tp, num_speculative_tokens=settings.num_speculative_tokens
    )
    dtype = _model_dtype(config, settings)
    if s.family == Family.MAMBA:
        return _attention_free(config, settings, rules, s, dtype)
    early = _no_attention(config, s, settings)
    if early is not None:
        raise shapes.ConfigError(early)
    cuda_arch = settings.gpu_arch if settings.platform == "cuda" else None
    named = refusals.named_invalid(
        settings.platform,
        s.family,
        settings.backend and settings.backend.upper(),
        settings.kv_cache_dtype,
        choices.compute_capability(cuda_arch)[0] if cuda_arch else None,
        s.head_size,
    )
    if named is not None:
        raise shapes.ConfigError(
            f"vLLM refuses --attention-backend {settings.backend} here: {named}. Name"
            " another backend, or leave --attention-backend out."
        )
    chosen = backend(settings, s.family)
    kv = kv_dtype(dtype, settings.kv_cache_dtype)
    kv = kv if kv in shapes.TURBOQUANT_BITS else shapes.dtype_name(kv)
    resets = _cpu_resets(settings, kv)
    mode, why = cache_mode(settings, rules, s.family)
    per_token = shapes.attention_page_per_token(s, kv)
    steps = _shape_steps(s, settings, rules, chosen, kv)
    page, ssm = _state_page(s, settings, rules, dtype, per_token, resets, steps)
    gdn_align = s.family == Family.GDN and mode == "align" and rules.checkpoint_term
    if gdn_align and settings.platform == "cuda" and settings.gpu_arch is None:
        raise GpuDecides
    refused = _selector_refusal(chosen, settings)
    if refused is not None:
        raise shapes.ConfigError(refused)
    max_len = _max_model_len(config, settings)
    _refuse_mamba_block(settings, mode, max_len)
    own = _max_model_len(config, replace(settings, speculative_method=None))
    asked = _asked(settings, s, rules, align=mode == "align", max_len=max_len, own_len=own)
    refused = refusals.refusal(asked)
    if refused is not None:
        raise shapes.ConfigError(
            f"vLLM refuses these settings before it sizes a block: {refused}. kvrig predicts"
            " no size for an engine that does not start."
        )
    checkpoint = checkpoint_for(
        s.family, config, rules, align_mode=mode == "align", gpu_arch=settings.gpu_arch
    )
    steps.append(("cache mode", f"{mode} ({why})" + _checkpoint_note(s, rules, mode, checkpoint)))
    skip = _skip(config, s, settings, dtype)

    def stage(has_attention: bool) -> Expected:
        if not has_attention:
            return _unaligned(settings, rules)
        return decide(
            [chosen],
            rules,
            user_block_size=settings.block_size,
            page=page,
            checkpoint=checkpoint,
            gdn=s.family == Family.GDN,
            skip=skip,
            mla=s.family in MLA_FAMILIES,
        )

    decided = [stage(has) for has in _stage_attention(config, s, settings)]
    out = decided[0]
    assert out.block_size is not None  # one stock backend: phase 1 always finds a size
    refused = _engine_refusal(out.block_size, out.rejecting, chosen) or refusals.after_sizing(
        asked, out.block_size
    )
    if refused is not None:
        raise shapes.ConfigError(refused)
    steps += [("step", line) for line in out.steps[1:]]
    return _planned(
        config,
        settings,
        s,
        decided,
        align=mode == "align",
        max_len=max_len,
        base=Prediction(
            block_size=out.block_size,
            attention_page_bytes_per_token=per_token,
            mamba_page_bytes=page.mamba if page else 0,
            padded_mamba_page_bytes=out.padded,
            padding_pct=out.padding_pct,
            rules=rules.label,
            backend=chosen.name,
            ssm_dtype=ssm,
            mamba_cache_mode=mode,
            steps=steps,
            log=out.log,
        ),
    )


def _model_dtype(config: dict[str, Any], settings: Settings) -> str:
    given = settings.dtype if settings.dtype not in (None, "auto") else None
    dtype = shapes.dtype_name(given) if given else shapes.model_dtype(config)
    if dtype is None:
        raise shapes.ConfigError(
            "The config names no dtype (dtype or torch_dtype), so the KV and state dtypes"
            " are unknown; pass --dtype."
        )
    return dtype


def _state_page(
    s: shapes.Shapes,
    settings: Settings,
    rules: versions.Rules,
    dtype: str,
    per_token: int,
    resets: bool,
    steps: list[tuple[str, str]],
) -> tuple[Pages | None, str | None]:
    """A hybrid's pages: the conv state in --mamba-cache-dtype's dtype, the SSM state in
    the dtype vLLM settles on (kvrig.rules.choices)."""
    if not s.hybrid:
        return None, None
    conv = conv_dtype(dtype, settings.mamba_cache_dtype)
    ssm = choices.ssm_dtype(
        s.architecture,
        s.config_ssm_dtype,
        conv,
        settings.mamba_ssm_cache_dtype,
        rules,
        cpu_resets_to_float32=resets,
    )
    page = Pages(per_token, shapes.mamba_page(s, conv, ssm), ssm)
    steps.append(("state", _state_text(s, conv, ssm, page.mamba)))
    return page, ssm


def _max_model_len(config: dict[str, Any], settings: Settings) -> int | None:
    """--max-model-len, else the config's positions, as vLLM derives it; a shorter
    drafter of its own lowers it."""
    if settings.max_model_len is not None:
        if settings.max_model_len < 1:
            raise shapes.ConfigError(
                f"--max-model-len {settings.max_model_len} is no context length; give a"
                " positive number of tokens, or leave it out for the config's."
            )
        return _served(settings.max_model_len, settings)
    longest = text_config(config).get("max_position_embeddings")
    if not isinstance(longest, int) or longest < 1:
        return None
    return _served(longest, settings)


def _served(target: int, settings: Settings) -> int:
    """The target's context as a drafter's leaves it; vLLM refuses a drafter checkpoint
    served longer than its target."""
    draft = settings.draft_max_model_len
    if draft is not None and settings.speculative_method in DRAFT_MODEL_METHODS and draft > target:
        raise shapes.ConfigError(
            f"the drafter's max_model_len ({draft}) is longer than the target's ({target}),"
            " which vLLM refuses; give the drafter at most the target's context."
        )
    return planning.served_context(target, settings.speculative_method, draft)


def _refuse_mamba_block(settings: Settings, mode: str, max_len: int | None) -> None:
    if planning.mamba_block_refused(settings.mamba_block_size, mode == "align", max_len or 0):
        raise shapes.ConfigError(
            f"vLLM refuses --mamba-block-size {settings.mamba_block_size} without prefix"
            f" caching before any engine starts ({planning.MAMBA_BLOCK_REFUSED}). Turn prefix"
            " caching on, or leave --mamba-block-size out."
        )


def _skip(
    config: dict[str, Any], s: shapes.Shapes, settings: Settings, dtype: str
) -> tuple[int, int] | None:
    """Phase 3's pages, when layers are kept at the model dtype beside a quantized cache
    (CpuPlatform runs no phase 3)."""
    if not settings.kv_cache_dtype_skip_layers or settings.platform == "cpu":
        return None
    return skip_page_sizes(
        config, s.family, model_dtype=dtype, kv_cache_dtype=settings.kv_cache_dtype, tp=settings.tp
    )


def _stage_attention(config: dict[str, Any], s: shapes.Shapes, settings: Settings) -> list[bool]:
    """Whether each pipeline stage's layers hold an attention layer (one stage without
    pipeline parallelism)."""
    if settings.pp == 1:
        return [True]
    if settings.pp < 1 or settings.pp > layer_count(config):
        raise shapes.ConfigError(
            f"--pp {settings.pp}: vLLM gives each pipeline stage at least one layer, and the"
            f" config has {layer_count(config)}. Give between 1 and that many stages."
        )
    own = set(attention_layers(config, s.family))
    return [
        bool(own & set(stage))
        for stage in planning.pipeline_split(layer_count(config), settings.pp)
    ]


def _unaligned(settings: Settings, rules: versions.Rules) -> Expected:
    size = settings.block_size or rules.start
    return Expected(size, steps=[f"no attention layer: the block stays {size}, unaligned"])


def _attention_free(
    config: dict[str, Any],
    settings: Settings,
    rules: versions.Rules,
    s: shapes.Shapes,
    dtype: str,
) -> Prediction:
    """An attention-free model: update_block_size_for_backend finds no attention backend
    and returns, and prefix caching is off unless asked for (is_prefix_caching_supported)."""
    align = bool(settings.prefix_caching)
    max_len = _max_model_len(config, settings)
    settings_mode = "align" if align else "none"
    _refuse_mamba_block(settings, settings_mode, max_len)
    block = settings.block_size or rules.start
    ssm = choices.ssm_dtype(
        s.architecture,
        None,
        conv_dtype(dtype, settings.mamba_cache_dtype),
        settings.mamba_ssm_cache_dtype,
        rules,
    )
    mamba = shapes.mamba_page(s, conv_dtype(dtype, settings.mamba_cache_dtype), ssm)
    steps = [
        ("model", f"{s.architecture} ({s.family}): no attention layer"),
        ("rules", rules.label),
        ("state", _state_text(s, conv_dtype(dtype, settings.mamba_cache_dtype), ssm, mamba)),
        ("step", f"no attention backend: the block stays {block}, nothing aligned"),
    ]
    return _planned(
        config,
        settings,
        s,
        [Expected(block)],
        align=align,
        max_len=max_len,
        base=Prediction(
            block_size=block,
            attention_page_bytes_per_token=0,
            mamba_page_bytes=mamba,
            padded_mamba_page_bytes=None,
            padding_pct=0.0,
            rules=rules.label,
            backend="none",
            ssm_dtype=ssm,
            mamba_cache_mode=settings_mode,
            steps=steps,
        ),
    )


def _planned(
    config: dict[str, Any],
    settings: Settings,
    s: shapes.Shapes,
    decided: list[Expected],
    *,
    align: bool,
    max_len: int | None,
    base: Prediction,
) -> Prediction:
    """The prediction with what the engine core plans, and the warnings a deployment
    needs: a block longer than the context, an unaligned stage, a replaced
    --mamba-block-size."""
    blocks = [e.block_size or 0 for e in decided]
    mamba, core = (None, None)
    configured = settings.block_size or versions.DEFAULT_START.at(versions.parse(settings.vllm))
    if max_len is not None or align or s.family not in planning.STATE_FAMILIES:
        mamba, core = planning.core_blocks(
            s.family,
            blocks,
            align=align,
            max_model_len=max_len or 0,
            configured=configured,  # type: ignore[arg-type]
        )
    groups = planning.group_count(
        len(attention_layers(config, s.family)), state_layers(config, s.family)
    )
    prefix = align if s.family in planning.STATE_FAMILIES else settings.prefix_caching is not False
    out = replace(
        base,
        engine_block_size=core,
        mamba_block_size=mamba,
        stage_block_sizes=tuple(blocks) if len(blocks) > 1 else (),
        max_model_len=max_len,
        kv_cache_groups=groups,
        prefix_caching=prefix,
    )
    return replace(out, warnings=_warnings(out, settings, blocks))


def _warnings(out: Prediction, settings: Settings, blocks: list[int]) -> list[str]:
    said = []
    core, max_len = out.engine_block_size, out.max_model_len
    if out.prefix_caching and core is not None and max_len is not None and core > max_len:
        said.append(
            f"the block ({core} tokens) is longer than max_model_len ({max_len}): no request"
            " fills a block, so prefix caching never hits, and vLLM says nothing of it"
            " (vllm-project/vllm#54504)"
        )
    if len(set(blocks)) > 1:
        said.append(
            f"the pipeline stages size apart ({', '.join(map(str, blocks))}): a stage without"
            " an attention layer leaves its block unaligned, and the engine core takes the"
            f" smallest, {core} (vllm-project/vllm#51752)"
        )
    given = settings.mamba_block_size
    if given is not None and out.mamba_cache_mode == "align" and given != out.mamba_block_size:
        said.append(
            f"vLLM replaces --mamba-block-size {given} with the block size"
            f" {out.mamba_block_size} when prefix caching aligns the state"
            " (vllm-project/vllm#57278)"
        )
    return said


def _selector_refusal(chosen: Backend, settings: Settings) -> str | None:
    """Why CUDA's or ROCm's attention selector finds no backend for a user's --block-size:
    it validates each backend with a size the user gives (selector.py), and every stock
    CUDA or ROCm backend kvrig restates takes multiples of 16 only."""
    size = settings.block_size
    gpu = {"cuda": "CUDA", "rocm": "ROCm"}.get(settings.platform)
    if gpu is None or size is None or chosen.supports(size):
        return None
    return (
        f"vLLM refuses --block-size {size} on {gpu}: its attention selector validates each"
        f" backend with a size the user gives, and {chosen.name} takes {_kernels(chosen)}"
        f" (as every stock {gpu} backend kvrig restates, multiples of 16), so no backend is"
        " valid and no engine starts. Give a multiple of 16, or leave --block-size out."
    )


def _engine_refusal(size: int, rejecting: tuple[str, ...], chosen: Backend) -> str | None:
    """Why the engine stops with the size the steps end on: the early check refuses an
    aligned size the backend does not take, and a user's size that alignment leaves as it
    is but no kernel block size divides stops the KV cache's sizing."""
    if rejecting:
        return (
            "vLLM stops before it sizes the KV cache: ValueError: Aligned KV cache block size"
            f" {size} is not supported by attention backend(s): {', '.join(rejecting)}."
            " kvrig predicts no size for an engine that does not start; leave --block-size"
            " out, or name another --backend."
        )
    if chosen.supports(size):
        return None
    return (
        f"vLLM starts, then stops when it sizes the KV cache: the block size stays {size}"
        f" (your --block-size, which alignment leaves as it is), and {chosen.name} takes"
        f" {_kernels(chosen)}, so no kernel block size divides it (select_common_block_size:"
        f" No common block size for {size}). Give a --block-size {chosen.name} takes, or"
        " leave it out."
    )


def _shape_steps(
    s: shapes.Shapes, settings: Settings, rules: versions.Rules, chosen: Backend, kv: str
) -> list[tuple[str, str]]:
    """The first lines of the explanation: what one rank holds, under which rules."""
    per_token = shapes.attention_page_per_token(s, kv)
    return [
        (
            "model",
            f"{s.architecture} ({s.family}), TP {settings.tp}: {s.kv_heads} KV head(s)"
            f" of {s.head_size} per rank",
        ),
        ("rules", rules.label),
        ("backend", f"{chosen.name} {_kernels(chosen)}"),
        *_selection_step(settings, rules),
        ("attention", _attention_text(s, kv, per_token)),
    ]


def _attention_text(s: shapes.Shapes, kv: str, per_token: int) -> str:
    if kv in shapes.TURBOQUANT_BITS:
        slot = shapes.turboquant_slot(s.head_size, kv)
        return f"{s.kv_heads} x a {slot} B slot of K and V ({kv}) = {per_token} B per token"
    if s.mla_width is not None:
        return (
            f"one latent of {s.mla_width} x {shapes.dtype_bytes(kv)} B ({kv})"
            f" = {per_token} B per token (MLA)"
        )
    return (
        f"2 x {s.kv_heads} x {s.head_size} x {shapes.dtype_bytes(kv)} B ({kv})"
        f" = {per_token} B per token"
    )


def _selection_step(settings: Settings, rules: versions.Rules) -> list[tuple[str, str]]:
    """On ROCm without --backend, why the selector picks the backend it does."""
    if settings.platform != "rocm" or settings.backend is not None:
        return []
    arch = settings.gpu_arch or rocm.DEFAULT_ARCH
    text = rocm.selection_text(arch, rules, _aiter(settings), settings.kv_cache_dtype)
    return [("selector", text)]


def _state_text(s: shapes.Shapes, conv_dtype: str, ssm: str, mamba: int) -> str:
    conv, temporal = " x ".join(map(str, s.conv)), " x ".join(map(str, s.temporal))
    return (
        f"conv {conv} x {shapes.dtype_bytes(conv_dtype)} B ({conv_dtype}) + temporal"
        f" {temporal} x {shapes.dtype_bytes(ssm)} B ({ssm}) = {mamba} B per sequence"
    )


def _cpu_resets(settings: Settings, kv: str) -> bool:
    """Whether the CPU class resets the SSM state to float32; refuses what it refuses."""
    if settings.platform != "cpu":
        return False
    if settings.isa is None:
        raise shapes.ConfigError(
            "On CPU the block size depends on the CPU class (AVX512-BF16 resets the SSM"
            f" state to float32); pass --isa (one of {', '.join(isa.CLASSES)})."
        )
    try:
        facts = isa.facts(settings.isa)
    except isa.IsaError as exc:
        raise shapes.ConfigError(str(exc)) from None
    if "fp8" in kv and not facts.fp8_kv_cache:
        raise shapes.ConfigError(
            f"vLLM refuses this on a {settings.isa} CPU: FP8 KV cache on CPU requires x86"
            " with AVX-512 or AMX."
        )
    return facts.resets_ssm_to_float32


def _kernels(b: Backend) -> str:
    sizes = [f"MultipleOf({k.size})" if k.multiple else str(k.size) for k in b.kernels]
    return f"[{', '.join(sizes)}]"


def _checkpoint_note(
    s: shapes.Shapes, rules: versions.Rules, mode: str, checkpoint: int | None
) -> str:
    if s.family != Family.GDN or mode != "align":
        return ""
    if checkpoint:
        return f"; FlashInfer GDN prefill: {checkpoint}-token checkpoint alignment"
    if not rules.checkpoint_term:
        return f"; no checkpoint term before 0.33.0 (rules {rules.label})"
    return "; GDN prefill on Triton: no checkpoint term"
