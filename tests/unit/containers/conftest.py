"""Fixtures of the container commands' tests (the data they build on is in
container_builders.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from kvrig.provision import index

from ..container_builders import write_checkout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A minimal checkout: what the image is built from."""
    return write_checkout(tmp_path)


@pytest.fixture(autouse=True)
def _no_package_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan reads its release's pins from the index when the platform has pin_overrides:
    here only from a fake one (provision/fake_index.py), handed in, never the network."""

    def refuse(url: str, headers: Mapping[str, str]) -> index.Response:
        raise AssertionError(f"a container test read the network: {url}")

    monkeypatch.setattr(index, "http_get", refuse)
