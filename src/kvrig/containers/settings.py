"""Engine settings for restricted hosts: which ones a host needs, and why.

Sandboxed VMs run Podman only with settings an ordinary host never needs (no default
ulimits without CAP_SYS_RESOURCE, runc with cgroupfs on a hybrid cgroup layout, which crun
refuses, a proxy's CA bundle, a local wheel folder). Each is decided from the host's facts,
so a host that needs none gets none, and each can be forced by environment variable:

    KVRIG_HOST_SETTINGS   auto (default): each setting when the host's facts call for it;
                          on: all of them (as KVRIG_PODMAN_COMPAT=1); off: none
    KVRIG_RUNTIME         an OCI runtime for Podman (e.g. runc), or `default`
    KVRIG_CGROUP_MANAGER  cgroupfs or systemd, or `default`
    KVRIG_ULIMITS         `none` (a containers.conf with default_ulimits = []) or `default`
    KVRIG_NETWORK         `host` (build and run on the host's network) or `default`
    KVRIG_CA_BUNDLE       a CA bundle file mounted into the build, or `none`; auto takes
                          $PIP_CERT, $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE
    KVRIG_FIND_LINKS      a folder of wheels mounted into the build, or `none`; auto takes
                          $PIP_FIND_LINKS when it holds a torch wheel
    KVRIG_EXTRA_INDEX_URL an extra package index for the build (space-separated list)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

MODES = ("auto", "on", "off")
CA_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
CAP_SYS_RESOURCE = 24
CONTAINERS_CONF_TEXT = "[containers]\ndefault_ulimits = []\n"
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
UNSET = ("", "default", "none", "0", "off")


class SettingsError(Exception):
    """A bad setting; the message is one paragraph."""


@dataclass(frozen=True)
class HostFacts:
    """What decides the settings, read once from the host."""

    cap_sys_resource: bool = True
    cgroup_hybrid: bool = False
    files: frozenset[str] = frozenset()
    torch_wheel_dirs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class EngineSettings:
    """The settings in force for one run, with a line per setting saying why."""

    runtime: str | None = None
    cgroup_manager: str | None = None
    no_default_ulimits: bool = False
    host_network: bool = False
    ca_bundle: str | None = None
    find_links: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    containers_conf: Path | None = None
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def any(self) -> bool:
        return bool(
            self.runtime
            or self.cgroup_manager
            or self.no_default_ulimits
            or self.host_network
            or self.ca_bundle
            or self.find_links
            or self.extra_index_urls
        )


# An ordinary host's settings: none.
NO_SETTINGS = EngineSettings()


def _mode(env: Mapping[str, str], flag: str | None) -> str:
    if flag:
        return flag
    if env.get("KVRIG_PODMAN_COMPAT", "") not in ("", "0"):
        return "on"
    mode = env.get("KVRIG_HOST_SETTINGS", "auto") or "auto"
    if mode not in MODES:
        raise SettingsError(
            f"KVRIG_HOST_SETTINGS={mode!r} is not one of {', '.join(MODES)}. Leave it unset"
            " (auto: each setting when this host needs it), or set on or off."
        )
    return mode


def _first_ca(env: Mapping[str, str], facts: HostFacts) -> str | None:
    for name in CA_ENV:
        value = env.get(name)
        if value and value in facts.files:
            return value
    return None


@dataclass
class _Picker:
    """Decides the settings one at a time, keeping the line saying why each is in force: a
    variable set by hand wins, then the mode, then (Podman, auto) the host's facts."""

    env: Mapping[str, str]
    mode: str
    engine: str
    reasons: list[str] = field(default_factory=list)

    def pick(
        self, name: str, needed: bool, value: str, why: str, off: tuple[str, ...] = UNSET
    ) -> str | None:
        given = self.env.get(name)  # absent: decide from the facts
        if given is not None:
            if given.lower() in off:
                return None
            self.reasons.append(f"{name}={given}")
            return given
        if self.mode == "off":
            return None
        auto = self.mode == "auto" and self.engine == "podman"
        if value and (self.mode == "on" or (auto and needed)):
            self.reasons.append(why)
            return value
        return None


def _check_understood(ulimits: str | None, network: str | None) -> None:
    """A setting that takes one value refuses any other given by hand: read as off, it
    would build without what the user asked for, and say nothing."""
    if ulimits is not None and ulimits != "none":
        raise SettingsError(
            f"KVRIG_ULIMITS={ulimits!r} is not understood. Set it to `none` (no default"
            " ulimits, for hosts whose root lacks CAP_SYS_RESOURCE) or `default`."
        )
    if network is not None and network != "host":
        raise SettingsError(
            f"KVRIG_NETWORK={network!r} is not understood. Set it to `host` (build and run"
            " on the host's network) or `default`."
        )


def decide(
    engine: str,
    facts: HostFacts,
    env: Mapping[str, str],
    cache_dir: Path,
    mode_flag: str | None = None,
) -> EngineSettings:
    """The settings for `engine` on a host with `facts` (pure).

    Docker hosts get none automatically: Docker's daemon owns ulimits, runtime and cgroups,
    and its build takes no volumes, so nothing changes for its users unless asked for.
    """
    picker = _Picker(env, _mode(env, mode_flag), engine)
    pick = picker.pick
    runtime = pick(
        "KVRIG_RUNTIME",
        facts.cgroup_hybrid,
        "runc",
        "runtime runc: the host has a hybrid cgroup v1/v2 layout, which crun refuses",
    )
    cgroup_manager = pick(
        "KVRIG_CGROUP_MANAGER",
        facts.cgroup_hybrid,
        "cgroupfs",
        "cgroup manager cgroupfs: systemd cannot manage a hybrid cgroup layout",
    )
    ulimits = pick(
        "KVRIG_ULIMITS",
        not facts.cap_sys_resource,
        "none",
        "no default ulimits (CONTAINERS_CONF): root here lacks CAP_SYS_RESOURCE, so the"
        " runtime cannot raise RLIMIT_NOFILE",
        off=tuple(v for v in UNSET if v != "none"),
    )
    network = pick("KVRIG_NETWORK", False, "host", "host network for build and run")
    found_ca = _first_ca(env, facts)
    ca = pick(
        "KVRIG_CA_BUNDLE",
        found_ca is not None,
        found_ca or DEFAULT_CA_BUNDLE,
        f"CA bundle {found_ca or DEFAULT_CA_BUNDLE} mounted into the build (named by"
        f" {next((n for n in CA_ENV if env.get(n) == found_ca), 'default')})",
    )
    links_env = env.get("PIP_FIND_LINKS") or ""
    links = pick(
        "KVRIG_FIND_LINKS",
        links_env in facts.torch_wheel_dirs,
        links_env,
        f"wheel folder {links_env} ($PIP_FIND_LINKS, holds torch) mounted into the build",
    )
    extra = tuple((env.get("KVRIG_EXTRA_INDEX_URL") or "").split())
    if extra:
        picker.reasons.append(f"extra index {' '.join(extra)}")
    _check_understood(ulimits, network)
    if engine == "docker" and (runtime or cgroup_manager or ulimits or ca or links):
        raise SettingsError(
            "Runtime, cgroup manager, ulimits, CA bundle and wheel-folder settings apply to"
            " Podman (they are Podman's global flags, containers.conf and build volumes);"
            " with Docker configure its daemon instead. Pass `--engine podman`, or unset"
            " KVRIG_HOST_SETTINGS / KVRIG_PODMAN_COMPAT and the KVRIG_* setting named."
        )
    conf = None
    if ulimits == "none":
        conf = Path(env.get("KVRIG_CONTAINERS_CONF") or cache_dir / "containers.conf")
    return EngineSettings(
        runtime=runtime,
        cgroup_manager=cgroup_manager,
        no_default_ulimits=ulimits == "none",
        host_network=network == "host",
        ca_bundle=ca,
        find_links=links,
        extra_index_urls=extra,
        containers_conf=conf,
        reasons=tuple(picker.reasons),
    )


def may_add_host_network(engine: str, env: Mapping[str, str], mode_flag: str | None) -> bool:
    """Whether a probe may turn the host network on: Podman in auto mode, not set by hand."""
    return engine == "podman" and _mode(env, mode_flag) == "auto" and "KVRIG_NETWORK" not in env


def with_host_network(settings: EngineSettings) -> EngineSettings:
    why = "host network for build and run: a container on the default network did not start"
    return replace(settings, host_network=True, reasons=(*settings.reasons, why))


def global_flags(settings: EngineSettings) -> list[str]:
    flags: list[str] = []
    if settings.runtime:
        flags += ["--runtime", settings.runtime]
    if settings.cgroup_manager:
        flags += [f"--cgroup-manager={settings.cgroup_manager}"]
    return flags


def engine_env(settings: EngineSettings) -> dict[str, str]:
    """What the engine's own environment needs (the ulimit-free containers.conf)."""
    if settings.containers_conf is not None:
        return {"CONTAINERS_CONF": str(settings.containers_conf)}
    return {}


# --- facts (side effects) ---------------------------------------------------------------


def parse_cap_eff(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return None


def is_hybrid_cgroup(mounts: str) -> bool:
    """cgroup v1 controllers under /sys/fs/cgroup plus a v2 tree at .../unified."""
    v1 = v2_unified = v2_root = False
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point, kind = parts[1], parts[2]
        if kind == "cgroup" and point.startswith("/sys/fs/cgroup/"):
            v1 = True
        elif kind == "cgroup2" and point == "/sys/fs/cgroup/unified":
            v2_unified = True
        elif kind == "cgroup2" and point == "/sys/fs/cgroup":
            v2_root = True
    return v1 and v2_unified and not v2_root


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def read_host_facts(env: Mapping[str, str]) -> HostFacts:
    cap = parse_cap_eff(_read("/proc/self/status"))
    files = {v for n in (*CA_ENV, "KVRIG_CA_BUNDLE") if (v := env.get(n)) and os.path.isfile(v)}
    links = env.get("PIP_FIND_LINKS") or ""
    torch_dirs = set()
    if links and os.path.isdir(links) and any(Path(links).glob("torch-*.whl")):
        torch_dirs.add(links)
    return HostFacts(
        cap_sys_resource=cap is None or bool(cap >> CAP_SYS_RESOURCE & 1),
        cgroup_hybrid=is_hybrid_cgroup(_read("/proc/mounts")),
        files=frozenset(files),
        torch_wheel_dirs=frozenset(torch_dirs),
    )


def write_containers_conf(settings: EngineSettings) -> None:
    if settings.containers_conf is not None:
        settings.containers_conf.parent.mkdir(parents=True, exist_ok=True)
        settings.containers_conf.write_text(CONTAINERS_CONF_TEXT)
