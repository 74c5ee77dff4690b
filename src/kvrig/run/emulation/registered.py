"""vLLM's model registry told of the model classes an emulated parent has imported.

vLLM inspects a lazily registered model class in a fresh interpreter, so that the
inspection cannot initialise CUDA, and caches the answer per environment
(kvrig.run.cell.device_env): in a new environment each model costs a cell one more import
of vLLM. An emulated parent has no CUDA and has imported the classes already, so
registering each with `ModelRegistry.register_model` runs the same inspection
(`_ModelInfo.from_model_cls`) here, once. A module that does not import is left to vLLM's
own inspection.
"""

from __future__ import annotations

import contextlib
import importlib

from kvrig.define import models
from kvrig.run.vllm_plugin.symbols import need

USER = "kvrig's emulated parent"
# The architectures vLLM gives the drafters of the matrix's speculative methods (MTP of
# Qwen3-Next and DeepSeek, EAGLE and EAGLE-3 over Llama): none is in a shipped config.
DRAFTERS = ("Qwen3NextMTP", "DeepSeekMTPModel", "EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM")


def architectures() -> list[str]:
    """The architectures the shipped miniatures name."""
    names = (models.shipped_config(n).get("architectures") or [] for n in models.shipped_names())
    return sorted({a for arch in names for a in arch} | set(DRAFTERS))


def register_imported() -> list[str]:
    """Registers each of those architectures whose module imports here; returns them."""
    registry = need("vllm.model_executor.models.registry.ModelRegistry", USER)
    done = []
    for arch in architectures():
        entry = registry.models.get(arch)
        module = None
        with contextlib.suppress(Exception):  # left to vLLM's own inspection
            module = importlib.import_module(getattr(entry, "module_name", ""))
        cls = getattr(module, getattr(entry, "class_name", ""), None) if module else None
        if cls is not None:
            registry.register_model(arch, cls)
            done.append(arch)
    return done


REGISTERED = register_imported()
