"""Empty stand-ins for a device's kernel package, found ahead of any real one.

vLLM's XPU code imports vllm_xpu_kernels' compiled modules at load, and its ROCm
selection lists AITER's backends only where an `aiter` package is findable; neither
package can serve a host without the device. vLLM's own XPU selection tests run on CPU
with empty stand-ins for such modules, and so do the emulated columns: every module of
the package is made on demand (so a release that imports another one gets it too), every
name asked of it is a class vLLM may import or subclass, and building or calling one
raises, saying it is a stand-in, so no kernel ever runs unnoticed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types


def stub_attribute(module: str, name: str, why: str) -> type:
    """A name a stand-in module is asked for: a class that refuses to be built."""
    if name.startswith("__"):
        raise AttributeError(name)

    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{module}.{name}: {why}")

    return type(name, (), {"__module__": module, "__qualname__": name, "__init__": refuse})


class StubModule(types.ModuleType):
    """A module whose every missing name is a refusing class (kept once made)."""

    __kvrig_why__ = ""

    def __getattr__(self, name: str) -> type:
        value = stub_attribute(self.__name__, name, self.__kvrig_why__)
        setattr(self, name, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `package` and every `package.*` module as an empty stand-in."""

    def __init__(self, package: str, why: str) -> None:
        self.package = package
        self.why = why

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name != self.package and not name.startswith(f"{self.package}."):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []  # a package: its submodules come from this finder too
        module.__dict__["__kvrig_stub__"] = True
        module.__dict__["__kvrig_why__"] = self.why
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(package: str, why: str, modules: tuple[str, ...] = ()) -> None:
    """`package` as stand-ins ahead of any real one, for the process; `modules` imported
    at once (those vLLM imports at load)."""
    if not any(isinstance(f, StubFinder) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder(package, why))
    for name in modules:
        importlib.import_module(name)
