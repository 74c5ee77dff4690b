"""Per-rank shapes, version-keyed switches and the decisions made before sizing: the pieces
the verdicts and `kvrig predict` compute a block size from."""

from __future__ import annotations

import pytest

from kvrig.define import releases
from kvrig.rules import choices, shapes, versions

from ..checkpoints import QWEN36_35B, TINY_GRANITE

# Qwen3.6-35B-A3B: the text model nested under text_config, the class named at the top.
QWEN36 = QWEN36_35B
GRANITE = TINY_GRANITE


def test_the_nested_text_config_is_read_with_the_top_level_class() -> None:
    s = shapes.shapes(QWEN36)
    assert (s.architecture, s.family, s.kv_heads, s.head_size) == (
        "Qwen3_5MoeForConditionalGeneration",
        "gdn",
        2,
        256,
    )
    assert s.config_ssm_dtype == "float32"
    assert shapes.model_dtype(QWEN36) == "bfloat16"


def test_kv_heads_are_sharded_and_replicated_below_one_per_rank() -> None:
    assert [shapes.shapes(QWEN36, tp=tp).kv_heads for tp in (1, 2, 4)] == [2, 1, 1]


def test_the_gdn_state_is_split_across_ranks() -> None:
    # conv_dim = 128 x 16 x 2 + 128 x 32 = 8192; temporal (32 v-heads, 128, 128).
    assert shapes.shapes(QWEN36).conv == (8192, 3)
    assert shapes.shapes(QWEN36, tp=4).conv == (2048, 3)
    assert shapes.shapes(QWEN36, tp=4).temporal == (8, 128, 128)


def test_speculative_tokens_lengthen_the_conv_state() -> None:
    assert shapes.shapes(QWEN36, num_speculative_tokens=3).conv == (8192, 6)


def test_a_single_mamba_group_is_replicated_for_every_rank() -> None:
    # conv_dim = 256 + 2 x n_groups x 64: one group at TP 1, two (one per rank) at TP 2.
    assert shapes.shapes(GRANITE).conv == (384, 3)
    assert shapes.shapes(GRANITE, tp=2).conv == (256, 3)


def test_a_dimension_that_does_not_split_is_refused() -> None:
    # 24 attention heads and 6 KV heads split across 3 ranks; the 16 GDN key heads do not
    # (so neither would the 32 value heads, a whole number of them per key head).
    text = {**QWEN36["text_config"], "num_attention_heads": 24, "num_key_value_heads": 6}
    with pytest.raises(
        shapes.ConfigError, match=r"linear_num_key_heads .* does not split across 3"
    ):
        shapes.shapes({**QWEN36, "text_config": text}, tp=3)


def test_an_unknown_architecture_or_field_is_named() -> None:
    with pytest.raises(shapes.ConfigError, match="Unknown architecture 'JambaForCausalLM'"):
        shapes.shapes({"architectures": ["JambaForCausalLM"], "num_key_value_heads": 8})
    lacking = {k: v for k, v in GRANITE.items() if k != "mamba_d_state"}
    with pytest.raises(shapes.ConfigError, match="lacks 'mamba_d_state'"):
        shapes.shapes(lacking)


def test_a_switch_is_unknown_between_the_releases_it_was_seen_in() -> None:
    sw = releases.NEMOTRON_SSM_FALLBACK
    assert sw.at((0, 13, 0)) == "float16"
    assert sw.at((0, 20, 0)) is None
    assert sw.at((0, 32, 0)) == "float32"
    assert versions.parse("0.11.1rc6") == (0, 11, 1)
    assert versions.parse("v0.33.0") == (0, 33, 0)


def test_cpu_runs_phase1_and_cuda_the_checkpoint_term_from_033() -> None:
    assert not versions.rules("cpu", "0.32.0").phase1
    assert versions.rules("cpu", "0.33.0").phase1
    assert versions.rules("cpu", "0.33.0").start == 128
    assert not versions.rules("cuda", "0.32.0").checkpoint_term
    assert versions.rules("cuda", "0.33.0").checkpoint_term


def test_the_state_dtype_follows_the_config_then_the_release_then_the_cpu() -> None:
    r13, r33 = versions.rules("cuda", "0.13.0"), versions.rules("cuda", "0.33.0")
    nemo = "NemotronHForCausalLM"
    assert choices.ssm_dtype(nemo, None, "bfloat16", None, r13) == "float16"
    assert choices.ssm_dtype(nemo, None, "bfloat16", None, r33) == "float32"
    assert choices.ssm_dtype(nemo, "bfloat16", "bfloat16", "auto", r33) == "bfloat16"
    with pytest.raises(shapes.ConfigError, match="not known"):
        choices.ssm_dtype(nemo, None, "bfloat16", None, versions.rules("cuda", "0.20.0"))
    qwen = "Qwen3_5ForConditionalGeneration"
    assert choices.ssm_dtype(qwen, "float32", "bfloat16", None, r33) == "float32"
    assert choices.ssm_dtype(qwen, "float32", "bfloat16", "bfloat16", r33) == "bfloat16"
    cpu = versions.rules("cpu", "0.32.0")
    granite = "GraniteMoeHybridForCausalLM"
    assert choices.ssm_dtype(granite, None, "bfloat16", None, cpu) == "bfloat16"
    assert (
        choices.ssm_dtype(granite, None, "bfloat16", None, cpu, cpu_resets_to_float32=True)
        == "float32"
    )


@pytest.mark.parametrize(
    ("arch", "head_k_dim", "flashinfer"),
    [
        ("8.0", 128, False),
        ("9.0", 64, True),
        ("sm90", 128, True),
        ("10.0", 128, True),
        ("10.0", 64, False),
        ("12.1", 128, True),
        ("8.9", 128, False),
    ],
)
def test_flashinfer_gdn_prefill_only_where_vllm_picks_it(arch, head_k_dim, flashinfer) -> None:
    cfg = {**QWEN36, "text_config": {**QWEN36["text_config"], "linear_key_head_dim": head_k_dim}}
    s = shapes.shapes(cfg)
    assert choices.flashinfer_gdn_prefill(s, "cuda", arch) is flashinfer
    assert choices.flashinfer_gdn_prefill(s, "xpu", arch) is False
    assert choices.flashinfer_gdn_prefill(s, "cuda", None) is None


# --- the model kinds beyond attention beside Mamba2 or GDN (shipped miniatures) -----------


def _shipped(name: str) -> dict:
    from kvrig.define import models

    return models.shipped_config(name)


def test_mla_keeps_one_latent_a_token_on_every_rank() -> None:
    s = shapes.shapes(_shipped("deepseek-v3-mini.json"), tp=2)
    assert (s.family, s.kv_heads, s.mla_width) == ("mla", 1, 512 + 64)
    assert shapes.attention_page_per_token(s, "bfloat16") == 576 * 2
    assert shapes.attention_page_per_token(s, "fp8") == 576


def test_kimi_linear_s_kda_state_beside_its_latent() -> None:
    s = shapes.shapes(_shipped("kimi-linear-48b-mini.json"))
    # q, k and v of 32 heads x 128 convolved over 3 steps; 32 x 128 x 128 recurrent.
    assert (s.family, s.conv, s.temporal, s.mla_width) == (
        "hybrid_mla",
        (3 * 32 * 128, 3),
        (32, 128, 128),
        576,
    )
    # KDA keeps its recurrent state in float32 unless told otherwise: 1920 on the GPUs.
    rules = versions.rules("cuda", "0.34.0")
    assert choices.ssm_dtype("KimiLinearForCausalLM", None, "bfloat16", None, rules) == "float32"
    assert shapes.mamba_page(s, "bfloat16", "float32") == 12288 * 3 * 2 + 32 * 128 * 128 * 4


def test_lfm2_s_short_convolution_is_a_small_state_draft_tokens_leave_alone() -> None:
    config = _shipped("lfm2-1.2b-mini.json")
    s = shapes.shapes(config, num_speculative_tokens=3)
    assert (s.family, s.kv_heads, s.head_size, s.conv, s.temporal) == (
        "short_conv",
        8,
        64,
        (2048, 2),
        (0, 0, 0),
    )
    assert shapes.mamba_page(s, "bfloat16", "bfloat16") == 2048 * 2 * 2


def test_an_attention_free_mamba2_has_only_its_state() -> None:
    s = shapes.shapes(_shipped("mamba-codestral-7b-mini.json"))
    # inner 2 x 4096 plus 2 x 8 groups x 128 state, over 3 steps; 128 heads x 64 x 128.
    assert (s.family, s.kv_heads, s.conv, s.temporal) == ("mamba", 0, (10240, 3), (128, 64, 128))
    assert not s.hybrid


@pytest.mark.parametrize(
    ("preset", "head", "slot"),
    [
        # 4-bit keys and values of 64: 32 + 2 (norm) and 32 + 4 (scale, zero) = 70.
        ("turboquant_4bit_nc", 64, 70),
        ("turboquant_k8v4", 64, 64 + 36),
        ("turboquant_3bit_nc", 64, 26 + 28),
        ("turboquant_k3v4_nc", 128, 50 + 68),
        ("turboquant_3bit_nc", 100, 82),
        # 38 + 2 and 50 + 4 = 94; an odd sum is rounded up to the next even slot.
        ("turboquant_k3v4_nc", 100, 94),
        ("turboquant_k3v4_nc", 30, 34),  # 12 + 2 and 15 + 4 = 33, rounded up to an even 34
    ],
)
def test_turboquant_packs_a_head_s_key_and_value_in_one_even_slot(
    preset: str, head: int, slot: int
) -> None:
    assert shapes.turboquant_slot(head, preset) == slot
    s = shapes.shapes(GRANITE)
    assert shapes.attention_page_per_token(s, "turboquant_4bit_nc") == s.kv_heads * 70
