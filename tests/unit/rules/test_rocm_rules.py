"""kvrig's ROCm rules held against what vLLM's own ROCm code chose, and against the sizes
real engines logged on MI300X-class GPUs.

SEEN is data, not a computation: each row is one configuration phase of vLLM's
RocmPlatform, run on a CPU host by kvrig's emulated ROCm platform
(kvrig.run.emulation.rocm_platform, with the environment an emulated cell gets) against
the vllm 0.33.0 and 0.34.0 PyPI wheels, on a model with the per-layer shapes of the named
checkpoint (its layer, expert and vocabulary counts cut; no size depends on them). Each
row keeps what vLLM logged or recorded: the engine's block size on every rank, the
attention backend its layers got, the valid backends the selector listed in priority
order ("... out of potential backends: [...]"), and the kernel block the worker chose for
the attention group. The rules must give every one of them; a rule changed without a new
observation fails here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest

from kvrig.define import releases
from kvrig.rules import backend_facts, backends, blocksize, predict, rocm, shapes, versions

from ..checkpoints import GRANITE_4H_SMALL, QWEN35_27B, QWEN35_35B

CHECKPOINTS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3.5-35B-A3B": QWEN35_35B,
    "Qwen/Qwen3.5-27B": QWEN35_27B,
    "ibm-granite/granite-4.0-h-small": GRANITE_4H_SMALL,
}
FOUND = rocm.Aiter(found=True)  # AMD's aiter installed (kvrig's stand-in), AITER off
ON = rocm.Aiter(found=True, enabled=True)  # ... and VLLM_ROCM_USE_AITER=1


@dataclass(frozen=True)
class Seen:
    """One emulated configuration and what vLLM's code chose in it."""

    release: str
    arch: str
    checkpoint: str
    dtype: str
    size: int  # the engine's block size, the same on every rank
    chosen: str  # the attention backend the layers got, by get_name()
    valid: tuple[str, ...] = ()  # the selector's valid backends, in its order (none: named)
    kernel: int | None = None  # the attention group's kernel block (select_common_block_size)
    tp: int = 1
    aiter: rocm.Aiter = rocm.NO_AITER
    backend: str | None = None  # --attention-backend
    prefix_caching: bool = False
    kv_cache_dtype: str | None = None

    @property
    def id(self) -> str:
        parts = [self.release, self.arch, self.checkpoint.split("/")[1], f"tp{self.tp}"]
        parts += [self.aiter.label.replace(" ", "_"), self.backend or "", self.kv_cache_dtype or ""]
        parts.append("prefix" if self.prefix_caching else "")
        return "-".join(p for p in parts if p)


QWEN35 = "Qwen/Qwen3.5-35B-A3B"
QWEN27 = "Qwen/Qwen3.5-27B"
GRANITE = "ibm-granite/granite-4.0-h-small"
ROCM_FIRST = ("ROCM_ATTN", "TRITON_ATTN")
TRITON_FIRST = ("TRITON_ATTN", "ROCM_ATTN")
WITH_AITER = ("ROCM_ATTN", "ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "TRITON_ATTN")
AITER_FOUND = ("ROCM_ATTN", "ROCM_AITER_UNIFIED_ATTN", "TRITON_ATTN")
UNIFIED = "ROCM_AITER_UNIFIED_ATTN"
SEEN = [
    # vLLM 0.34.0 (its phase 1 starts at 64)
    Seen("0.34.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", ROCM_FIRST, 1056),
    Seen("0.34.0", "gfx942", QWEN27, "bfloat16", 784, "ROCM_ATTN", ROCM_FIRST, 784, tp=2),
    Seen("0.34.0", "gfx942", GRANITE, "bfloat16", 528, "ROCM_ATTN", ROCM_FIRST, 528),
    Seen(
        "0.34.0",
        "gfx942",
        GRANITE,
        "bfloat16",
        528,
        "ROCM_ATTN",
        ROCM_FIRST,
        528,
        prefix_caching=True,
    ),
    Seen(
        "0.34.0",
        "gfx942",
        QWEN35,
        "float16",
        1056,
        "ROCM_ATTN",
        ROCM_FIRST,
        1056,
        prefix_caching=True,
    ),
    Seen("0.34.0", "gfx950", QWEN35, "float16", 1056, "ROCM_ATTN", ROCM_FIRST, 1056),
    Seen("0.34.0", "gfx1201", QWEN35, "float16", 1088, "TRITON_ATTN", TRITON_FIRST, 1088),
    Seen("0.34.0", "gfx1201", GRANITE, "bfloat16", 576, "TRITON_ATTN", TRITON_FIRST, 576),
    Seen(
        "0.34.0",
        "gfx1201",
        QWEN35,
        "float16",
        2096,
        "ROCM_ATTN",
        ROCM_FIRST,
        2096,
        kv_cache_dtype="fp8_e5m2",
    ),
    Seen("0.34.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", AITER_FOUND, 1056, aiter=FOUND),
    Seen("0.34.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", WITH_AITER, 1056, aiter=ON),
    Seen("0.34.0", "gfx950", QWEN35, "float16", 1056, "ROCM_ATTN", WITH_AITER, 1056, aiter=ON),
    Seen(
        "0.34.0",
        "gfx1201",
        QWEN35,
        "float16",
        1088,
        UNIFIED,
        (UNIFIED, *TRITON_FIRST),
        1088,
        aiter=ON,
    ),
    # Named, ROCM_AITER_UNIFIED_ATTN's layers need aiter to be built (without it vLLM
    # raised ModuleNotFoundError: No module named 'aiter', rocm_aiter_unified_attn.py).
    Seen(
        "0.34.0", "gfx942", QWEN35, "float16", 1088, UNIFIED, (), 1088, aiter=FOUND, backend=UNIFIED
    ),
    Seen(
        "0.34.0", "gfx942", GRANITE, "bfloat16", 576, UNIFIED, (), 576, aiter=FOUND, backend=UNIFIED
    ),
    # vLLM 0.33.0 (its phase 1 starts at 16; ROCM_ATTN has no preference of its own)
    Seen("0.33.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", ROCM_FIRST, 1056),
    Seen("0.33.0", "gfx942", QWEN27, "bfloat16", 784, "ROCM_ATTN", ROCM_FIRST, 784, tp=2),
    Seen("0.33.0", "gfx942", GRANITE, "bfloat16", 528, "ROCM_ATTN", ROCM_FIRST, 528),
    Seen(
        "0.33.0",
        "gfx942",
        QWEN35,
        "float16",
        1056,
        "ROCM_ATTN",
        ROCM_FIRST,
        1056,
        prefix_caching=True,
    ),
    Seen("0.33.0", "gfx950", QWEN35, "float16", 1056, "ROCM_ATTN", ROCM_FIRST, 1056),
    Seen("0.33.0", "gfx1201", QWEN35, "float16", 1056, "ROCM_ATTN", ROCM_FIRST, 1056),
    Seen("0.33.0", "gfx1201", GRANITE, "bfloat16", 528, "ROCM_ATTN", ROCM_FIRST, 528),
    Seen("0.33.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", AITER_FOUND, 1056, aiter=FOUND),
    Seen("0.33.0", "gfx942", QWEN35, "float16", 1056, "ROCM_ATTN", WITH_AITER, 1056, aiter=ON),
    Seen("0.33.0", "gfx950", QWEN35, "float16", 1056, "ROCM_ATTN", WITH_AITER, 1056, aiter=ON),
    Seen(
        "0.33.0",
        "gfx1201",
        QWEN35,
        "float16",
        1088,
        UNIFIED,
        (UNIFIED, *ROCM_FIRST),
        1088,
        aiter=ON,
    ),
    Seen(
        "0.33.0", "gfx942", QWEN35, "float16", 1088, UNIFIED, (), 1088, aiter=FOUND, backend=UNIFIED
    ),
    Seen(
        "0.33.0", "gfx942", GRANITE, "bfloat16", 576, UNIFIED, (), 576, aiter=FOUND, backend=UNIFIED
    ),
]


def _settings(seen: Seen, **changes: Any) -> predict.Settings:
    settings = predict.Settings(
        "rocm",
        seen.release,
        seen.backend,
        tp=seen.tp,
        dtype=seen.dtype,
        kv_cache_dtype=seen.kv_cache_dtype,
        prefix_caching=seen.prefix_caching,
        gpu_arch=seen.arch,
        aiter=seen.aiter.enabled,
    )
    return replace(settings, **changes)


def _rules(release: str) -> versions.Rules:
    return versions.rules("rocm", release)


@pytest.mark.parametrize("seen", [s for s in SEEN if s.valid], ids=lambda s: s.id)
def test_the_selector_s_order_is_the_one_vllm_logged(seen: Seen) -> None:
    order = rocm.priorities(
        seen.arch, _rules(seen.release), aiter=seen.aiter, kv_cache_dtype=seen.kv_cache_dtype
    )
    # TURBOQUANT, ROCM_OCTAVE and ULTRAQUANT are listed last and never valid for these models
    assert [b for b in order if b not in ("TURBOQUANT", "ROCM_OCTAVE", "ULTRAQUANT")] == list(
        seen.valid
    )
    rules = rocm.platform_rules(seen.arch, _rules(seen.release), seen.aiter, seen.kv_cache_dtype)
    chosen = rules.default
    assert chosen.name == seen.chosen


@pytest.mark.parametrize("seen", SEEN, ids=lambda s: s.id)
def test_the_predictor_gives_every_size_vllm_chose(seen: Seen) -> None:
    """--aiter is AITER on; with aiter merely installed every target picks as without it."""
    out = predict.predict(CHECKPOINTS[seen.checkpoint], _settings(seen))
    assert (out.block_size, out.backend) == (seen.size, seen.chosen), out.steps


@pytest.mark.parametrize("seen", [s for s in SEEN if s.kernel], ids=lambda s: s.id)
def test_the_worker_s_kernel_block_is_the_one_vllm_chose(seen: Seen) -> None:
    table = rocm.backends(_rules(seen.release))
    chosen = next(b for b in table.values() if b.name == seen.chosen)
    assert backends.kernel_block_size(seen.size, [chosen]) == seen.kernel


# --- the sizes real engines logged on MI300X-class GPUs ----------------------------------

PUBLISHED = [
    (QWEN35, predict.Settings("rocm", "", dtype="float16", prefix_caching=False), 1056),
    (QWEN27, predict.Settings("rocm", "", tp=2), 784),
    (GRANITE, predict.Settings("rocm", "", prefix_caching=False), 528),
]


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
@pytest.mark.parametrize(
    ("checkpoint", "settings", "size"), PUBLISHED, ids=[p[0] for p in PUBLISHED]
)
def test_predict_gives_the_published_mi300x_sizes_without_a_backend(
    release: str, checkpoint: str, settings: predict.Settings, size: int
) -> None:
    for arch in (None, "gfx942"):
        out = predict.predict(
            CHECKPOINTS[checkpoint], replace(settings, vllm=release, gpu_arch=arch)
        )
        assert (out.block_size, out.backend) == (size, "ROCM_ATTN"), out.steps


def test_without_a_target_the_answer_names_the_one_that_differs() -> None:
    out = predict.predict(QWEN35_35B, predict.Settings("rocm", "0.34.0", dtype="float16"))
    note = dict(out.steps)["gpu"]
    assert "gfx942 MI300X, MI325X, gfx950 MI355X, MI350X (ROCM_ATTN)" in note
    assert "TRITON_ATTN on gfx1201 (Radeon AI PRO R9700): 1088" in note
    at_033 = predict.predict(QWEN35_35B, predict.Settings("rocm", "0.33.0", dtype="float16"))
    assert "gfx1201" in dict(at_033.steps)["gpu"] and "picks" not in dict(at_033.steps)["gpu"]


# --- releases, refusals, and what the verdicts read ---------------------------------------


def test_a_release_diff_names_rocm_s_switches() -> None:
    moved = {s.name for s in versions.differing(_rules("0.33.0"), _rules("0.34.0"))}
    assert moved == {
        "default_block_size",
        "rocm_attn_preferred_16",
        "rocm_triton_first_on_gfx1201",
        "kv_layouts_merged_across_workers",
        "draft_context_before_model_hooks",
    }
    assert versions.differing(versions.rules("cuda", "0.33.0"), versions.rules("cuda", "0.34.0"))
    back = versions.reverted(_rules("0.34.0"), _rules("0.33.0"), releases.ROCM_TRITON_FIRST)
    assert rocm.default_backend("gfx1201", back) == "ROCM_ATTN"


def test_fp8_e5m2_keeps_rocm_attn_first_on_gfx1201() -> None:
    rules = _rules("0.34.0")
    assert rocm.default_backend("gfx1201", rules, kv_cache_dtype="fp8_e5m2") == "ROCM_ATTN"
    assert rocm.default_backend("gfx1201", rules, kv_cache_dtype="fp8") == "TRITON_ATTN"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (predict.Settings("rocm", "0.34.0", gpu_arch="gfx90a"), "no ROCm rules for the gfx target"),
        (predict.Settings("rocm", "0.32.0"), "which backend vLLM 0.32.0 picks on ROCm"),
        (predict.Settings("rocm", "0.34.0", backend="FLASH_ATTN"), "ROCM_AITER_FA logs itself"),
        (predict.Settings("cuda", "0.34.0", aiter=True), "only vLLM's ROCm platform reads"),
        (predict.Settings("xpu", "0.34.0", gpu_arch="gfx942"), "or a ROCm gfx target"),
        # seen: "No valid attention backend found for rocm with ...block_size=24" (gfx942)
        (predict.Settings("rocm", "0.34.0", block_size=24), "refuses --block-size 24 on ROCm"),
    ],
)
def test_what_the_rocm_rules_do_not_answer_is_refused(
    settings: predict.Settings, message: str
) -> None:
    with pytest.raises(shapes.ConfigError, match=message):
        predict.predict(QWEN35_35B, settings)


def test_a_named_backend_still_answers_for_a_release_whose_selection_was_not_read() -> None:
    """The published granite row of test_published_logs: 0.11.1rc6, ROCM_ATTN named."""
    out = predict.predict(
        GRANITE_4H_SMALL,
        predict.Settings("rocm", "0.11.1rc6", "ROCM_ATTN", prefix_caching=False),
    )
    assert out.block_size == 528


def _cell(arch: str | None, release: str, *, env: dict[str, str] | None = None) -> Any:
    """What blocksize.platform_rules reads of a ROCm cell: its engine environment (the
    platform's and the case's) among the rest."""
    return SimpleNamespace(
        platform="rocm",
        gpu_arch=arch,
        env=env or {},
        platform_spec=SimpleNamespace(env=env or {}, vllm=SimpleNamespace(version=release)),
        case=SimpleNamespace(knobs=SimpleNamespace(kv_cache_dtype=None)),
    )


def test_a_rocm_cell_s_backends_follow_its_target_release_and_aiter() -> None:
    at = _rules("0.34.0")
    assert blocksize.platform_rules(_cell("gfx1201", "0.34.0"), at).default.name == "TRITON_ATTN"
    assert blocksize.platform_rules(_cell(None, "0.34.0"), at).default.name == "ROCM_ATTN"
    aiter = {rocm.AITER_ENV: "1", "VLLM_ROCM_USE_AITER": "1"}
    on = blocksize.platform_rules(_cell("gfx1201", "0.34.0", env=aiter), at)
    assert on.default.name == "ROCM_AITER_UNIFIED_ATTN"
    assert (on.mla.name, on.indexer.name) == ("ROCM_AITER_MLA_SPARSE", "DEEPSEEK_V32_INDEXER")


def test_a_crafted_backend_keeps_the_preference_of_the_one_it_extends() -> None:
    """kvrig's plugin subclasses the base backend, so over ROCM_ATTN at 0.34.0 a crafted
    backend prefers 16 whatever it declares."""
    rocm_attn = rocm.backends(_rules("0.34.0"))["ROCM_ATTN"]
    crafted = blocksize.crafted_backend(
        SimpleNamespace(name="KVRIG_X", sizes=[32], exact=False), rocm_attn
    )  # type: ignore[arg-type]
    assert (crafted.name, crafted.preferred(64)) == ("KVRIG_X", 16)


def test_dsa_layers_start_where_the_release_does_on_rocm() -> None:
    """DeepSeek-V3.2 on ROCm: the indexer's cache and ROCm's sparse MLA backend, both
    [1, MultipleOf(16)]; seen as 64 at 0.34.0 (the emulated gfx942 run), 16 at 0.33.0."""
    for release, size in (("0.34.0", 64), ("0.33.0", 16)):
        rules = rocm.platform_rules("gfx942", _rules(release))
        out = blocksize.decide(
            [rules.indexer, rules.mla], _rules(release), user_block_size=None, page=None
        )
        assert out.block_size == size


def test_the_kernel_table_is_what_the_emulated_rocm_engines_declared() -> None:
    """The probe's backend_kernel_sizes in the emulated runs above."""
    declared = {
        "ROCM_ATTN": ["MultipleOf(16)"],
        "TRITON_ATTN": ["MultipleOf(16)"],
        "ROCM_AITER_UNIFIED_ATTN": ["MultipleOf(16)"],
        "ROCM_AITER_MLA_SPARSE": ["1", "MultipleOf(16)"],
        "DEEPSEEK_V32_INDEXER": ["1", "MultipleOf(16)"],
    }
    assert backend_facts.disagreements("rocm", declared) == []
    assert backend_facts.disagreements("rocm", {"DEEPSEEK_V32_INDEXER": ["64"]})


@pytest.mark.parametrize(
    ("arch", "aiter", "prefill"),
    [("gfx942", ON, True), ("gfx950", ON, True), ("gfx1201", ON, False), ("gfx942", FOUND, False)],
)
def test_dense_mla_has_a_prefill_backend_on_mi3xx_with_aiter_on_only(
    arch: str, aiter: rocm.Aiter, prefill: bool
) -> None:
    """ROCm's only MLA prefill is AITER's, valid on MI300/MI350: RDNA4 refuses dense MLA
    with AITER on too (measured on the emulated gfx1201 column)."""
    assert rocm.aiter_mla_prefill(arch, aiter) is prefill
