"""Cells: one case of the matrix on one column (a platform, and on CPU one ISA class).

Everything downstream (the engine's run, its record, the verdict, the results row, the
report and the gate) is keyed by a cell's id, so the id and the identity fields of a row
are defined here once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvrig.define import gpus, models
from kvrig.define.case_spec import Case, Expectation, Skip, arch_keys
from kvrig.define.column_names import Column
from kvrig.define.platform_spec import PlatformSpec
from kvrig.define.schema import Matrix, MatrixError, ModelSpec
from kvrig.define.vllm_names import PLATFORMS, Platform

# Every cell's processes run under these, wherever they run (host or image): no hub, no
# telemetry, so a cell never waits on or talks to the network.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class Cell(BaseModel):
    """One case on one column: what a single engine run is asked to show."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: Platform
    case: Case
    model_name: str
    model: ModelSpec
    platform_spec: PlatformSpec
    expect: Expectation
    # The CPU class whose rules the cell follows (None off CPU, or when unknown), and
    # whether the rig set it (kvrig column --isa) rather than read it off the host.
    isa: str | None = None
    emulated: bool = False
    # The GPU architecture whose expectation the cell follows (kvrig.define.gpus: a CUDA
    # compute capability, or an XPU family), and whether the device is emulated: vLLM's
    # own platform code on a CPU host, configuration only (kvrig.run.emulation).
    gpu_arch: str | None = None
    device_emulated: bool = False
    # Where the case is written ("matrix.yaml:123"), for test reports and failures.
    source: str | None = None
    # The model's config.json as the engine loads it (its file plus the overrides),
    # rendered once when the cells are made, so judging a record reads no file.
    config: dict[str, Any] = Field(default_factory=dict)
    # The vLLM matrix.yaml pins, when the cell runs a release named instead (--vllm): the
    # sizes the matrix writes out are the pin's, so the verdict checks the size
    # kvrig.rules computes for the release that runs.
    pinned_instead: str | None = None
    # The drafter a speculative case names (a model of the matrix), its config rendered
    # once as the target's is; None without one.
    draft: ModelSpec | None = None
    draft_config: dict[str, Any] = Field(default_factory=dict)

    @property
    def max_model_len(self) -> int:
        """The context the engine gets: the case's knob, else the model's."""
        return self.case.knobs.max_model_len or self.model.max_model_len

    @property
    def column(self) -> str:
        """The results column (kvrig.define.column_names): the platform, `cpu-<class>` for
        a class the rig set, `cuda-<arch>` for a CUDA device, `<platform>-<arch>-emulated`
        for an emulated device."""
        return Column(
            self.platform,
            isa=self.isa if self.emulated else None,
            gpu_arch=self.gpu_arch,
            device_emulated=self.device_emulated,
        ).name

    @property
    def id(self) -> str:
        return f"{self.column}-{self.model_name}-{self.case.id}"

    @property
    def env(self) -> dict[str, str]:
        """The engine's environment the matrix sets: the platform's, then the case's."""
        return {**self.platform_spec.env, **self.case.env}

    def identity(self) -> dict[str, Any]:
        """The fields that name a cell in a record and in a results row."""
        return {
            "cell_id": self.id,
            "platform": self.platform,
            "column": self.column,
            "isa": self.isa,
            "emulated": self.emulated,
            "gpu_arch": self.gpu_arch,
            "device_emulated": self.device_emulated,
            "model": self.model_name,
            "case": self.case.id,
            # The text, not the enum: a row read back from JSON holds the text.
            "family": self.model.family.value,
        }

    @property
    def defect(self) -> Expectation | None:
        """What a known vLLM defect makes this cell show instead of its expectation."""
        known = self.case.known_defect
        return known.shows.get(self.platform) if known else None

    @property
    def multiprocessing(self) -> bool:
        knob = self.case.knobs.multiprocessing
        return self.platform_spec.multiprocessing if knob is None else knob


# What a verdict does not depend on, left out of judged_under: prose (a case's doc and
# review, a model's source) and how a column is scheduled (its CI jobs and shards, the
# cells run at once), so rewording a doc or resharding CI does not make rows stale.
_PROSE = {"case": {"doc", "review"}, "model": {"source"}, "platform": {"ci", "parallel"}}


def judged_under(cell: Cell) -> str:
    """A sha256 of what the matrix says about this one cell: its case (every platform's
    expectation and known defect, knobs, crafted backends), its model spec and the config
    the engine loads, and its platform's spec (the vLLM it pins included).

    A results row carries it, so the gate can tell a row judged under this matrix from one
    judged under another expectation or vLLM pin; only this cell's own parts enter it, so
    editing another case leaves the row standing.
    """
    facts = {
        "platform": cell.platform,
        # A field left unset (None) is as if unwritten: a new knob re-judges no row.
        "case": cell.case.model_dump(mode="json", exclude=_PROSE["case"], exclude_none=True),
        # `needs` left empty is as if unwritten: adding the field re-judges no cell.
        "model": cell.model.model_dump(
            mode="json", exclude=_PROSE["model"] | (set() if cell.model.needs else {"needs"})
        ),
        "config": cell.config,
        "platform_spec": cell.platform_spec.model_dump(mode="json", exclude=_PROSE["platform"]),
    }
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def expand(
    matrix: Matrix,
    platform: str | None = None,
    *,
    isa: str | None = None,
    emulated: bool = False,
    gpu_arch: str | None = None,
    device_emulated: bool = False,
) -> list[Cell]:
    """Every (case, platform) pair with an expectation, in file order.

    On CPU `isa` names the class the cells follow (the host's, or the one the rig
    emulates); a case's `expect_by_isa` entry for that class replaces its CPU expectation.
    On a GPU platform `gpu_arch` names the architecture (the runner's own, or the one an
    emulated column fakes); on CUDA and ROCm a case's `expect_by_arch` entry for it
    replaces the platform's expectation. `device_emulated` marks the cells of an emulated
    device's column.
    """
    if platform is not None and platform not in PLATFORMS:
        raise MatrixError(
            f"Unknown platform {platform!r}: kvrig knows {', '.join(PLATFORMS)}. Pass one of"
            " them (or leave it out to use the host's)."
        )
    cells = []
    base = matrix.path.parent if matrix.path is not None else None
    configs: dict[str, dict[str, Any]] = {}
    for index, case in enumerate(matrix.cases):
        line = matrix.case_line(index)
        source = f"{matrix.path}:{line}" if matrix.path is not None and line else None
        for plat, expect in case.expect.items():
            if platform is not None and plat != platform:
                continue
            on_cpu = plat == "cpu"
            spec = case.knobs.speculative_config
            draft = spec.model if spec is not None else None
            for name in (case.model, draft):
                if name is not None and name not in configs:
                    configs[name] = models.render(matrix.models[name], base)
            if on_cpu and isa is not None:
                expect = case.expect_by_isa.get(isa, expect)  # type: ignore[call-overload]
            arch = gpus.normalize(plat, gpu_arch) if gpu_arch and not on_cpu else None
            if plat in gpus.ARCH_KEYED and arch is not None:
                expect = by_arch(case, arch) or expect
            cells.append(
                Cell(
                    platform=plat,
                    case=case,
                    model_name=case.model,
                    model=matrix.models[case.model],
                    platform_spec=matrix.platforms[plat],
                    expect=expect,
                    isa=isa if on_cpu else None,
                    emulated=emulated and on_cpu,
                    gpu_arch=arch,
                    device_emulated=device_emulated and not on_cpu,
                    source=source,
                    config=configs[case.model],
                    pinned_instead=matrix.replaced_pin(plat),
                    draft=matrix.models[draft] if draft else None,
                    draft_config=configs[draft] if draft else {},
                )
            )
    return cells


def by_arch(case: Case, arch: str) -> Expectation | None:
    """The case's expectation on one CUDA or ROCm architecture, when it names one."""
    for key, entry in case.expect_by_arch.items():
        if arch in arch_keys(key):
            return entry.expect
    return None


# How a cell skipped for a module its environment lacks says so (a container's check
# tells that skip from others by it).
NEEDS_UNMET = "which this environment lacks"


def skipped_for_needs(reason: str | None) -> bool:
    """Whether a skip's reason is with_needs_met's: its environment lacked a module."""
    return NEEDS_UNMET in (reason or "")


def with_needs_met(
    cells: Sequence[Cell], have: Callable[[str], bool], hint: Callable[[str], str]
) -> list[Cell]:
    """The cells as this environment can run them: a cell whose model needs a module the
    environment lacks is skipped, its reason naming the module and what to do (`hint`),
    so it reads as the environment's gap, not as vLLM's failure or a silent pass."""
    out = []
    for cell in cells:
        lacking = [m for m in cell.model.needs if not have(m)]
        if not lacking or cell.expect.outcome == "skip":
            out.append(cell)
            continue
        reason = f"{cell.model_name} needs {', '.join(lacking)}, {NEEDS_UNMET}: " + "; ".join(
            hint(m) for m in lacking
        )
        out.append(cell.model_copy(update={"expect": Skip(outcome="skip", reason=reason)}))
    return out
