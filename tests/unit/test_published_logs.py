"""The predictor held against what real engines logged on real GPUs.

CUDA, XPU and ROCm engines cannot run on the rig's machines, so the only ground truth for
those platforms is what engines logged in public threads: "Setting attention block size
to N tokens ..." and "Padding mamba page size by X% ...". Each row below is one such log
with the checkpoint's config values (each with where it was read) and the settings the
log states; the predictor must give the logged size and the logged padding, to vLLM's
two decimals, or no padding line where the log has none.

Where a row's config or settings were not public in full, the comment says which value
is inferred and from what; no value is chosen to make a row pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvrig.rules import predict


def gdn(*, key_heads: int, value_heads: int, head_dim: int, conv_kernel: int) -> dict[str, int]:
    """A Qwen GDN config's linear-attention fields (key and value heads share a head dim)."""
    return {
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": conv_kernel,
    }


# Config copies, as stored in public repositories and checkpoint pages:
# HF = the checkpoint's own config.json on huggingface.co (the values match every public
# copy listed beside them).
QWEN3_NEXT_80B = {
    # HF Qwen/Qwen3-Next-80B-A3B-Instruct; llama.cpp #16095's GGUF dump of it (head_count_kv
    # 2, key_length 256, ssm_conv_kernel 4, ssm_d_inner 4096 = 32 x 128, ssm_n_group 16)
    "architectures": ["Qwen3NextForCausalLM"],
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    **gdn(key_heads=16, value_heads=32, head_dim=128, conv_kernel=4),
    "torch_dtype": "bfloat16",
}
QWEN35_4B = {
    # HF Qwen/Qwen3.5-4B: a multimodal checkpoint, the text model under text_config; values
    # as in public test copies of its text_config (hidden 2560, 16 heads / 4 KV heads of
    # 256, GDN 16 key / 32 value heads of 128, mamba_ssm_dtype float32)
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {
        "hidden_size": 2560,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        **gdn(key_heads=16, value_heads=32, head_dim=128, conv_kernel=4),
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    },
}
QWEN36_35B = {
    # HF Qwen/Qwen3.6-35B-A3B (qwen3_5_moe_text: hidden 2048, 16 heads / 2 KV heads of 256,
    # GDN 16 / 32 heads of 128, mamba_ssm_dtype float32), as in public copies of the
    # Qwen3.5/3.6-35B-A3B text_config
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "text_config": {
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        **gdn(key_heads=16, value_heads=32, head_dim=128, conv_kernel=4),
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    },
}
QWEN35_27B = {
    # HF Qwen/Qwen3.5-27B text_config (hidden 5120, 24 heads / 4 KV heads of 256, GDN 16 key
    # / 48 value heads of 128, mamba_ssm_dtype float32), as in public copies of it
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {
        "hidden_size": 5120,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        **gdn(key_heads=16, value_heads=48, head_dim=128, conv_kernel=4),
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    },
}
GRANITE_4H_SMALL = {
    # HF ibm-granite/granite-4.0-h-small: hidden_size 4096, num_attention_heads 32,
    # num_key_value_heads 8, mamba_d_state 128, mamba_d_conv 4, mamba_expand 2 (public copies
    # of its config.json)
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    # Not in the copies read: the split of the 8192 inner channels (mamba_expand x
    # hidden_size) into heads, which the state size depends on only as heads x head_dim =
    # 8192, and the group count. Heads of 64 and 1 group are the family's: the
    # granite-4.0-h-tiny release config.json (matrix.yaml, granite_4h_tiny: 48 heads x 64,
    # 1 group). With 8 groups the padding would be 0.19%, not the logged 0.69%.
    "mamba_n_heads": 128,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "torch_dtype": "bfloat16",
}
NEMOTRON3_NANO_30B = {
    # Nemotron-Cascade-2-30B-A3B is post-trained from NVIDIA-Nemotron-3-Nano-30B-A3B and
    # keeps its shapes; HF nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 and public copies of
    # its config.json (hidden 2688, 32 heads / 2 KV heads of 128, 64 Mamba heads of 64,
    # ssm_state_size 128, n_groups 8, conv_kernel 4)
    "architectures": ["NemotronHForCausalLM"],
    "hidden_size": 2688,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "torch_dtype": "bfloat16",
}
NEMOTRON3_NANO_4B = {
    # HF nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 (the FP8 checkpoint quantizes its weights,
    # not its shapes); public copies of its config.json: hidden 3136, 40 heads / 8 KV heads
    # of 128, 96 Mamba heads of 80, ssm_state_size 128, n_groups 8, conv_kernel 4, and no
    # mamba_ssm_cache_dtype
    "architectures": ["NemotronHForCausalLM"],
    "hidden_size": 3136,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "mamba_num_heads": 96,
    "mamba_head_dim": 80,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "torch_dtype": "bfloat16",
}


@dataclass(frozen=True)
class Logged:
    """One published engine log: what ran, with which settings, and what vLLM said."""

    name: str
    where: str  # the hardware, backend, and the thread the log is from
    config: dict[str, Any]
    settings: predict.Settings
    size: int
    padding: str | None  # as logged ("1.49%"), None: the log has no padding line
    # False where only the size line was published: the padding is then not checked.
    padding_quoted: bool = True


ROWS = [
    Logged(
        "Qwen3-Next-80B-A3B-Instruct",
        "2x H200, FLASH_ATTN, bf16, TP 2, prefix caching off (public vLLM thread)",
        QWEN3_NEXT_80B,
        predict.Settings("cuda", "0.10.2", "FLASH_ATTN", tp=2, prefix_caching=False),
        544,
        "1.49%",
    ),
    Logged(
        "Qwen3-Next-80B-A3B (WNA16 quantization)",
        "2x L40S, FLASHINFER, bf16 with an fp8 KV cache, TP 2, prefix caching off",
        QWEN3_NEXT_80B,
        predict.Settings(
            "cuda", "0.13.0", "FLASHINFER", tp=2, kv_cache_dtype="fp8", prefix_caching=False
        ),
        1072,
        None,
    ),
    Logged(
        "Qwen/Qwen3.5-4B",
        "A100/H20, bf16, --enable-prefix-caching (vllm-project/vllm#40696)",
        QWEN35_4B,
        predict.Settings("cuda", "0.19.1", dtype="bfloat16", prefix_caching=True),
        528,
        None,
        padding_quoted=False,  # the thread quotes the size line only
    ),
    Logged(
        "Qwen/Qwen3.6-35B-A3B",
        # The log is from Platform._align_hybrid_block_size (interface.py), so a release
        # after the step moved there and, at 528, before 0.33.0's checkpoint term could
        # apply; 0.32.0 is the newest such release kvrig restates.
        "CUDA, TP 4, other settings vLLM's defaults (public thread)",
        QWEN36_35B,
        predict.Settings("cuda", "0.32.0", tp=4),
        528,
        None,
        padding_quoted=False,  # the size line only was published
    ),
    Logged(
        "Qwen3.6-35B-A3B (quantized) with MTP",
        # TP is not stated in the log; one rank is what a single-GPU quantized 35B runs at.
        "CUDA, FLASH_ATTN, num_speculative_tokens 3, prefix caching on (align)",
        QWEN36_35B,
        predict.Settings(
            "cuda", "0.22.0", "FLASH_ATTN", prefix_caching=True, num_speculative_tokens=3
        ),
        1072,
        None,
    ),
    Logged(
        "Qwen3.5-27B (W4A16)",
        "CUDA, FLASH_ATTN, bf16, prefix caching off",
        QWEN35_27B,
        predict.Settings("cuda", "0.19.1", "FLASH_ATTN", dtype="bfloat16", prefix_caching=False),
        784,
        "0.13%",
    ),
    Logged(
        "ibm-granite/granite-4.0-h-small",
        "ROCm, ROCM_ATTN, bf16, prefix caching off (public ROCm thread)",
        GRANITE_4H_SMALL,
        predict.Settings("rocm", "0.11.1rc6", "ROCM_ATTN", prefix_caching=False),
        528,
        "0.69%",
    ),
    Logged(
        "Nemotron-Cascade-2-30B-A3B (NVFP4)",
        "CUDA, FLASHINFER, fp8 KV cache, --mamba-ssm-cache-dtype float32, prefix caching off",
        NEMOTRON3_NANO_30B,
        predict.Settings(
            "cuda",
            "0.19.0",
            "FLASHINFER",
            kv_cache_dtype="fp8",
            mamba_ssm_cache_dtype="float32",
            prefix_caching=False,
        ),
        4176,
        "0.19%",
    ),
    Logged(
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8",
        # vLLM logged "Updating mamba_ssm_cache_dtype to 'float16' for NemotronH model"; the
        # log states no prefix-caching flag (0.13.0's default is taken as off, see
        # kvrig.rules.predict.cache_mode).
        "GB10 (SM12.1), FLASHINFER, fp8 KV cache, SSM dtype auto",
        NEMOTRON3_NANO_4B,
        predict.Settings("cuda", "0.13.0", "FLASHINFER", kv_cache_dtype="fp8", gpu_arch="12.1"),
        992,
        "0.35%",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_predictor_reproduces_the_logged_size_and_padding(row: Logged) -> None:
    out = predict.predict(row.config, row.settings)
    assert out.block_size == row.size, out.steps
    size_line = f"Setting attention block size to {row.size} tokens"
    assert any(line.startswith(size_line) for line in out.log), out.log
    padding = [line for line in out.log if line.startswith("Padding mamba page size by")]
    if not row.padding_quoted:
        return
    if row.padding is None:
        assert padding == [], out.log
    else:
        assert padding == [
            f"Padding mamba page size by {row.padding} to ensure that mamba page size and"
            " attention page size are exactly equal."
        ]
        assert f"{out.padding_pct:.2f}%" == row.padding


def test_tensor_parallelism_is_what_moves_qwen36_from_1056_to_528() -> None:
    """The row that per-rank KV heads decide: one rank gives 1056."""
    one = predict.predict(QWEN36_35B, predict.Settings("cuda", "0.32.0"))
    assert one.block_size == 1056
