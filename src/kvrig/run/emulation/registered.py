"""vLLM's model registry told of the model classes an emulated parent has imported.

vLLM registers most model classes lazily, by module name, and inspects one (is it hybrid,
does it keep a state, ...) in a fresh interpreter the first time an engine resolves it, so
that the inspection cannot initialise CUDA; the answer is cached under the environment's
vLLM cache root (kvrig.run.cell.device_env). In a new environment every model the matrix
uses therefore costs a cell one more import of vLLM, and two columns starting together pay
it twice. An emulated parent has no CUDA to initialise and has imported those classes
already: registering each with vLLM's own `ModelRegistry.register_model` gives the same
inspection (`_ModelInfo.from_model_cls`, which the fresh interpreter runs too), here, once.

The modules of the matrix's architectures and of the drafters vLLM makes for its
speculative methods are imported here (a model module reads the device as it loads: this
runs in an architecture's parent, kvrig.run.forkserver.DEVICE_READING); one that does not
import is left to vLLM's inspection, as before.
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
