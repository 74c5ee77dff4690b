"""The XPU platform of an emulated column: vLLM's own, with its kernel modules stubbed.

`vllm/platforms/xpu.py` imports vllm_xpu_kernels' compiled modules at load, and
`vllm/_xpu_ops.py` two of its functions; vLLM's own XPU selection tests run on CPU with
empty stand-ins for them, and so does this. torch's XPU device queries are answered by
the platform from the emulated device. The selection, the block-size steps (with XPU's
GDN rounding and its second check) are XPUPlatform's code.
"""

from __future__ import annotations

from kvrig.run.emulation import emulated_platform, stub_modules
from kvrig.run.emulation.answers import DeviceAnswers

STUB_PACKAGE = "vllm_xpu_kernels"
# The modules XPU code imports at load (each is made on demand, so a release that
# imports another one gets it too).
STUB_MODULES = (
    STUB_PACKAGE,
    f"{STUB_PACKAGE}._C",
    f"{STUB_PACKAGE}._moe_C",
    f"{STUB_PACKAGE}._xpu_C",
    f"{STUB_PACKAGE}.flash_attn_interface",
    f"{STUB_PACKAGE}.rotary",
)
WHY = (
    "an XPU kernel was called in an emulated XPU column (vllm_xpu_kernels is a stub there:"
    " no device)"
)


def install_stubs() -> None:
    """vllm_xpu_kernels as stubs ahead of any real one; a kernel called through them says
    it is emulated."""
    stub_modules.install(STUB_PACKAGE, WHY, STUB_MODULES)


install_stubs()

# The layers look their custom ops up in torch.ops._C as they are built (SiluAndMul takes
# torch.ops._C.silu_and_mul); on XPU vllm_xpu_kernels._C registers them, here the CUDA
# wheel's own library does. Looked up, never run: the model is on the meta device.
import torch  # noqa: E402

from kvrig.run.emulation import chosen  # noqa: E402
from kvrig.run.emulation.answers import USER  # noqa: E402
from kvrig.run.vllm_plugin.symbols import need  # noqa: E402

need("vllm._C_stable_libtorch", USER)
XPUPlatform = need("vllm.platforms.xpu.XPUPlatform", USER)  # after the stubs it imports

# Ops only vllm_xpu_kernels registers that layers look up as they are built (NemotronH's
# activation). Named one by one: other code asks hasattr(torch.ops._C, ...) to detect a
# kernel, and must keep getting the CUDA library's answer.
XPU_ONLY_OPS = frozenset({"relu2_no_mul"})


def _op_namespace_with_stubs(namespace: object) -> None:
    """An XPU-only op is looked up as a stub that raises if it is ever run, instead of
    failing the layer's construction."""
    base = type(namespace)

    class WithStubs(base):  # type: ignore[misc, valid-type]
        def __getattr__(self, name: str) -> object:
            try:
                return super().__getattr__(name)
            except AttributeError:
                if name not in XPU_ONLY_OPS:
                    raise
                return stub_modules.stub_attribute(f"torch.ops.{self.name}", name, WHY)

    namespace.__class__ = WithStubs


_op_namespace_with_stubs(torch.ops._C)

if emulated_platform() != "xpu":  # pragma: no cover - a misuse, said loud
    raise RuntimeError("kvrig's emulated XPU platform was imported without KVRIG_EMULATE=xpu")

# The Xe generation of each family kvrig emulates: vllm_xpu_kernels answers which one the
# GPU is through device-query ops (torch.ops._xpu_C.is_xe2_arch, is_xe3_arch), which the
# XPU MoE experts read as they are built (fused_moe/experts/xpu_moe.py).
XE_GENERATION = {"bmg": 2}
ARCH_QUERIES = (2, 3)


def _answer_arch_queries() -> torch.library.Library:
    """The device-query ops, answering for the device this process emulates when asked
    (a parent serving every XPU architecture has none); kept for the process's life (a
    dropped Library unregisters its ops)."""
    lib = torch.library.Library("_xpu_C", "FRAGMENT")
    for gen in ARCH_QUERIES:
        name = f"is_xe{gen}_arch"
        lib.define(f"{name}() -> bool")
        lib.impl(
            name,
            lambda gen=gen: XE_GENERATION.get(chosen.device().arch) == gen,
            "CompositeExplicitAutograd",
        )
    return lib


_ARCH_QUERIES = _answer_arch_queries()


class EmulatedXpuPlatform(DeviceAnswers, XPUPlatform):
    """XPUPlatform with the device's answers read when asked (kvrig.run.emulation.chosen)."""
