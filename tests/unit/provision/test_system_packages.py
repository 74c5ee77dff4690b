"""The Debian-package step: what it installs, and the paragraph when it cannot."""

from __future__ import annotations

import pytest

from kvrig.provision import system_packages as sp


def test_missing_keeps_order_and_drops_installed() -> None:
    have = {"podman"}
    assert sp.missing(["chromium", "podman", "runc"], have.__contains__) == ["chromium", "runc"]


def test_install_commands_update_then_install_without_prompts() -> None:
    cmds = sp.install_commands(["chromium"])
    assert cmds[0][:2] == ["apt-get", "update"]
    assert cmds[1][:3] == ["apt-get", "install", "-y"]
    assert cmds[1][-1] == "chromium"
    assert sp.install_commands([]) == []


def test_not_root_names_the_packages_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sp, "installed", lambda _p: False)
    with pytest.raises(sp.SystemPackageError) as err:
        sp.ensure(["chromium", "chromium-driver"], is_root=False)
    msg = str(err.value)
    assert "chromium, chromium-driver" in msg
    assert "apt-get install chromium chromium-driver" in msg


def test_nothing_missing_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sp, "installed", lambda _p: True)
    assert sp.ensure(["chromium"], is_root=False) == []
