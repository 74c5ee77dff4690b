"""The block-size rules one vLLM release follows on one platform.

The switches themselves (what changed between releases, the vLLM file each restates and
the releases it was seen in) are in kvrig.define.releases, where the matrix loader reads
them too; this module turns them into a release's `Rules`, and re-exports them for the
predictor and the verdicts.

Pure: a version string and a platform in, facts out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvrig.define.releases import (
    CPU_START,
    DEFAULT_START,
    PLAIN_ALIGN_GDN,
    PLAIN_ALIGN_MAMBA2,
    READ,
    SWITCHES,
    Switch,
    Version,
    VersionError,
    known_releases,
    known_text,
    newest_read,
    not_known,
    parse,
    shown,
    source_version,
    unknown_at,
    unread_note,
)
from kvrig.define.vllm_models import Family

__all__ = [
    "CPU_START",
    "DEFAULT_START",
    "FIELDS",
    "NEWEST",
    "PLAIN_ALIGN_GDN",
    "PLAIN_ALIGN_MAMBA2",
    "READ",
    "SWITCHES",
    "Rules",
    "Switch",
    "Version",
    "VersionError",
    "differing",
    "known_releases",
    "known_text",
    "newest_read",
    "not_known",
    "parse",
    "reverted",
    "rules",
    "shown",
    "source_version",
    "unknown_at",
    "unread_note",
]


@dataclass(frozen=True)
class Rules:
    """The version-dependent facts for one platform and release (None: not known)."""

    version: Version
    platform: str
    phase1: bool
    start: int
    checkpoint_term: bool
    nemotron_ssm_fallback: str | None
    xpu_gdn_round: bool | None
    plain_align_gdn: bool | None
    plain_align_mamba2: bool | None
    # ROCm's backends (kvrig.rules.rocm): ROCM_ATTN preferring 16 whatever the start, and
    # TRITON_ATTN ahead of ROCM_ATTN on gfx1201; False off ROCm.
    rocm_attn_prefers_16: bool | None = False
    rocm_triton_first: bool | None = False
    # The engine merges its workers' KV-cache layouts (else they must agree); True off GPUs.
    kv_layouts_merged: bool | None = True
    # A shorter drafter's context is applied before the model's config hooks (else a
    # hybrid's Mamba block keeps the longer one, and is refused).
    draft_context_first: bool | None = True
    # Set when the release is newer than any kvrig's rules were read in: what every size
    # computed with these rules says of itself (kvrig.define.releases.unread_note).
    unread: str | None = None

    @property
    def label(self) -> str:
        """The rule set's name in output: the platform and the release it follows, and the
        release it was read in when that is an older one."""
        base = f"{self.platform}@{shown(self.version)}"
        if self.unread is None:
            return base
        newest = newest_read(self.platform)
        read = f"read for {shown(newest)} only" if newest else "never read for it"
        return f"{base} (rules {read})"

    def plain_align_mode(self, family: Family) -> bool | None:
        """Whether align mode leaves the size to the plain arithmetic for this family
        (None: not known at this release)."""
        if family == Family.GDN:
            return self.plain_align_gdn
        return self.plain_align_mamba2 if family == Family.HYBRID_MAMBA else True


# Which field of Rules each switch sets: a release diff reverts one switch at a time to
# name the one that explains a moved cell.
FIELDS = {s.name: s.field for s in SWITCHES}


def differing(old: Rules, new: Rules) -> list[Switch]:
    """The switches whose value differs between two releases' rules on one platform."""
    return [s for s in SWITCHES if getattr(old, s.field) != getattr(new, s.field)]


def reverted(new: Rules, old: Rules, switch: Switch) -> Rules:
    """`new` with one switch set back to its value in `old`."""
    return replace(new, **{switch.field: getattr(old, switch.field)})


# The newest release these rules were read in, on the GPU platforms.
NEWEST: Version = newest_read("cuda") or (0, 0, 0)


def rules(platform: str, version: str | Version) -> Rules:
    """The rules an engine of this release follows on this platform: each switch's value
    there, read from the switches."""
    v = parse(version) if isinstance(version, str) else version
    values = {s.field: s.on(platform, v) for s in SWITCHES}
    if values["start"] is None:
        step = next(st for st in DEFAULT_START.steps if st.after < v < st.since)
        raise VersionError(
            f"vLLM {shown(v)} falls between {shown(step.after)}, whose phase 1 starts at"
            f" {DEFAULT_START.at(step.after)}, and {shown(step.since)}, which starts at"
            f" {step.value} ({DEFAULT_START.where}); kvrig does not know which it follows."
            " Give a release it knows, or add the one that changed it to"
            " kvrig.define.releases."
        )
    return Rules(version=v, platform=platform, unread=unread_note(platform, v), **values)  # type: ignore[arg-type]
