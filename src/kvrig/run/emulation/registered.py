"""vLLM's model registry told of the model classes an emulated parent has imported.

vLLM registers most model classes lazily, by module name, and inspects one (is it hybrid,
does it keep a state, ...) in a fresh interpreter the first time an engine resolves it, so
that the inspection cannot initialise CUDA; the answer is cached under the environment's
vLLM cache root (kvrig.run.cell.device_env). In a new environment every model the matrix
uses therefore costs a cell one more import of vLLM, and two columns starting together pay
it twice. An emulated parent has no CUDA to initialise and has imported those classes
already: registering each with vLLM's own `ModelRegistry.register_model` gives the same
inspection (`_ModelInfo.from_model_cls`, which the fresh interpreter runs too), here, once.

Only classes whose module the parent has imported are registered, so nothing new is
imported (a model module reads the device as it loads: this runs in an architecture's
parent, kvrig.run.forkserver.DEVICE_READING); any other is left to vLLM, as before.
"""

from __future__ import annotations

import sys

from kvrig.define import models
from kvrig.run.vllm_plugin.symbols import need

USER = "kvrig's emulated parent"


def architectures() -> list[str]:
    """The architectures the shipped miniatures name."""
    names = (models.shipped_config(n).get("architectures") or [] for n in models.shipped_names())
    return sorted({a for arch in names for a in arch})


def register_imported() -> list[str]:
    """Registers each of the matrix's architectures whose class is imported here; returns
    them."""
    registry = need("vllm.model_executor.models.registry.ModelRegistry", USER)
    done = []
    for arch in architectures():
        entry = registry.models.get(arch)
        module = sys.modules.get(getattr(entry, "module_name", ""))
        cls = getattr(module, getattr(entry, "class_name", ""), None) if module else None
        if cls is not None:
            registry.register_model(arch, cls)
            done.append(arch)
    return done


REGISTERED = register_imported()
