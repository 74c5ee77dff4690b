"""The container-engine set-up decides from what answers, not from what is on PATH."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvrig.provision import engines as e

ALL = frozenset((*e.PODMAN_PACKAGES, "debootstrap"))
ABSENT = e.Answer(installed=False)
NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."


def facts(
    docker: e.Answer = ABSENT,
    podman: e.Answer = ABSENT,
    root: bool = True,
    have: frozenset[str] = frozenset(),
) -> e.Facts:
    return e.Facts(docker=docker, podman=podman, root=root, apt=True, have=have)


def test_docker_that_answers_is_used_and_nothing_is_installed() -> None:
    got = e.decide(facts(docker=e.Answer(True, True)), ["debootstrap"])
    assert (got.engine, got.install) == ("docker", ())


def test_a_docker_client_without_its_daemon_gets_podman_installed() -> None:
    got = e.decide(facts(docker=e.Answer(True, False, NO_DAEMON)), ["debootstrap"])
    assert got.engine == "podman"
    assert got.install == (*e.PODMAN_PACKAGES, "debootstrap")
    assert NO_DAEMON in got.reason
    assert "podman is not installed" in got.reason


def test_neither_engine_installs_podman_and_what_it_needs() -> None:
    got = e.decide(facts())
    assert got.engine == "podman"
    assert got.install == e.PODMAN_PACKAGES


def test_podman_present_gets_only_what_it_lacks() -> None:
    have = frozenset({"podman", "netavark", "aardvark-dns", "iptables"})
    got = e.decide(facts(podman=e.Answer(True, True), have=have))
    assert got.install == ("runc",)
    complete = e.decide(facts(podman=e.Answer(True, True), have=ALL), ["debootstrap"])
    assert (complete.engine, complete.install) == ("podman", ())


def test_podman_that_cannot_run_gets_its_missing_parts() -> None:
    got = e.decide(facts(podman=e.Answer(True, False, "crun: cgroups in hybrid mode")))
    assert got.install == e.PODMAN_PACKAGES
    assert "crun: cgroups in hybrid mode" in got.reason


def test_not_root_names_the_packages_and_what_to_do() -> None:
    with pytest.raises(e.SetupError) as err:
        e.decide(facts(docker=e.Answer(True, False, NO_DAEMON), root=False), ["debootstrap"])
    msg = str(err.value)
    assert "not running as root" in msg
    assert NO_DAEMON in msg
    assert "sudo apt-get install podman runc netavark aardvark-dns iptables debootstrap" in msg
    assert "\n" not in msg


def test_probing_asks_each_engine_for_info() -> None:
    asked: list[Sequence[str]] = []

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        asked.append(list(cmd))
        return (1, NO_DAEMON) if cmd[0] == "docker" else (0, "")

    found = e.facts(
        which=lambda name: f"/usr/bin/{name}" if name != "apt-get" else None,
        run=run,
        installed=lambda p: p == "podman",
    )
    assert asked == [["docker", "info"], ["podman", "info"]]
    assert found.docker == e.Answer(True, False, NO_DAEMON)
    assert found.podman == e.Answer(True, True, "")
    assert found.have == frozenset({"podman"})
    assert not found.apt


def test_the_command_refuses_in_one_paragraph(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from kvrig.cli import main

    monkeypatch.setattr(e, "facts", lambda extra: facts(root=False))
    assert main(["setup", "container-engine"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: No container engine can run a container here")
    assert err.count("\n") == 1


def test_the_engine_that_answers_is_named_and_extra_packages_are_asked_for(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from kvrig.cli import main

    asked: list[tuple[str, ...]] = []
    docker = e.Answer(installed=True, answers=True)
    monkeypatch.setattr(e, "facts", lambda extra: asked.append(tuple(extra)) or facts(docker))
    monkeypatch.setattr(e.system_packages, "ensure", lambda p: pytest.fail(f"installs {p}"))
    assert main(["setup", "container-engine", "debootstrap"]) == 0
    assert asked == [("debootstrap",)]
    assert capsys.readouterr().out.startswith("kvrig: container engine docker (")
