"""The block-size rules one vLLM release follows on one platform.

The switches themselves (what changed between releases, the vLLM file each restates and
the releases it was seen in) are in kvrig.define.releases, where the matrix loader reads
them too; this module turns them into a release's `Rules`, and re-exports them for the
predictor and the verdicts.

Pure: a version string and a platform in, facts out.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrig.define.releases import (
    CHECKPOINT_TERM,
    CPU_PHASE1,
    NEMOTRON_SSM_FALLBACK,
    PLAIN_ALIGN_GDN,
    PLAIN_ALIGN_MAMBA2,
    SWITCHES,
    XPU_GDN_ROUND,
    Switch,
    Version,
    VersionError,
    known_releases,
    parse,
    shown,
    source_version,
    unknown_at,
)

__all__ = [
    "CHECKPOINT_TERM",
    "CPU_PHASE1",
    "CPU_START",
    "DEFAULT_BLOCK_SIZE",
    "NEMOTRON_SSM_FALLBACK",
    "NEWEST",
    "PLAIN_ALIGN_GDN",
    "PLAIN_ALIGN_MAMBA2",
    "SWITCHES",
    "XPU_GDN_ROUND",
    "Rules",
    "Switch",
    "Version",
    "VersionError",
    "known_releases",
    "parse",
    "rules",
    "shown",
    "source_version",
    "unknown_at",
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

    @property
    def label(self) -> str:
        """The rule set's name in output: the platform and the release it follows."""
        return f"{self.platform}@{shown(self.version)}"

    def plain_align_mode(self, family: str) -> bool | None:
        """Whether align mode leaves the size to the plain arithmetic for this family
        (None: not known at this release)."""
        if family == "gdn":
            return self.plain_align_gdn
        return self.plain_align_mamba2 if family == "hybrid_mamba" else True


# The newest release these rules were read in.
NEWEST: Version = (0, 33, 0)
# The size phase 1 starts from (CacheConfig.DEFAULT_BLOCK_SIZE), and CPU's 128.
DEFAULT_BLOCK_SIZE = 16
CPU_START = 128


def rules(platform: str, version: str | Version) -> Rules:
    """The rules an engine of this release follows on this platform."""
    v = parse(version) if isinstance(version, str) else version
    cpu = platform == "cpu"
    phase1 = bool(CPU_PHASE1.at(v)) if cpu else True
    return Rules(
        version=v,
        platform=platform,
        phase1=phase1,
        start=CPU_START if cpu else DEFAULT_BLOCK_SIZE,
        checkpoint_term=bool(CHECKPOINT_TERM.at(v)),
        nemotron_ssm_fallback=NEMOTRON_SSM_FALLBACK.at(v),  # type: ignore[arg-type]
        xpu_gdn_round=XPU_GDN_ROUND.at(v) if platform == "xpu" else False,  # type: ignore[arg-type]
        plain_align_gdn=PLAIN_ALIGN_GDN.at(v),  # type: ignore[arg-type]
        plain_align_mamba2=PLAIN_ALIGN_MAMBA2.at(v),  # type: ignore[arg-type]
    )
