"""The independent block-size computation, on the worked examples of vLLM's own code paths,
and against every expectation written by hand in matrix.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.define import models
from kvrig.define.cells import expand
from kvrig.define.matrix import EarlyError, Runs, Unsupported, load
from kvrig.rules import blocksize as ex

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"

TINY_GRANITE = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "mamba_n_heads": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 64,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "layer_types": ["mamba", "attention", "mamba", "attention"],
}
CPU_ATTN = ex.RULES["cpu"].default


def test_pages_of_the_verified_cpu_example() -> None:
    # 2 x 1 KV head x 64 x 2 B; SSM 4 x 64 x 64 x 4 B + conv 3 x (256 + 2 x 64) x 2 B.
    page = ex.pages(TINY_GRANITE, "hybrid_mamba", model_dtype="bfloat16", avx512_bf16=True)
    assert (page.attention_per_token, page.mamba, page.ssm_dtype) == (256, 67840, "float32")


def test_cpu_start_128_aligns_to_384_and_a_user_32_to_288() -> None:
    page = ex.Pages(256, 67840)
    assert ex.align_hybrid(128, [CPU_ATTN], page) == 384
    assert ex.align_hybrid(32, [CPU_ATTN], page) == 288


def test_bf16_state_is_kept_only_when_asked_for_on_avx512_bf16_hosts() -> None:
    cfg = TINY_GRANITE
    kw = {"model_dtype": "bfloat16", "platform": "cpu"}
    assert ex.ssm_dtype(cfg, knob="bfloat16", avx512_bf16=True, **kw) == "bfloat16"
    assert ex.ssm_dtype(cfg, knob=None, avx512_bf16=True, **kw) == "float32"
    assert ex.ssm_dtype(cfg, knob=None, avx512_bf16=False, **kw) == "bfloat16"
    nemotron = {"architectures": ["NemotronHForCausalLM"]}
    assert ex.ssm_dtype(nemotron, knob=None, avx512_bf16=False, **kw) == "float32"


def test_phase1_takes_the_smallest_lcm_every_backend_accepts() -> None:
    sparse = ex.Backend("FLASHINFER_MLA_SPARSE", (ex.Kernel(32, True),))
    indexer = ex.Backend("DEEPSEEK_V32_INDEXER", (ex.Kernel(64),))
    assert ex.phase1([sparse, indexer], 16) == 64
    a, b = ex.Backend("A", (ex.Kernel(32),)), ex.Backend("B", (ex.Kernel(48),))
    assert ex.phase1([a, b], 16) == 96
    exact32 = ex.Backend("E", (ex.Kernel(32),), exact=True)
    assert ex.phase1([ex.RULES["xpu"].default, exact32], 16) is None


def test_lcm_rounding_bumps_48_to_96_beside_an_exact_48() -> None:
    # The configuration the review settled must run at 48; released vLLM rounds to 96.
    a = ex.Backend("A", (ex.Kernel(32), ex.Kernel(48)))
    b = ex.Backend("B", (ex.Kernel(48),), exact=True)
    assert ex.phase1([a, b], 16) == 48
    aligned = ex.align_hybrid(48, [a, b], ex.Pages(1000, 40_000))
    assert aligned == 96 and not b.supports(aligned)


def test_exact_backends_accept_only_their_sizes_plain_ones_any_multiple() -> None:
    plain = ex.Backend("P", (ex.Kernel(128),))
    exact = ex.Backend("E", (ex.Kernel(32), ex.Kernel(384)), exact=True)
    assert plain.supports(384) and not plain.supports(320)
    assert exact.supports(384) and not exact.supports(64)


def _cells():
    matrix = load(DEFAULT_MATRIX)
    # CPU refuses sparse MLA before any block size is chosen: nothing to compute there.
    refused = {("cpu", "dsa")}
    return [
        c
        for c in expand(matrix)
        if c.expect.outcome != "skip" and (c.platform, c.model.family) not in refused
    ]


@pytest.mark.parametrize("cell", _cells(), ids=lambda c: c.id)
def test_matrix_expectations_agree_with_the_computation(cell) -> None:
    """Each hand-written expectation (and its doc's arithmetic) is derived a second time."""
    calc = ex.expected(cell, models.render(cell.model), avx512_bf16=True)
    shown = cell.defect or cell.expect
    if isinstance(shown, Runs):
        assert not calc.rejecting and not calc.phase1_error, calc.explain()
        inv = shown.invariants
        if inv.block_size is not None:
            assert calc.block_size == inv.block_size, calc.explain()
        if inv.block_size_in is not None:
            assert calc.block_size in inv.block_size_in, calc.explain()
    elif isinstance(shown, EarlyError):
        assert sorted(calc.rejecting) == sorted(shown.backends), calc.explain()
    elif isinstance(shown, Unsupported) and "share no supported" in shown.match:
        assert calc.phase1_error, calc.explain()
