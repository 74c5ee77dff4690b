"""The local base image: which public bases it stands in for, and how it is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.containers import base_image as b


@pytest.mark.parametrize(
    "public, suite",
    [
        ("python:3.12-slim-bookworm", "bookworm"),
        ("docker.io/library/python:3.11-slim-bookworm", "bookworm"),
        # The PyPI wheels bring their CUDA libraries, the host its driver.
        ("nvidia/cuda:13.0.2-runtime-ubuntu24.04", "bookworm"),
        ("nvidia/cuda:13.0.2-devel-ubuntu24.04", None),
        ("intel/deep-learning-essentials:2025.3.2-0-devel-ubuntu24.04", None),
        ("python:3.12-slim-trixie", None),
    ],
)
def test_which_bases_a_local_debian_can_stand_in_for(public: str, suite: str | None) -> None:
    assert b.can_stand_in(public) == suite


def test_debootstrap_makes_a_minimal_root_with_python() -> None:
    cmd = b.debootstrap_command(Path("/tmp/r"), "bookworm", "http://mirror/debian")
    assert cmd[:2] == ["debootstrap", "--variant=minbase"]
    assert "--include=python3,python3-venv,ca-certificates" in cmd
    assert cmd[-3:] == ["bookworm", "/tmp/r", "http://mirror/debian"]
    assert b.import_command("podman", "localhost/kvrig-base:bookworm") == [
        "podman",
        "import",
        "-",
        "localhost/kvrig-base:bookworm",
    ]


def test_missing_debootstrap_is_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(b.shutil, "which", lambda name: None)
    with pytest.raises(b.BaseImageError, match="needs debootstrap") as exc:
        b.build("podman", b.local_tag())
    assert "\n" not in str(exc.value)


def test_non_root_is_told_to_use_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(b.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(b.os, "geteuid", lambda: 1000)
    with pytest.raises(b.BaseImageError, match="must run as root"):
        b.build("podman", b.local_tag())
