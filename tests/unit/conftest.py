"""Fixtures of the unit tests (the data they build on is in builders.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from .builders import BASE

pytest_plugins = ["pytester"]


@pytest.fixture
def base() -> dict[str, Any]:
    return copy.deepcopy(BASE)


@pytest.fixture
def write_matrix(tmp_path: Path):
    def write(data: Any, text: str | None = None) -> Path:
        path = tmp_path / "matrix.yaml"
        path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
        return path

    return write
