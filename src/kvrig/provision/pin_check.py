"""Before uv runs: the release's exact pins against the indexes uv will read.

A pin the index does not serve stops the install here with one paragraph naming the
package and the way to another version, rather than deep in uv's resolver. Where the
index cannot be reached, that is one line and uv has the last word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvrig.provision import index as index_mod
from kvrig.provision import pins
from kvrig.provision.index import Get, Unreachable, http_get
from kvrig.provision.install import Plan, Release
from kvrig.provision.pins import Override, Pin

# Pages of the simple API read at once (one per pinned package; vLLM pins about 16).
WORKERS = 8


@dataclass(frozen=True)
class Sources:
    """Where uv looks for packages: the default index, further ones, find-links."""

    index: str
    extra_indexes: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def describe(self) -> str:
        indexes = (self.index, *self.extra_indexes)
        text = (
            f"the package index ({indexes[0]})"
            if len(indexes) == 1
            else f"the package indexes ({', '.join(indexes)})"
        )
        if self.find_links:
            text += f" and the find-links location {' '.join(self.find_links)}"
        return text

    @property
    def further(self) -> bool:
        return bool(self.extra_indexes or self.find_links)

    def does(self) -> str:
        """The sources with their verb, for "which ... not serve"."""
        return f"{self.describe()} {'do' if self.further else 'does'}"


def sources_for(plan: Plan, environ: Mapping[str, str]) -> Sources:
    """The indexes and folders uv is given by the plan and its environment."""
    extra = [*plan.option("--extra-index-url"), *index_mod.extra_indexes(environ)]
    links = [*plan.option("--find-links"), *(environ.get("UV_FIND_LINKS") or "").split()]
    return Sources(index_mod.default_index(environ), tuple(extra), tuple(links))


@dataclass(frozen=True)
class Checked:
    """What the check found: the release's pins (None: not read), the matrix's pin
    overrides it calls for, and the lines to print."""

    declared: list[Pin] | None = None
    applied: list[Override] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """What the check is asked about: the plan, the platform it installs (whose
    pin_overrides apply) and the command a user reruns with an override."""

    plan: Plan
    platform: str
    pin_overrides: Mapping[str, str]
    command: str


def check(req: Request, environ: Mapping[str, str], get: Get = http_get) -> Checked:
    """The pins of the plan's release against its sources; raises pins.PinError with the
    paragraph when one is served nowhere and nothing overrides it."""
    release = req.plan.release
    if release is None:
        return Checked(lines=["kvrig: a vLLM built from git: its pins are left to uv"])
    if index_mod.offline(environ):
        return Checked(lines=[f"kvrig: uv is offline (UV_OFFLINE): {release}'s pins not checked"])
    sources = sources_for(req.plan, environ)
    try:
        declared = release_pins(release, sources, get)
    except Unreachable as exc:
        return Checked(lines=[_unchecked(release, exc)])
    applied = [
        o
        for o in pins.from_matrix(req.pin_overrides, declared, req.platform, str(release))
        if o.key not in {u.key for u in req.plan.overrides}  # the user's own wins
    ]
    overridden = {o.key for o in (*req.plan.overrides, *applied)} | set(req.plan.excluded)
    try:
        gaps = _gaps(declared, overridden, sources, get)
    except Unreachable as exc:
        return Checked(declared, applied, [_unchecked(release, exc)])
    if gaps:
        raise pins.PinError(
            pins.refusal(str(release), gaps, sources.does(), req.command, req.platform)
        )
    return Checked(declared, applied, _said(release, declared, applied, sources))


def _unchecked(release: Release, exc: Exception) -> str:
    return f"kvrig: could not check {release}'s pins against the index ({exc}); uv decides"


def _said(
    release: Release, declared: Sequence[Pin], applied: Sequence[Override], sources: Sources
) -> list[str]:
    lines = [
        f"kvrig: {release} pins {len(declared)} package(s) exactly, each served"
        f" ({sources.describe()}) or overridden"
    ]
    lines += [
        f"kvrig: {o.replaces}; {o.source} takes {o.requirement} instead: the environment is"
        " not the release's own"
        for o in applied
    ]
    return lines


def release_pins(
    release: Release,
    sources: Sources,
    get: Get = http_get,
    environment: Mapping[str, str] | None = None,
) -> list[Pin]:
    """The release's exact pins that hold where it is installed (this interpreter, unless
    `environment` says otherwise); raises Unreachable when its metadata cannot be read."""
    return pins.declared_pins(_metadata(release, sources, get), environment)


def _metadata(release: Release, sources: Sources, get: Get) -> str:
    """The release's METADATA: the wheel file's, or the index's (then the further ones)."""
    if release.wheel:
        return index_mod.wheel_metadata(release.wheel)
    assert release.version is not None
    first: Unreachable | None = None
    for where in (sources.index, *sources.extra_indexes):
        try:
            return index_mod.release_metadata(where, release.package, release.version, get)
        except Unreachable as exc:
            first = first or exc
    raise first or Unreachable(f"no index lists {release}")


def _gaps(
    declared: Sequence[Pin], overridden: set[str], sources: Sources, get: Get
) -> list[pins.Gap]:
    """The pins no source serves: the default index first, and for what it lacks the
    further indexes and find-links locations, whose versions the refusal lists too."""
    wanted = [p for p in declared if p.key not in overridden]
    served = _versions([sources.index], [p.name for p in wanted], get)
    gaps = pins.unserved(wanted, served)
    if not gaps or not sources.further:
        return gaps
    names = [g.pin.name for g in gaps]
    more = _versions(list(sources.extra_indexes), names, get)
    for folder in sources.find_links:
        for name in names:
            more.setdefault(pins.package_key(name), []).extend(
                index_mod.folder_versions(folder, name, get)
            )
    both = {k: [*served.get(k, []), *more.get(k, [])] for k in {*served, *more}}
    return pins.unserved([g.pin for g in gaps], both)


def _versions(indexes: Sequence[str], names: Sequence[str], get: Get) -> dict[str, list[str]]:
    """Each package's versions on the indexes, the pages read a few at a time."""
    jobs = [(i, n) for i in indexes for n in dict.fromkeys(names)]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        pages = list(pool.map(lambda job: index_mod.project(*job, get).versions, jobs))
    out: dict[str, list[str]] = {}
    for (_, name), versions in zip(jobs, pages, strict=True):
        out.setdefault(pins.package_key(name), []).extend(versions)
    return out
