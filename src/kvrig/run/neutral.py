"""What an emulated parent imports that is not vLLM, and the watch that proves it neutral.

About four fifths of an emulated parent's import of vLLM is the libraries vLLM imports
(on 0.34.0, of ROCm's 26 s about 22: torch and its compiler, transformers, pydantic, numba,
xgrammar, FlashInfer, ...). A run's root parent (kvrig.run.root_parent) imports them once
and forks every platform's parent from there, so that a parent per gfx target, or one for
the cells that set a variable vLLM reads at import, costs vLLM's own import alone.

That is only sound if none of these libraries reads, as it loads, what differs between the
parents forked from it. `Watch` looks while they load and names anything that would:

- a lookup of a variable a platform's parent adds to the root's environment (vLLM's,
  kvrig's, HIP's and Level Zero's device lists: `TIER_PREFIXES`); a library scanning the
  whole environment for its own prefix (numba's NUMBA_) reads none of them;
- a device query the emulated platforms answer per architecture (torch's capability,
  properties and name), or a module keeping one of those functions as its own name, which
  would then miss the platform's answers;
- an attempt to import a package kvrig stands in for on some platforms (AMD's aiter,
  vllm_xpu_kernels, amd-smi), which a library would find there and not here;
- any module of vLLM.

Native code reading the environment is not watched: none of these variables is read there.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from kvrig.run.emulation.chosen import DeviceUnchosen, asked_from

OPTIONAL = "?"  # as kvrig.run.forkserver's: a module this environment lacks is skipped
# The devices' visibility variables differ by platform (HIP's for ROCm, Level Zero's for
# XPU) and are read by vLLM or a device runtime, neither of which the root loads.
TIER_PREFIXES = ("VLLM_", "KVRIG_", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
STOOD_IN = ("aiter", "vllm_xpu_kernels", "amdsmi")
DEVICE_QUERIES = ("get_device_properties", "get_device_capability", "get_device_name")
# What every emulated platform's import of vLLM 0.33.0 and 0.34.0 loads outside vLLM, in
# the order it does (measured with -X importtime: each a module vLLM's own code imports,
# 30 ms or more with what it imports); torch first, so the watch guards its queries before
# anything else loads.
NEUTRAL = tuple(
    f"{OPTIONAL}{m}"
    for m in (
        "torch",
        "torch._inductor.custom_graph_pass",
        "torch._inductor.compile_fx",
        "torch._dynamo.repro.after_dynamo",
        "torch.utils.cpp_extension",
        "torch.export",
        "torch.distributions",
        "torch.nested",
        "torch.optim",
        "torch.profiler",
        "msgspec",
        "pydantic",
        "pydantic.types",
        "pydantic.dataclasses",
        "regex",
        "psutil",
        "zmq",
        "urllib3.util",
        "transformers",
        "transformers.models.auto.image_processing_auto",
        "transformers.models.auto.tokenization_auto",
        "transformers.models.auto.modeling_auto",
        "transformers.video_processing_utils",
        "aiohttp",
        "requests",
        "torchcodec.decoders",
        "cv2",
        "prometheus_client",
        "cpuinfo",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "xgrammar.exception",
        "xgrammar.structural_tag",
        "xgrammar.builtin_structural_tag",
        "xgrammar.testing",
        "triton.experimental.gluon",
        "fastsafetensors",
        "cutlass",
        "compressed_tensors.quantization",
        "numba.core.config",
        "numba.core.types",
        "numba.misc.special",
        "numba.core.decorators",
        "numba.np.ufunc",
    )
)
# A platform's own libraries, imported by its parent under the same watch: XPU's import of
# vLLM loads no FlashInfer.
PLATFORM_NEUTRAL = {
    "cuda": (f"{OPTIONAL}flashinfer", f"{OPTIONAL}flashinfer.comm"),
    "rocm": (f"{OPTIONAL}flashinfer", f"{OPTIONAL}flashinfer.comm"),
    "xpu": (),
}


def in_tier(key: str) -> bool:
    """Whether a variable is one a platform's parent may add to the root's environment."""
    return key.startswith(TIER_PREFIXES)


def root_env(env: Mapping[str, str]) -> dict[str, str]:
    """A platform parent's environment without what is its own: the root's."""
    return {k: v for k, v in env.items() if not in_tier(k)}


class Watch:
    """Notes, while libraries load, whatever of theirs would differ between two parents
    forked after them (the module's docstring); `findings()` says what was seen."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        # (namespace, name) -> (torch's own query, the guard standing in for it)
        self._guards: dict[tuple[ModuleType, str], tuple[Any, Any]] = {}
        self._finder = _StoodIn(self)
        self._environ_class: type | None = None

    def note(self, what: str) -> None:
        self.seen.append(f"{asked_from(traceback.extract_stack()[:-2])}: {what}")

    def start(self) -> None:
        self._environ_class = type(os.environ)
        os.environ.__class__ = _watched_environ(self._environ_class, self)
        sys.meta_path.insert(0, self._finder)

    def guard_torch(self) -> None:
        """Replaces torch's device queries by ones that note a call (once torch loaded)."""
        torch = sys.modules.get("torch")
        for namespace in (getattr(torch, "cuda", None), getattr(torch, "xpu", None)):
            for name in DEVICE_QUERIES if namespace is not None else ():
                if hasattr(namespace, name):
                    guard = self._guard(f"{namespace.__name__}.{name}")
                    self._guards[(namespace, name)] = (getattr(namespace, name), guard)
                    setattr(namespace, name, guard)

    def _guard(self, name: str) -> Any:
        def asked(*_args: Any, **_kwargs: Any) -> Any:
            self.note(f"asked {name}() while no platform is chosen")
            raise DeviceUnchosen(f"{name}() asked in the root parent, which has no device")

        asked.__qualname__ = f"kvrig_root_guard.{name}"
        return asked

    def findings(self, modules: Mapping[str, Any] | None = None) -> list[str]:
        modules = sys.modules if modules is None else modules
        found = list(self.seen)
        guards = [guard for _, guard in self._guards.values()]
        found += [f"kept {n} as its own name" for n in bound(modules, guards)]
        found += [f"vLLM's {m} loaded" for m in sorted(modules) if m.split(".")[0] == "vllm"]
        return found

    def stop(self) -> None:
        """Gives torch its queries back and the environment its class (in a parent forked
        from the root, before anything else loads)."""
        for (namespace, name), (original, _) in self._guards.items():
            setattr(namespace, name, original)
        self._guards.clear()
        if self._environ_class is not None:
            os.environ.__class__ = self._environ_class
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)


def bound(modules: Mapping[str, Any], guards: Sequence[Any]) -> list[str]:
    """`module.name` for each module attribute that is one of the guards, outside the
    namespace the guard stands in: a module that took torch's query by name."""
    wanted = {id(g): g for g in guards}
    out = []
    for mod_name, module in list(modules.items()):
        if module is None or mod_name in ("torch.cuda", "torch.xpu"):
            continue
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if id(value) in wanted and wanted[id(value)] is value:
                out.append(f"{mod_name}.{attr}")
    return out


def _watched_environ(base: type, watch: Watch) -> type:
    class WatchedEnviron(base):  # type: ignore[misc, valid-type]
        def __getitem__(self, key: str) -> str:
            if isinstance(key, str) and in_tier(key):
                watch.note(f"looked up {key} in the environment")
            return super().__getitem__(key)

    return WatchedEnviron


class _StoodIn(importlib.abc.MetaPathFinder):
    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname.split(".")[0] in STOOD_IN:
            self.watch.note(f"tried to import {fullname}, which kvrig stands in for")
        return None
