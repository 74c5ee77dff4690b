"""Which restricted-host settings a host gets: decided from its facts, forced by variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.containers import settings as es

CA = "/etc/ssl/certs/ca-certificates.crt"
RESTRICTED = es.HostFacts(
    cap_sys_resource=False,
    cgroup_hybrid=True,
    files=frozenset({CA}),
    torch_wheel_dirs=frozenset({"/opt/wheels"}),
)
ENV = {"PIP_CERT": CA, "PIP_FIND_LINKS": "/opt/wheels"}
CACHE = Path("/cache/kvrig")

# As read on a sandboxed VM: cgroup v1 controllers plus a v2 tree, root without bit 24.
HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
STATUS_WITHOUT_SYS_RESOURCE = "Name:\tcat\nCapEff:\t000001fffeffffff\n"
STATUS_FULL = "CapEff:\t000001ffffffffff\n"


def test_restricted_podman_host_gets_every_setting_with_a_reason() -> None:
    s = es.decide("podman", RESTRICTED, ENV, CACHE)
    assert (s.runtime, s.cgroup_manager) == ("runc", "cgroupfs")
    assert s.no_default_ulimits
    assert s.containers_conf == CACHE / "containers.conf"
    assert s.ca_bundle == CA
    assert s.find_links == "/opt/wheels"
    assert not s.host_network
    assert len(s.reasons) == 5
    assert es.global_flags(s) == ["--runtime", "runc", "--cgroup-manager=cgroupfs"]
    assert es.engine_env(s) == {"CONTAINERS_CONF": str(CACHE / "containers.conf")}


def test_ordinary_podman_host_gets_none() -> None:
    assert es.decide("podman", es.HostFacts(), {}, CACHE) == es.NO_SETTINGS


def test_docker_gets_none_automatically() -> None:
    assert es.decide("docker", RESTRICTED, ENV, CACHE) == es.NO_SETTINGS


def test_wheel_folder_without_torch_is_not_mounted() -> None:
    facts = es.HostFacts(torch_wheel_dirs=frozenset())
    assert es.decide("podman", facts, {"PIP_FIND_LINKS": "/opt/other"}, CACHE).find_links is None


def test_ca_bundle_named_but_missing_is_not_mounted() -> None:
    assert es.decide("podman", es.HostFacts(), {"PIP_CERT": "/nope.pem"}, CACHE).ca_bundle is None


def test_each_setting_can_be_turned_off_alone() -> None:
    env = {**ENV, "KVRIG_RUNTIME": "default", "KVRIG_CA_BUNDLE": "none"}
    s = es.decide("podman", RESTRICTED, env, CACHE)
    assert s.runtime is None
    assert s.ca_bundle is None
    assert s.cgroup_manager == "cgroupfs"
    assert s.no_default_ulimits


def test_mode_off_and_on() -> None:
    assert es.decide("podman", RESTRICTED, ENV, CACHE, "off") == es.NO_SETTINGS
    on = es.decide("podman", es.HostFacts(), {}, CACHE, "on")
    assert on.runtime == "runc"
    assert on.host_network
    assert on.ca_bundle == es.DEFAULT_CA_BUNDLE
    # No wheel folder is named, so none is mounted nor claimed.
    assert on.find_links is None
    assert not any("wheel folder" in r for r in on.reasons)
    assert es.decide("podman", es.HostFacts(), {"KVRIG_PODMAN_COMPAT": "1"}, CACHE) == on


def test_explicit_settings_on_an_ordinary_host() -> None:
    env = {"KVRIG_NETWORK": "host", "KVRIG_ULIMITS": "none", "KVRIG_CGROUP_MANAGER": "systemd"}
    s = es.decide("podman", es.HostFacts(), env, CACHE)
    assert s.host_network
    assert s.no_default_ulimits
    assert s.cgroup_manager == "systemd"
    assert s.runtime is None


@pytest.mark.parametrize(
    "env, words",
    [
        ({"KVRIG_HOST_SETTINGS": "maybe"}, "KVRIG_HOST_SETTINGS='maybe'"),
        ({"KVRIG_ULIMITS": "high"}, "KVRIG_ULIMITS='high'"),
        ({"KVRIG_NETWORK": "bridge"}, "KVRIG_NETWORK='bridge'"),
    ],
)
def test_bad_values_are_one_paragraph(env: dict[str, str], words: str) -> None:
    with pytest.raises(es.SettingsError) as exc:
        es.decide("podman", es.HostFacts(), env, CACHE)
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


def test_podman_settings_asked_of_docker_are_refused() -> None:
    with pytest.raises(es.SettingsError, match="apply to Podman"):
        es.decide("docker", es.HostFacts(), {"KVRIG_RUNTIME": "runc"}, CACHE)


def test_host_facts_are_read_from_proc_text() -> None:
    assert es.is_hybrid_cgroup(HYBRID_MOUNTS)
    assert not es.is_hybrid_cgroup(V2_MOUNTS)
    assert not es.is_hybrid_cgroup(HYBRID_MOUNTS.replace("cgroup2 /sys/fs/cgroup/unified", "x y"))
    cap = es.parse_cap_eff(STATUS_WITHOUT_SYS_RESOURCE)
    assert cap is not None
    assert not cap >> es.CAP_SYS_RESOURCE & 1
    full = es.parse_cap_eff(STATUS_FULL)
    assert full is not None
    assert full >> es.CAP_SYS_RESOURCE & 1


def test_containers_conf_is_written_only_when_needed(tmp_path: Path) -> None:
    es.write_containers_conf(es.decide("podman", es.HostFacts(), {}, tmp_path))
    assert not (tmp_path / "containers.conf").exists()
    es.write_containers_conf(es.decide("podman", RESTRICTED, ENV, tmp_path))
    assert "default_ulimits = []" in (tmp_path / "containers.conf").read_text()


def test_a_probe_may_add_the_host_network_only_in_auto_mode_on_podman() -> None:
    assert es.may_add_host_network("podman", {}, None)
    assert not es.may_add_host_network("docker", {}, None)
    assert not es.may_add_host_network("podman", {"KVRIG_NETWORK": "default"}, None)
    assert not es.may_add_host_network("podman", {}, "off")
    s = es.with_host_network(es.NO_SETTINGS)
    assert s.host_network
    assert "did not start" in s.reasons[-1]
