"""The GPUs whose answers vLLM's platform code tells apart, one record each.

vLLM's CUDA code picks backends and prefill kernels by compute capability; its ROCm code
reads the gfx target once at import (`_GCN_ARCH`) into its backend order and AITER's
availability; its XPU code reads only the device name. Each record holds what the code
reads and what an emulated device answers torch in its place, so the rules, the emulation
and the matrix's columns read one device the same way.

Pure: names in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CC = re.compile(r"(?:sm_?)?(\d+)(?:\.(\d+))?$")
_GFX = re.compile(r"gfx(\d+)")


def parse_capability(text: str) -> tuple[int, int] | None:
    """A compute capability written as "9.0", "sm90", "sm_100", "12.1" or "9", as (major,
    minor); None for text that is none of these."""
    m = _CC.match(text.strip().lower())
    if not m:
        return None
    if m.group(2) is not None:
        return int(m.group(1)), int(m.group(2))
    digits = m.group(1)
    if len(digits) == 1:  # "9": a major version, as nvidia-smi's 9.0; no SM label is 0.9
        return int(digits), 0
    return int(digits[:-1]), int(digits[-1])


def gfx_capability(arch: str) -> tuple[int, int]:
    """(major, minor) as HIP derives hipDeviceProp_t's from the target id, and as vLLM's
    _capability_from_gcn_arch does: gfx942 -> (9, 4), gfx1201 -> (12, 0). torch's answer
    must agree with the one vLLM derives, or the two halves of vLLM would see two GPUs."""
    m = _GFX.match(arch)
    if m is None:
        raise ValueError(f"{arch!r} is not a gfx target id")
    digits = m.group(1)
    if len(digits) == 4:
        return int(digits[:2]), int(digits[2])
    return int(digits[0]), int(digits[1])


@dataclass(frozen=True)
class Gpu:
    """One architecture as vLLM sees it: what `get_device_capability()` (or, on XPU, the
    device name) answers, and what the emulated device reports beside it."""

    platform: str
    # "9.0" (a CUDA compute capability), "bmg" (an Intel GPU family) or "gfx942" (an AMD
    # gfx target, as amd-smi and rocminfo print it without its features)
    arch: str
    label: str  # the column's part: sm90, bmg, gfx942
    name: str  # what get_device_name() answers on the emulated device
    memory_gib: int
    examples: str  # the boards users run it as
    # Streaming multiprocessors (CUDA) or compute units (ROCm), which some kernels size by
    sm_count: int = 0
    # ROCm: what HIP's torch reports as gcnArchName (the target id with its features, as
    # amd-smi and rocminfo print it; vLLM tests substrings of it); the CDNA generation
    # (vllm/platforms/rocm.py: get_cdna_version, 0 for none), which AITER's availability
    # reads (CDNA 3 or newer); whether it is RDNA4 (on_rdna4: AITER's unified attention
    # goes first with AITER on); whether the selector swaps TRITON_ATTN ahead of ROCM_ATTN
    # from vLLM 0.34.0 (get_valid_backends: on_gfx1201() or on_gfx1100()).
    gcn_arch_name: str = ""
    cdna: int = 0
    rdna4: bool = False
    triton_first: bool = False

    @property
    def capability(self) -> tuple[int, int] | None:
        """What torch.cuda.get_device_capability answers: the compute capability on CUDA,
        HIP's reading of the gfx target on ROCm; none on XPU."""
        if self.platform == "cuda":
            return parse_capability(self.arch)
        if self.platform == "rocm":
            return gfx_capability(self.arch)
        return None

    def torch_properties(self) -> dict[str, object]:
        """What torch.cuda.get_device_properties says of the device on CUDA and HIP's
        torch: CDNA (gfx9) runs 64-wide wavefronts, RDNA and NVIDIA GPUs 32-wide."""
        assert self.capability is not None, f"{self.arch} has no torch.cuda properties"
        major, minor = self.capability
        full_sm = self.platform == "cuda" and major in (8, 9, 10) and minor == 0
        props: dict[str, object] = {
            "name": self.name,
            "major": major,
            "minor": minor,
            "total_memory": self.memory_gib << 30,
            "multi_processor_count": self.sm_count,
            "warp_size": 64 if self.arch.startswith("gfx9") else 32,
            "max_threads_per_multi_processor": 2048 if full_sm or self.platform == "rocm" else 1536,
            "is_integrated": False,
            "is_multi_gpu_board": False,
            "uuid": "kvrig-emulated",
        }
        if self.platform == "rocm":
            props["gcnArchName"] = self.gcn_arch_name
        return props


CUDA_GPUS: dict[str, Gpu] = {
    g.arch: g
    for g in (
        Gpu("cuda", "8.0", "sm80", "NVIDIA A100-SXM4-80GB", 80, "A100", 108),
        Gpu("cuda", "8.6", "sm86", "NVIDIA A10G", 24, "A10G, A10, A40, RTX A6000, RTX 3090", 80),
        Gpu("cuda", "8.9", "sm89", "NVIDIA L40S", 48, "L40S, L4", 142),
        Gpu("cuda", "9.0", "sm90", "NVIDIA H100 80GB HBM3", 80, "H100, H200", 132),
        Gpu("cuda", "10.0", "sm100", "NVIDIA B200", 180, "B200", 148),
        Gpu(
            "cuda",
            "12.0",
            "sm120",
            "NVIDIA RTX PRO 6000 Blackwell",
            96,
            "RTX PRO 6000, RTX 5090",
            188,
        ),
    )
}
XPU_GPUS: dict[str, Gpu] = {
    "bmg": Gpu(
        "xpu", "bmg", "bmg", "Intel(R) Arc(TM) Pro B60 Graphics", 24, "Arc Pro B60, Arc B580"
    ),
}
# One board per gfx target whose choices vLLM's ROCm code can tell apart. `name` is what
# RocmPlatform.get_device_name answers on the board (its _ROCM_DEVICE_ID_NAME_MAP by PCI
# id, else amd-smi's market name); `sm_count` holds the compute units.
ROCM_GPUS: dict[str, Gpu] = {
    g.arch: g
    for g in (
        Gpu(
            "rocm",
            "gfx942",
            "gfx942",
            "AMD_Instinct_MI300X",
            192,
            "MI300X, MI325X",
            304,
            gcn_arch_name="gfx942:sramecc+:xnack-",
            cdna=3,
        ),
        Gpu(
            "rocm",
            "gfx950",
            "gfx950",
            "AMD Instinct MI355X",
            288,
            "MI355X, MI350X",
            256,
            gcn_arch_name="gfx950:sramecc+:xnack-",
            cdna=4,
        ),
        Gpu(
            "rocm",
            "gfx1201",
            "gfx1201",
            "AMD_Radeon_R9700",
            32,
            "Radeon AI PRO R9700",
            64,
            gcn_arch_name="gfx1201",
            rdna4=True,
            triton_first=True,
        ),
    )
}
GPUS: dict[str, dict[str, Gpu]] = {"cuda": CUDA_GPUS, "xpu": XPU_GPUS, "rocm": ROCM_GPUS}
