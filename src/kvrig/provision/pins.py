"""A release's exact pins against what the package index serves, and overrides (pure).

A vLLM release pins dependencies exactly (`flashinfer-python==0.7.3`); an index that lacks
one makes uv stop with a message about `vllm>=0.34.0`, so the refusal here names the
package. An override makes the environment not the release's own, so each carries where it
came from and why, for the stamp.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any

from kvrig.define.platform_spec import EXACT_PIN, package_key

try:  # pytest depends on it, so kvrig's environments have it; the fallbacks are cruder
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - exercised by forcing HAVE_PACKAGING off
    HAVE_PACKAGING = False
else:
    HAVE_PACKAGING = True

# How many of the versions an index has a refusal lists: the ones nearest the pin.
LISTED = 6
DOCS = "docs/setup.md#pins-that-do-not-resolve"


class PinError(Exception):
    """One paragraph for the user: a pin that does not resolve, or an override that is none."""


@dataclass(frozen=True)
class Pin:
    """An exact pin, `name[extras]==version`, as a release or a user wrote it."""

    name: str
    version: str
    extras: str = ""

    @property
    def key(self) -> str:
        return package_key(self.name)

    def __str__(self) -> str:
        return f"{self.name}{self.extras}=={self.version}"

    def same(self, other: Pin) -> bool:
        """The same package at the same version, however either spells it."""
        return self.key == other.key and same_version(self.version, other.version)


def parse_pin(text: str) -> Pin | None:
    m = EXACT_PIN.match(text)
    return Pin(m["name"], m["version"], (m["extras"] or "").replace(" ", "")) if m else None


def same_version(a: str, b: str) -> bool:
    if HAVE_PACKAGING:
        try:
            return Version(a) == Version(b)
        except InvalidVersion:
            pass
    return a == b


@dataclass(frozen=True)
class Override:
    """A requirement handed to uv's --override, with where it came from and the pin it
    replaces, so the stamp can say why the environment is not the release's own."""

    requirement: str
    key: str
    source: str
    replaces: str | None = None

    def why(self) -> str:
        return f"{self.source}, for {self.replaces}" if self.replaces else self.source

    def as_json(self) -> dict[str, Any]:
        return {"requirement": self.requirement, "replaces": self.replaces, "why": self.why()}


def from_option(text: str) -> Override:
    """One `--override PKG==VER`; anything else is refused, with what to do instead."""
    pin = parse_pin(text)
    if pin is None:
        raise PinError(
            f"--override takes one exact pin, PKG==VER (for example"
            f" flashinfer-python==0.7.4), and was given {text!r}. Nothing was installed."
            " Give the package and the version to take instead of the one the release pins;"
            " for any other requirement (a range, a marker) put it on a line of a file and"
            " pass the file with --overrides FILE."
        )
    return Override(str(pin), pin.key, "--override")


_COMMENT = re.compile(r"(^|\s)#.*$")
_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*(.*)$")


def from_file(text: str, path: str) -> list[Override]:
    """The requirement lines of an --overrides file (comments and blank lines skipped), as
    uv reads them; a line that names no package is refused with its line number."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        key = requirement_key(line)
        if key is None:
            raise PinError(
                f"{path}:{number}: {line!r} is not a requirement. An --overrides file holds"
                " one requirement per line, as uv's --override reads them (PKG==VER, or any"
                " PEP 508 requirement), with # comments. Nothing was installed; fix the line"
                " and run the command again."
            )
        out.append(Override(line, key, f"--overrides {path}"))
    return out


def requirement_key(line: str) -> str | None:
    """The package a requirement line names, or None when it is not one."""
    if line.startswith("-"):
        return None  # an option (-r, -e, --index-url): uv's override file takes none
    if HAVE_PACKAGING:
        try:
            return package_key(Requirement(line).name)
        except InvalidRequirement:
            return None
    m = _NAME.match(line)
    rest = m.group(2) if m else ""
    ok = m is not None and (not rest or rest[0] in "=<>!~;(@")
    return package_key(m.group(1)) if ok and m else None


# --- what a release pins -----------------------------------------------------------------


def declared_pins(metadata: str, environment: Mapping[str, str] | None = None) -> list[Pin]:
    """The release's exact pins that apply here: its Requires-Dist lines of the form
    PKG==VER whose markers hold for this interpreter (extras not asked for do not)."""
    lines = HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []
    pick = _pin_with_packaging if HAVE_PACKAGING else _pin_without_packaging
    return [p for p in (pick(line, environment) for line in lines) if p is not None]


def _pin_with_packaging(line: str, environment: Mapping[str, str] | None) -> Pin | None:
    try:
        req = Requirement(line)
    except InvalidRequirement:
        return None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or specs[0].version.endswith(".*"):
        return None
    if req.marker is not None:
        env = {"extra": "", **(environment or {})}
        try:
            if not req.marker.evaluate(env):
                return None
        except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            return None
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return Pin(req.name, specs[0].version, extras)


def _pin_without_packaging(line: str, environment: Mapping[str, str] | None) -> Pin | None:
    """Without packaging no marker can be evaluated: a pin behind one is left out, so the
    check never refuses over a pin that may not apply (uv still has the last word)."""
    if ";" in line:
        return None
    return parse_pin(line.replace("(", "").replace(")", ""))


# --- what the index serves ----------------------------------------------------------------


def serves(pin: Pin, versions: Iterable[str]) -> bool:
    """Whether one of the versions satisfies the pin (PEP 440: ==2.13.0 takes 2.13.0+cpu)."""
    if HAVE_PACKAGING:
        try:
            spec = SpecifierSet(f"=={pin.version}")
            return any(_contains(spec, v) for v in versions)
        except InvalidSpecifier:  # an unparsable pin: compare it as text below
            pass
    return any(v == pin.version or v.split("+")[0] == pin.version for v in versions)


def _contains(spec: Any, version: str) -> bool:
    try:
        return bool(spec.contains(version, prereleases=True))
    except InvalidVersion:
        return False


def _sorted(versions: Iterable[str]) -> list[Any]:
    if not HAVE_PACKAGING:
        return []
    out = []
    for v in set(versions):
        try:
            out.append(Version(v))
        except InvalidVersion:
            continue
    return sorted(out)


def nearest(pin: Pin, versions: Sequence[str], limit: int = LISTED) -> list[str]:
    """The versions nearest the pin, newest first, so a refusal shows what one could take
    instead; pre-releases only for a pre-release pin."""
    ordered = _sorted(versions)
    if not ordered:
        return list(versions)[-limit:][::-1]
    want = Version(pin.version) if _valid(pin.version) else None
    if want is None:
        return [str(v) for v in ordered[-limit:][::-1]]
    pool = [v for v in ordered if want.is_prerelease or not v.is_prerelease] or ordered
    above = [v for v in pool if v > want]
    below = [v for v in pool if v < want]
    take_above = above[: max(limit // 2, limit - len(below))]
    take_below = below[::-1][: limit - len(take_above)]
    return [str(v) for v in take_above[::-1] + take_below]


def _valid(version: str) -> bool:
    if not HAVE_PACKAGING:
        return False
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def instead(pin: Pin, versions: Sequence[str]) -> str | None:
    """The version to suggest in its place: the nearest newer release, else the nearest
    older one (newer first: a release usually moves up to what it pins next)."""
    near = nearest(pin, versions)
    if not near:
        return None
    if not _valid(pin.version):
        return near[0]
    newer = [v for v in near if Version(v) > Version(pin.version)]
    return newer[-1] if newer else near[0]


@dataclass(frozen=True)
class Gap:
    """A pin no source serves, with the versions they do serve (None: not known)."""

    pin: Pin
    versions: list[str] | None

    @property
    def listed(self) -> list[str]:
        return nearest(self.pin, self.versions or [])

    @property
    def suggestion(self) -> Pin:
        version = instead(self.pin, self.versions or []) or "VERSION"
        return Pin(self.pin.name, version, self.pin.extras)


def unserved(
    pins: Sequence[Pin],
    served: Mapping[str, Sequence[str]],
    overridden: Iterable[str] = (),
) -> list[Gap]:
    """The pins none of the served versions satisfies (`served`: versions by package key),
    leaving out the packages an override or an exclusion takes care of."""
    skip = set(overridden)
    return [
        Gap(p, list(served.get(p.key, [])))
        for p in pins
        if p.key not in skip and not serves(p, served.get(p.key, []))
    ]


def from_matrix(
    pin_overrides: Mapping[str, str], declared: Sequence[Pin], platform: str, release: str
) -> list[Override]:
    """The matrix's pin overrides whose pin this release declares: one written for one
    release must not reach another's environment."""
    out = []
    for old, new in pin_overrides.items():
        was, now = parse_pin(old), parse_pin(new)
        if was is None or now is None:
            continue  # the matrix refuses these when it is loaded
        if any(was.same(p) for p in declared):
            out.append(
                Override(
                    str(now),
                    now.key,
                    f"matrix.yaml platforms.{platform}.pin_overrides",
                    f"{was} pinned by {release}",
                )
            )
    return out


def replacing(
    overrides: Sequence[Override], declared: Sequence[Pin], release: str
) -> list[Override]:
    """The overrides, each naming the release's pin it replaces where the release has one."""
    by_key = {p.key: p for p in declared}
    return [
        o
        if o.replaces or o.key not in by_key
        else Override(o.requirement, o.key, o.source, f"{by_key[o.key]} pinned by {release}")
        for o in overrides
    ]


# --- saying it ----------------------------------------------------------------------------


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _has(gap: Gap) -> str:
    if gap.versions is None:
        return "uv found no version of it there"
    if not gap.versions:
        return "it serves no version of it"
    listed = gap.listed
    more = f" ({len(set(gap.versions))} in all; the nearest, newest first)"
    return f"it has {_and(listed)}" + (more if len(set(gap.versions)) > len(listed) else "")


def refusal(
    release: str,
    gaps: Sequence[Gap],
    where: str,
    command: str,
    platform: str,
    done: str = "Nothing was installed.",
) -> str:
    """One paragraph: the pins that do not resolve, what the index has, and the ways to take
    another version, with their cost. `where`: "the package index (URL) does"."""
    pins = _and([str(g.pin) for g in gaps])
    if len(gaps) == 1:
        has = _has(gaps[0])
    else:
        has = "; ".join(f"for {g.pin.name} {_has(g)}" for g in gaps)
    flags = " ".join(f"--override {g.suggestion}" for g in gaps)
    mapping = ", ".join(f'"{g.pin}": "{g.suggestion}"' for g in gaps)
    return (
        f"{release} pins {pins}, which {where} not serve; {has}. {done} To install"
        f" anyway with another version, run `{command} {flags}` (or add"
        f" platforms.{platform}.pin_overrides: {{{mapping}}} to matrix.yaml); the"
        " environment is then not the release's own, and every record, the report and the"
        f" gate say so ({DOCS})."
    )


# uv 0.13: "Because there is no version of flashinfer-python==0.7.3 and vllm>=0.34.0
# depends on flashinfer-python==0.7.3, we can conclude that ..."
_NO_VERSION = re.compile(
    r"there is no version of (?P<pin>[A-Za-z0-9][A-Za-z0-9._\[\],-]*==[^\s,]+)"
)
_DEPENDS = re.compile(
    r"(?P<who>[A-Za-z0-9][A-Za-z0-9._-]*)[<>=!~]=?[^\s,]* depends on (?P<pin>\S+?)[,\s]"
)


def resolver_gap(output: str, package: str) -> Pin | None:
    """The release's own pin uv found no version of, read from its resolver message; None
    for anything else, which is left to uv's own words."""
    text = " ".join(output.split())
    missing = {m["pin"] for m in _NO_VERSION.finditer(text)}
    for m in _DEPENDS.finditer(text + " "):
        if package_key(m["who"]) == package_key(package) and m["pin"] in missing:
            return parse_pin(m["pin"])
    return None
