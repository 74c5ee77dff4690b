"""Mutations of vLLM for the mutation check, applied in memory in every vLLM process.

The mutation check proves that the rig notices when vLLM's early check is gone. Editing
the installed vLLM would change the file in uv's cache too (uv installs by hard-linking
from it) and every environment linked to it, for good if the run is killed midway; so
the plugin, which vLLM loads in the front end, the engine core and every worker, replaces
the method in memory instead, only in a cell whose environment asks for it.
"""

from __future__ import annotations

from typing import Any

MUTATIONS = ("no_early_check",)


def install(name: str) -> None:
    if name not in MUTATIONS:
        raise ValueError(f"unknown kvrig mutation {name!r}; known: {', '.join(MUTATIONS)}")
    from vllm.platforms.interface import Platform

    def _check_aligned_block_size(cls: type, *args: Any, **kwargs: Any) -> None:
        return None  # the early check is gone: alignment goes unchecked

    Platform._check_aligned_block_size = classmethod(_check_aligned_block_size)  # type: ignore[method-assign,assignment]
