"""What an emulated ROCm device answers, and what its record says was faked.

vLLM's ROCm platform (`vllm/platforms/rocm.py`) reads the gfx target once, at import, into
`_GCN_ARCH` (amd-smi first, then torch's `gcnArchName`); every `on_gfx*`/`on_mi3xx` helper,
the CDNA generation and the capability follow from that one string. The answers live apart
from kvrig.run.emulation.rocm_platform (no torch, no vLLM here) so that the unit tests read
the values the emulated columns use.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvrig.define.case_spec import AITER_ENV
from kvrig.define.gpus import Gpu


def properties(device: Gpu) -> SimpleNamespace:
    """What HIP's torch.cuda.get_device_properties would say of the device."""
    return SimpleNamespace(**device.torch_properties())


def device_lines(device: Gpu) -> list[str]:
    """The record's lines for how vLLM's ROCm code learnt of the device (beside the lines
    every emulated column has, kvrig.run.emulation.fakes)."""
    return [
        "amdsmi: unimportable (sys.modules['amdsmi'] = None), so vLLM's built-in ROCm"
        " detection finds no GPU, rocm.py's amd-smi queries fail as without a driver and"
        " it reads the gfx target from torch",
        "torch.cuda.get_device_properties, get_device_capability and get_device_name:"
        f" answered for the emulated device (gcnArchName {device.gcn_arch_name!r},"
        f" read by rocm.py into _GCN_ARCH at import; {device.sm_count} compute units);"
        " torch stays the CUDA wheel's (torch.version.hip None), torch.cuda.is_available()"
        " False",
        "HIP_VISIBLE_DEVICES empty: on ROCm vLLM's Triton check reads it (not"
        " CUDA_VISIBLE_DEVICES) to keep Triton without an active driver",
    ]


def kernel_lines(aiter: bool) -> list[str]:
    """The record's lines for ROCm's kernel packages, and what stood in for them."""
    return [
        "vllm._rocm_C: absent (the CUDA wheel builds none; rocm.py only warns); the custom"
        " ops the layers look up in torch.ops._C come from the CUDA wheel's library",
        f"aiter and every submodule: empty stand-ins ({AITER_ENV}), so find_spec('aiter')"
        " finds AMD's AITER as on vLLM's ROCm image and VLLM_ROCM_USE_AITER decides the"
        " AITER backends; a kernel called through them raises"
        if aiter
        else "aiter: not installed, as with vLLM's PyPI wheel (selection lists no AITER backend)",
    ]
