"""kvrig's CPU-class boot: torch's probes answer for the class in KVRIG_ISA.

kvrig puts this folder first on PYTHONPATH for a cell it emulates a lesser CPU class in,
so every interpreter of the cell runs it at start-up: the warm parent, the cell's own
process, and each engine core or worker vLLM spawns (a forked one inherits the patch).
It imports nothing heavy: it waits for `torch.cpu` to be imported, then replaces
`get_capabilities()` (which torch 2.13's `_is_*_supported()` probes read) and the probes
themselves with the host's answers capped to the class (kvrig.host.isa.capped). Then it
runs the sitecustomize this folder hides, if there is one.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

_CLASS = os.environ.get("KVRIG_ISA")
_HERE = os.path.dirname(os.path.abspath(__file__))
# torch.cpu's probes and the capability each reads.
_PROBES = {
    "_is_avx2_supported": "avx2",
    "_is_avx512_supported": "avx512_f",
    "_is_avx512_bf16_supported": "avx512_bf16",
    "_is_vnni_supported": "avx512_vnni",
    "_is_amx_tile_supported": "amx_tile",
    "_is_amx_fp16_supported": "amx_fp16",
}


def _cap(module: types.ModuleType) -> None:
    from kvrig.host.isa import capped

    real = module.get_capabilities
    answers = types.MappingProxyType(capped(real(), _CLASS or ""))

    def get_capabilities() -> types.MappingProxyType[str, Any]:
        return answers

    module.get_capabilities = get_capabilities  # type: ignore[attr-defined]
    for name, key in _PROBES.items():
        setattr(module, name, lambda key=key: bool(answers.get(key, False)))


class _TorchCpuFinder:
    """Finds torch.cpu with the finders after it, and caps it once it has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch.cpu":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            _cap(module)

        loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Runs the next sitecustomize on sys.path, which this one shadows."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _CLASS:
    if "torch.cpu" in sys.modules:
        _cap(sys.modules["torch.cpu"])
    else:
        sys.meta_path.insert(0, _TorchCpuFinder())
_chain()
