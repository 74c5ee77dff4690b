"""What the engine core plans past the worker's block, and what vLLM refuses first, as the
emulated columns of vLLM 0.34.0 showed them (results/*-emulated: the records'
engine_block_size, stage sizes, kv_cache_groups and errors)."""

from __future__ import annotations

import pytest

from kvrig.define.vllm_models import Family
from kvrig.rules import planning, refusals


@pytest.mark.parametrize(
    ("layers", "pp", "split"),
    [
        (4, 2, [range(0, 2), range(2, 4)]),
        (5, 2, [range(0, 3), range(3, 5)]),
        # The remainder goes to the stages before the last (get_pp_indices).
        (7, 3, [range(0, 2), range(2, 5), range(5, 7)]),
    ],
)
def test_stages_split_the_layers_as_vllm_does(layers: int, pp: int, split: list[range]) -> None:
    assert planning.pipeline_split(layers, pp) == split


@pytest.mark.parametrize(
    ("family", "blocks", "align", "max_len", "planned"),
    [
        # granite at 192 without prefix caching, max_model_len 128: the state group's 128.
        (Family.HYBRID_MAMBA, [192], False, 128, (128, 128)),
        (Family.HYBRID_MAMBA, [192], False, 512, (512, 192)),
        (Family.HYBRID_MAMBA, [192], True, 128, (192, 192)),
        # nemotron_h over two stages, the second unaligned at 64 (vllm-project/vllm#51752).
        (Family.HYBRID_MAMBA, [320, 64], True, 256, (320, 64)),
        # An attention-free model has only its state group.
        (Family.MAMBA, [64], False, 256, (256, 256)),
        (Family.MAMBA, [64], True, 256, (64, 64)),
        (Family.DENSE, [64], True, 256, (None, 64)),
        (Family.MLA, [16], True, 256, (None, 16)),
    ],
)
def test_the_engine_core_takes_the_smallest_group_block(
    family: Family, blocks: list[int], align: bool, max_len: int, planned: tuple
) -> None:
    assert planning.core_blocks(family, blocks, align=align, max_model_len=max_len) == planned


@pytest.mark.parametrize(
    ("attention", "state", "groups"),
    [
        (2, 2, 2),  # granite: (192, 192)
        (1, 3, 4),  # Kimi-Linear, LFM2's first four layers: group size 1
        (10, 30, 4),  # Qwen3.6-35B-A3B: groups of 10
        (12, 13, 2),  # within half of each other: groups of the larger, padded
        (2, 0, 1),  # a dense model: one group
        (0, 2, 1),  # an attention-free one: one group
    ],
)
def test_groups_as_vllm_forms_them(attention: int, state: int, groups: int) -> None:
    assert planning.group_count(attention, state) == groups


def test_a_mamba_block_size_is_refused_only_without_prefix_caching() -> None:
    assert planning.mamba_block_refused(96, align=False, max_model_len=256)
    assert not planning.mamba_block_refused(96, align=True, max_model_len=256)
    # max_model_len is the value vLLM sets itself: not the user's.
    assert not planning.mamba_block_refused(256, align=False, max_model_len=256)
    assert not planning.mamba_block_refused(None, align=False, max_model_len=256)


def _asked(**kw: object) -> refusals.Asked:
    base: dict = {"platform": "cuda", "family": Family.HYBRID_MAMBA, "align": True}
    return refusals.Asked(**{**base, "max_model_len": 256, **kw})


def _fa_fp8(**kw: object) -> refusals.Asked:
    """FlashAttention named beside an fp8 KV cache, on a dense model."""
    return _asked(family=Family.DENSE, attention_backend="FLASH_ATTN", kv_cache_dtype="fp8", **kw)


def _sparse_named(**kw: object) -> refusals.Asked:
    """FlashMLA's sparse backend named for a DSA model on CUDA."""
    return _asked(family=Family.DSA, attention_backend="FLASHMLA_SPARSE", **kw)


@pytest.mark.parametrize(
    ("asked", "says"),
    [
        (_asked(mamba_block_size=96, align=False), "--mamba-block-size can only be set"),
        (_asked(chunked_prefill=False), "Chunked prefill is required for Mamba prefix caching"),
        (_asked(chunked_prefill=False, release=(0, 32, 0)), "for mamba cache mode 'align'"),
        (_asked(hybrid_kv_cache_manager=False), "Failed to promote local KV cache specs"),
        (_asked(block_size=8), "No valid attention backend found for cuda"),
        (_asked(platform="rocm", block_size=8), "No valid attention backend found for rocm"),
        (_asked(platform="rocm", family=Family.MLA), "No valid MLA prefill backend found"),
        (_asked(platform="rocm", family=Family.DENSE, decode_context_parallel=2), "for rocm"),
        (
            _asked(kv_cache_dtype="turboquant_4bit_nc", skip_layers=True),
            "No KV cache layout satisfies",
        ),
        (_asked(chunked_mm_input=False), "Chunked MM input is required"),
        (
            _asked(family=Family.DENSE, attention_backend="FLASHINFER", platform="xpu"),
            "Invalid attention backend for xpu",
        ),
        *(
            (_fa_fp8(platform=platform, gpu_major=major), "FLASH_ATTN is not valid")
            for platform, major in (("cuda", 8), ("cuda", 12), ("rocm", None))
        ),
        # SM100's FA4 reads fp8 for heads up to 256; SM90's serves 512 too.
        (_fa_fp8(gpu_major=10, head_size=512), "is not valid for this configuration"),
        # FlashMLA's sparse kernels serve SM90 and SM100 only, named or not.
        *((_sparse_named(gpu_major=major), "FLASHMLA_SPARSE is not valid") for major in (8, 12)),
    ],
)
def test_what_vllm_refuses_before_a_block_is_sized(asked: refusals.Asked, says: str) -> None:
    found = refusals.refusal(asked)
    assert found is not None and says in found


@pytest.mark.parametrize(
    "asked",
    [
        _asked(),
        _asked(chunked_prefill=False, align=False),  # no prefix caching, no assert
        _asked(family=Family.DENSE, hybrid_kv_cache_manager=False),
        _asked(platform="cpu", block_size=8),  # CPU's worker fails late instead
        _asked(platform="rocm", family=Family.MLA, aiter=True),
        _asked(family=Family.DENSE, decode_context_parallel=2),
        _asked(block_size=32),
        _asked(chunked_mm_input=False, align=False),  # no align mode, no assert
        _asked(family=Family.DENSE, attention_backend="TRITON_ATTN", platform="xpu"),
        # FA3 on SM90 and FA4 on SM100 read fp8; an unknown GPU is not refused.
        *(_fa_fp8(gpu_major=major) for major in (9, 10, None)),
        _fa_fp8(gpu_major=9, head_size=512),
        _asked(family=Family.MLA, attention_backend="FLASHINFER", platform="xpu"),
        *(_sparse_named(gpu_major=major) for major in (9, 10, None)),
    ],
)
def test_what_vllm_takes_is_not_refused(asked: refusals.Asked) -> None:
    assert refusals.refusal(asked) is None


def test_pipeline_stages_whose_layouts_differ_stop_an_engine_that_needs_them_to_agree() -> None:
    """Before 0.34.0 the engine core asserts its workers report one set of KV-cache layouts:
    a stage without attention reports the default preference, one with ROCM_ATTN its own."""
    rocm = [frozenset({"ROCM_ATTN", "MAMBA2_ATTN"}), frozenset({"MAMBA2_ATTN"})]
    assert refusals.layouts_disagree(rocm, merged=False) == refusals.LAYOUTS_DISAGREE
    assert refusals.layouts_disagree(rocm, merged=True) is None  # 0.34.0 merges them
    flash = [frozenset({"FLASH_ATTN", "MAMBA2_ATTN"}), frozenset({"MAMBA2_ATTN"})]
    assert refusals.layouts_disagree(flash, merged=False) is None  # declares none either
    both = [frozenset({"FLASHINFER"}), frozenset({"FLASHINFER", "MAMBA2_ATTN"})]
    assert refusals.layouts_disagree(both, merged=False) is None


def test_the_sized_block_is_held_to_dcp_s_interleave_and_the_prefix_match_unit() -> None:
    dcp = _asked(family=Family.DENSE, decode_context_parallel=2, cp_interleave=48)
    assert "divisible by cp_kv_cache_interleave_size (48)" in (refusals.after_sizing(dcp, 64) or "")
    assert refusals.after_sizing(dcp, 96) is None
    assert refusals.after_sizing(_asked(cp_interleave=48), 64) is None  # no DCP, no assert
    unit = _asked(family=Family.DENSE, one_group=True, prefix_match_unit=32)
    assert "Invalid prefix_match_unit=32" in (refusals.after_sizing(unit, 64) or "")
    assert refusals.after_sizing(unit, 32) is None  # the block itself
    for other in ({"one_group": False}, {"prefix_caching": False}):
        assert refusals.after_sizing(_asked(**{**unit.__dict__, **other}), 64) is None


@pytest.mark.parametrize(
    ("method", "draft", "served"),
    [
        ("draft_model", 128, 128),  # a drafter with positions of its own lowers it
        ("draft_model", 512, 256),  # a longer one does not raise it
        ("draft_model", None, 256),
        ("eagle3", 128, 256),  # an EAGLE drafter takes the target's positions
        (None, None, 256),
    ],
)
def test_a_shorter_drafter_of_its_own_lowers_the_served_context(
    method: str | None, draft: int | None, served: int
) -> None:
    assert planning.served_context(256, method, draft) == served


def test_a_release_that_lowers_the_context_after_the_model_hooks_refuses_the_hybrid() -> None:
    # 0.33.0: the Mamba block keeps the longer context, which validate_mamba_block_size
    # reads as a user's --mamba-block-size without prefix caching.
    late = _asked(align=False, draft_lowered=True, draft_context_first=False)
    assert refusals.refusal(late) == planning.MAMBA_BLOCK_REFUSED
    assert refusals.refusal(_asked(align=False, draft_lowered=True)) is None
    # With prefix caching the Mamba block is the block, whatever the context.
    assert refusals.refusal(_asked(draft_lowered=True, draft_context_first=False)) is None
