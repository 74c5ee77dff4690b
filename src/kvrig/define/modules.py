"""The modules a vLLM model's code may import beyond vLLM's own, and who provides each.

A misspelt name in a model's `needs:` is lacking everywhere: every cell of the model
would skip on every column (kvrig.define.cells.with_needs_met), and an allowance could
let the gate pass. The environment that loads the matrix cannot be asked (the column's
is another), so names are checked against this list of what vLLM's model files import.

Pure: names in, names out.
"""

from __future__ import annotations

import difflib

# import name -> the distribution (PyPI name) that provides it.
KNOWN: dict[str, str] = {
    "PIL": "pillow",
    "accelerate": "accelerate",
    "av": "av",
    "bitsandbytes": "bitsandbytes",
    "causal_conv1d": "causal-conv1d",
    "cv2": "opencv-python-headless",
    "decord": "decord",
    "deep_gemm": "deep-gemm",
    "einops": "einops",
    "fla": "flash-linear-attention",
    "flash_attn": "flash-attn",
    "flashinfer": "flashinfer-python",
    "gguf": "gguf",
    "huggingface_hub": "huggingface-hub",
    "intel_extension_for_pytorch": "intel-extension-for-pytorch",
    "librosa": "librosa",
    "mamba_ssm": "mamba-ssm",
    "mistral_common": "mistral-common",
    "numba": "numba",
    "numpy": "numpy",
    "open_clip": "open-clip-torch",
    "pandas": "pandas",
    "peft": "peft",
    "qwen_vl_utils": "qwen-vl-utils",
    "safetensors": "safetensors",
    "scipy": "scipy",
    "sentencepiece": "sentencepiece",
    "soundfile": "soundfile",
    "tiktoken": "tiktoken",
    "timm": "timm",
    "tokenizers": "tokenizers",
    "torchaudio": "torchaudio",
    "torchcodec": "torchcodec",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "triton": "triton",
    "vllm_xpu_kernels": "vllm-xpu-kernels",
    "xformers": "xformers",
}


def close_to(name: str) -> list[str]:
    """The known modules a misspelt `name` may mean, closest first (case aside: `pil`)."""
    by_lower = {k.lower(): k for k in KNOWN}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    return [by_lower[c] for c in close]
