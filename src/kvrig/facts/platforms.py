"""vLLM's platforms as kvrig runs them, one record each: what selects a backend there,
the backend it gives these models on its reference device, and how its GPUs are named.

The matrix (its columns, `expect_by_arch`), the rules (the stock default) and the host's
facts (where the GPU's architecture is read) all key on a platform; one record keeps
their answers for it together.

Pure: names in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str  # vLLM's: current_platform.device_type, a column's first part
    title: str  # how messages name it
    # The backend its selector gives a plain attention layer of kvrig's models with an
    # unquantized KV cache on the device a cell without an architecture stands for
    # (matrix.yaml's default_backend must say the same): what `selection` then refines.
    default_backend: str
    # What the selector reads beyond the layer (kvrig.rules restates each): nothing, a
    # CUDA compute capability (kvrig.rules.cuda), a gfx target with AITER and the release
    # (kvrig.rules.rocm).
    selection: str
    emulated: bool = False  # whether vLLM's own code decides its cells on a CPU host
    # What its GPUs' architecture is called, where the host's facts hold it (nvidia-smi's
    # compute capability, the gfx target rocminfo or amd-smi names) and which tools
    # answer it: only where vLLM's code reads an architecture for these choices.
    arch_word: str | None = None
    host_arch_key: str | None = None
    host_arch_tools: str | None = None


PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        Platform("cpu", "CPU", "CPU_ATTN", "fixed, CpuPlatform having one attention backend"),
        Platform(
            "cuda",
            "CUDA",
            "FLASH_ATTN",
            "by compute capability and KV-cache dtype, in CudaPlatform._get_backend_priorities",
            emulated=True,
            arch_word="compute capability",
            host_arch_key="gpu_compute_capability",
            host_arch_tools="nvidia-smi",
        ),
        Platform(
            "xpu",
            "XPU",
            "FLASH_ATTN",
            "fixed but for float32 models and batch invariance, XPUPlatform.get_attn_backend_cls",
            emulated=True,
        ),
        Platform(
            "rocm",
            "ROCm",
            "ROCM_ATTN",
            "by gfx target, release, AITER and KV-cache dtype, in RocmPlatform.get_valid_backends",
            emulated=True,
            arch_word="gfx target",
            host_arch_key="gpu_gfx_target",
            host_arch_tools="rocminfo and amd-smi",
        ),
    )
}
NAMES = tuple(PLATFORMS)
