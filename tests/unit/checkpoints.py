"""Checkpoint configs the unit tests share (config.json as a dict, no weights): the
miniature granite the block-size computation's worked example uses, and copies of real
checkpoints' configs, each value with where it was read, that the published engine logs
(rules/test_published_logs.py) and `kvrig predict` are held against."""

from __future__ import annotations

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


def gdn(*, key_heads: int, value_heads: int, head_dim: int, conv_kernel: int) -> dict[str, int]:
    """A Qwen GDN config's linear-attention fields (key and value heads share a head dim)."""
    return {
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": conv_kernel,
    }


# Every copy states its layer count, as every checkpoint's config.json does: kvrig refuses
# a config without one, as the matrix's loader does (vLLM builds num_hidden_layers layers).
# The size depends only on there being attention layers, never on how many layers there are.
# Config copies, as stored in public repositories and checkpoint pages:
# HF = the checkpoint's own config.json on huggingface.co (the values match every public
# copy listed beside them).
QWEN3_NEXT_80B = {
    # HF Qwen/Qwen3-Next-80B-A3B-Instruct; llama.cpp #16095's GGUF dump of it (head_count_kv
    # 2, key_length 256, ssm_conv_kernel 4, ssm_d_inner 4096 = 32 x 128, ssm_n_group 16)
    "architectures": ["Qwen3NextForCausalLM"],
    "num_hidden_layers": 48,  # 12 x (3 GDN + 1 attention), full_attention_interval 4
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
        "num_hidden_layers": 32,  # the model card's 8 x (3 GDN + 1 attention)
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
        "num_hidden_layers": 40,  # 10 x (3 GDN + 1 attention), as Qwen3.5-35B-A3B's
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        **gdn(key_heads=16, value_heads=32, head_dim=128, conv_kernel=4),
        "mamba_ssm_dtype": "float32",
        "dtype": "bfloat16",
    },
}
# HF Qwen/Qwen3.5-35B-A3B: the text_config shapes of Qwen3.6-35B-A3B above (public copies
# of both), which are also transformers' Qwen3_5MoeTextConfig defaults, documented for
# this checkpoint (hidden 2048, 40 layers, 16 heads / 2 KV heads of 256, GDN 16 key / 32
# value heads of 128, conv 4)
QWEN35_35B = QWEN36_35B
QWEN35_27B = {
    # HF Qwen/Qwen3.5-27B text_config (hidden 5120, 24 heads / 4 KV heads of 256, GDN 16 key
    # / 48 value heads of 128, mamba_ssm_dtype float32), as in public copies of it
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {
        "num_hidden_layers": 64,  # the model card's 16 x (3 GDN + 1 attention)
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
    # 40 layers, Mamba2 and attention 9:1: not in the copies read; no size depends on it
    "num_hidden_layers": 40,
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
    "num_hidden_layers": 52,  # 23 Mamba2, 23 MoE, 6 attention
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
    "num_hidden_layers": 42,  # 21 Mamba2, 17 MLP, 4 attention
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
