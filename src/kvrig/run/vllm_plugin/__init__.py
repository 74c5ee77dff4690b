"""kvrig's vLLM general plugin: crafted attention backends and a block-size probe.

vLLM calls `register()` in the front end, the engine core and every worker, so whatever
a cell asks for here is in force in the worker, where `update_block_size_for_backend`
and its `_check_aligned_block_size` run. With neither KVRIG_CRAFT nor KVRIG_PROBE_FILE
set it does nothing, so installing kvrig beside vLLM changes no engine. (A changed vLLM
is an overlay, kvrig.provision.overlay, never a patch applied from here.)
"""

from __future__ import annotations

import os

CRAFT_ENV = "KVRIG_CRAFT"
PROBE_ENV = "KVRIG_PROBE_FILE"

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    craft = os.environ.get(CRAFT_ENV)
    probe_file = os.environ.get(PROBE_ENV)
    if probe_file:
        from kvrig.run.vllm_plugin import probe

        probe.install(probe_file)
    if craft:
        from kvrig.run.vllm_plugin import crafted

        crafted.install(crafted.CraftSpec.from_json(craft))
