"""Fixtures of the container commands' tests (the data they build on is in
container_builders.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..container_builders import write_checkout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A minimal checkout: what the image is built from."""
    return write_checkout(tmp_path)
