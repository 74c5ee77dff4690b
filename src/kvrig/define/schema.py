"""matrix.yaml's schema at its root: the Matrix, its models, allowances and release, and
the cross-references between its sections.

The matrix is the rig's single source of truth; everything downstream (cells, records,
verdicts, reports, the gate) is derived from it (kvrig.define.cells), so a file that does
not validate must stop the run before any engine starts. Reading a file is
kvrig.define.loader's job; this module holds what a valid one is.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, StrictInt, field_validator, model_validator

from kvrig.define import gpus, releases
from kvrig.define.case_spec import Case, arch_keys
from kvrig.define.platform_spec import PlatformSpec
from kvrig.define.strict import NAME, Strict
from kvrig.define.vllm_models import Family
from kvrig.define.vllm_names import KNOWN_BACKENDS, Platform
from kvrig.host import isa


class MatrixError(Exception):
    """A matrix file that cannot be used; the message is the one paragraph shown to users."""


class ModelSpec(Strict):
    """A miniature model: a shipped config.json plus overrides, loaded with dummy weights."""

    family: Family
    config: str
    # A shape-faithful miniature names the checkpoint whose per-layer shapes it keeps and
    # where those numbers come from; its block size is then the checkpoint's own.
    checkpoint: str | None = None
    source: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: Annotated[StrictInt, Field(ge=16)] = 256
    # Python modules the model's vLLM code imports beyond vLLM's own requirements (Qwen3.5:
    # torchvision, which a CPU environment has only where its CPU build can be had): a
    # column whose environment lacks one skips the model's cells, saying so. Top-level
    # names only: looking one up imports nothing.
    needs: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list
    )


# The longest an allowance may run, from the day the matrix is loaded or the gate runs: an
# expiry years ahead (9999-12-31) would make an excuse permanent, and renewing one means
# someone looked at the cell again.
ALLOWANCE_DAYS = 90


class Allowance(Strict):
    """A required cell the release gate lets fail, skip or be missing, for a while.

    The expiry date is mandatory so an allowance cannot outlive the reason for it: once it
    has passed the gate fails until someone renews or removes the allowance; one that runs
    more than ALLOWANCE_DAYS ahead is refused.
    """

    # A cell id: `<column>-<model>-<case>`, the column a platform, `cpu-<class>` or a
    # CUDA architecture's `cuda-sm90`.
    cell: str = Field(
        pattern=r"^(cpu|cuda|xpu|rocm)(-(avx2|avx512|avx512_bf16|amx|sm\d+|gfx\d+))?-[a-z0-9][a-z0-9_]*"
        r"-[a-z0-9][a-z0-9_]*$"
    )
    reason: str = Field(min_length=1)
    owner: str = Field(min_length=1)
    expires: dt.date
    # What it lets pass: an allowance written for a skip (a host that cannot have what a
    # model needs) must not also wave through the same cell failing where it runs.
    excuses: list[Literal["fail", "skip", "missing"]] = Field(
        default_factory=lambda: ["fail", "skip", "missing"], min_length=1
    )

    @field_validator("expires", mode="before")
    @classmethod
    def _a_day_of_the_calendar(cls, value: Any) -> Any:
        """A date written as text is one the calendar lacks (2027-02-30: YAML reads a real
        one as a date); pydantic's words for it name no format."""
        if isinstance(value, str):
            try:
                dt.date.fromisoformat(value)
            except ValueError as exc:
                raise ValueError(
                    f"the date is no day of the calendar ({exc}); write the day the allowance"
                    " ends as YYYY-MM-DD, one that exists"
                ) from None
        return value


def allowance_too_long(allowance: Allowance, today: dt.date) -> dt.date | None:
    """The latest expiry an allowance may have today, when its own is later; else None."""
    latest = today + dt.timedelta(days=ALLOWANCE_DAYS)
    return latest if allowance.expires > latest else None


def _check_defect(i: int, case: Case) -> None:
    """A known defect stands against an expectation on the same platform."""
    for platform in case.known_defect.shows if case.known_defect else {}:
        if platform not in case.expect:
            raise ValueError(
                f"cases.{i}.known_defect.shows.{platform}: case {case.id!r} has no"
                f" expectation on {platform!r} for the defect to stand against"
            )


def _check_isa_refinements(i: int, case: Case) -> None:
    """`expect_by_isa` names known CPU classes and refines a cpu expectation."""
    for cls in case.expect_by_isa:
        if cls not in (*isa.CLASSES, "aarch64"):
            raise ValueError(
                f"cases.{i}.expect_by_isa.{cls}: {cls!r} is not a CPU class kvrig"
                f" knows ({', '.join(isa.CLASSES)}, aarch64)"
            )
        if "cpu" not in case.expect:
            raise ValueError(
                f"cases.{i}.expect_by_isa: case {case.id!r} has no cpu expectation"
                " for its CPU classes to refine"
            )


def _check_arch_refinements(i: int, case: Case) -> None:
    """`expect_by_arch` names known CUDA or ROCm architectures, each once, and refines its
    platform's expectation."""
    seen: dict[str, str] = {}
    for key in case.expect_by_arch:
        platform = gpus.arch_platform(key)
        known = gpus.GPUS[platform]
        for arch in arch_keys(key):
            if arch not in known or gpus.arch_platform(arch) != platform:
                raise ValueError(
                    f"cases.{i}.expect_by_arch.{key}: {arch!r} is not a {platform.upper()}"
                    f" architecture kvrig knows ({', '.join(known)}); one key names one"
                    " platform's architectures"
                )
            if arch in seen:
                raise ValueError(
                    f"cases.{i}.expect_by_arch.{key}: architecture {arch} is already given"
                    f" under {seen[arch]!r}"
                )
            seen[arch] = key
        if platform not in case.expect:
            raise ValueError(
                f"cases.{i}.expect_by_arch: case {case.id!r} has no {platform} expectation"
                f" for its architectures ({key}) to refine"
            )


class Release(Strict):
    """What the release gate requires: the hardware columns whose `gate: true` cells must
    pass. A team without XPU runners gates on cpu and cuda and says so here, instead of
    living with a gate that is red until runners it does not have exist."""

    # None: every platform the matrix defines.
    columns: Annotated[list[Platform], Field(min_length=1)] | None = None

    @field_validator("columns")
    @classmethod
    def _once_each(cls, columns: list[str] | None) -> list[str] | None:
        if columns is not None and len(set(columns)) != len(columns):
            raise ValueError(f"a column is named twice: {columns}")
        return columns


class Matrix(Strict):
    version: Literal[1]
    platforms: dict[Platform, PlatformSpec]
    models: dict[str, ModelSpec]
    cases: list[Case]
    allowances: list[Allowance] = Field(default_factory=list)
    release: Release = Field(default_factory=Release)
    # Where the file was read from and the line of each case (by index), so that a cell's
    # test item and its failure can point into the file; empty for a matrix built in code.
    _path: Path | None = PrivateAttr(default=None)
    _case_lines: dict[int, int] = PrivateAttr(default_factory=dict)
    _allowance_lines: dict[int, int] = PrivateAttr(default_factory=dict)
    # The pins a release named on the command line replaced, by platform (the matrix's
    # literal sizes are for these; kvrig.define.named_release).
    _replaced_pins: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def path(self) -> Path | None:
        return self._path

    def replaced_pin(self, platform: str) -> str | None:
        """What matrix.yaml pins for the platform when a named release runs instead."""
        return self._replaced_pins.get(platform)

    @property
    def required_platforms(self) -> list[str]:
        """The platforms the release gate requires (release.columns, else every one)."""
        return list(self.release.columns or self.platforms)

    def ci_archs(self, platform: str) -> list[str]:
        """The GPU architectures a platform's CI runs on, normalised ("9.0"): its
        ci.archs, else every one kvrig knows; none off the platforms that key by them."""
        if platform not in gpus.BY_ARCH:
            return []
        spec = self.platforms.get(platform)  # type: ignore[call-overload]
        given = spec.ci.archs if spec is not None else []
        return [gpus.normalize(platform, a) for a in given] or list(gpus.GPUS[platform])

    def platform_columns(self, platform: str) -> list[str]:
        """A platform's release columns: one per CI architecture on CUDA (cuda-sm90), the
        platform itself elsewhere."""
        archs = self.ci_archs(platform)
        return [gpus.device_column(platform, a) for a in archs] if archs else [platform]

    @property
    def required_columns(self) -> list[str]:
        """The columns the release gate requires: each required platform's."""
        return [c for p in self.required_platforms for c in self.platform_columns(p)]

    def case_line(self, index: int) -> int | None:
        return self._case_lines.get(index)

    @field_validator("models")
    @classmethod
    def _model_names(cls, v: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        for name in v:
            if not re.match(NAME, name):
                raise ValueError(f"models.{name}: model name {name!r} must match {NAME}")
        return v

    @model_validator(mode="after")
    def _cross_references(self) -> Matrix:
        seen: set[tuple[str, str]] = set()
        for i, case in enumerate(self.cases):
            if case.model not in self.models:
                known = ", ".join(sorted(self.models))
                raise ValueError(
                    f"cases.{i}.model: case {case.id!r} names unknown model {case.model!r}"
                    f" (known: {known})"
                )
            spec = case.knobs.speculative_config
            if spec is not None and spec.model is not None and spec.model not in self.models:
                known = ", ".join(sorted(self.models))
                raise ValueError(
                    f"cases.{i}.knobs.speculative_config.model: case {case.id!r} names unknown"
                    f" drafter {spec.model!r} (known models: {known})"
                )
            key = (case.model, case.id)
            if key in seen:
                raise ValueError(f"cases.{i}.id: case {case.id!r} of {case.model!r} repeats")
            seen.add(key)
            _check_defect(i, case)
            _check_isa_refinements(i, case)
            _check_arch_refinements(i, case)
            for platform in case.expect:
                if platform not in self.platforms:
                    raise ValueError(
                        f"cases.{i}.expect.{platform}: platform {platform!r} is not defined"
                        " under platforms"
                    )
        return self

    @model_validator(mode="after")
    def _ci_archs_are_known(self) -> Matrix:
        for p, spec in self.platforms.items():
            if spec.ci.archs and p not in gpus.BY_ARCH:
                raise ValueError(
                    f"platforms.{p}.ci.archs: only {' and '.join(gpus.BY_ARCH)} run one job per"
                    f" GPU architecture ({p} runs one column wherever its device is); remove it"
                )
            for a in spec.ci.archs:
                try:
                    gpus.gpu(p, a)
                except gpus.GpuError as exc:
                    raise ValueError(f"platforms.{p}.ci.archs: {exc}") from None
            normal = [gpus.normalize(p, a) for a in spec.ci.archs]
            if len(set(normal)) != len(normal):
                raise ValueError(f"platforms.{p}.ci.archs: an architecture is named twice")
        return self

    @model_validator(mode="after")
    def _release_columns_are_platforms(self) -> Matrix:
        for column in self.release.columns or []:
            if column not in self.platforms:
                raise ValueError(
                    f"release.columns: {column!r} is not a platform of this matrix"
                    f" ({', '.join(self.platforms)})"
                )
        return self

    @model_validator(mode="after")
    def _backends_are_vllms(self) -> Matrix:
        named: list[tuple[str, str]] = [
            (f"platforms.{p}.default_backend", s.default_backend) for p, s in self.platforms.items()
        ]
        for i, case in enumerate(self.cases):
            if case.knobs.attention_backend:
                named.append((f"cases.{i}.knobs.attention_backend", case.knobs.attention_backend))
            if case.crafted.replace is not None and case.crafted.replace.target:
                named.append((f"cases.{i}.crafted.replace.target", case.crafted.replace.target))
            for j, sib in enumerate(case.crafted.siblings):
                if sib.base:
                    named.append((f"cases.{i}.crafted.siblings.{j}.base", sib.base))
        for where, name in named:
            if name not in KNOWN_BACKENDS:
                raise ValueError(
                    f"{where}: {name!r} is not one of vLLM's attention backends"
                    f" ({', '.join(sorted(KNOWN_BACKENDS))})"
                )
        return self

    @model_validator(mode="after")
    def _releases_kvrig_knows(self) -> Matrix:
        """A pinned release between two that a rule was seen in would be judged by rules
        kvrig does not have for it (`kvrig predict` refuses such a release too); one that
        names no release (an image) says so where a size is computed."""
        for p, spec in self.platforms.items():
            release = releases.source_version(spec.vllm)
            if release is None:
                continue
            unknown = releases.unknown_at(p, releases.parse(release))
            if not unknown:
                continue
            field = (
                "version"
                if spec.vllm.version == release
                else ("image" if spec.vllm.kind == "image" else "git_ref")
            )
            raise ValueError(
                f"platforms.{p}.vllm.{field}: {releases.not_known(p, release, unknown)}. Pin"
                f" a release they know ({releases.known_text(p)}), or add what {release} does"
                " to kvrig.define.releases"
            )
        return self

    @model_validator(mode="after")
    def _allowances_name_cells(self) -> Matrix:
        columns = {p: self.platform_columns(p) for p in self.platforms}
        columns.setdefault("cpu", []).extend(f"cpu-{cls}" for cls in isa.CLASSES)
        cells = {
            f"{col}-{c.model}-{c.id}"
            for c in self.cases
            for p in c.expect
            if p in self.platforms
            for col in columns[p]
        }
        for i, allowance in enumerate(self.allowances):
            if allowance.cell not in cells:
                raise ValueError(
                    f"allowances.{i}.cell: {allowance.cell!r} is not a cell of this matrix"
                    " (kvrig cells lists them); fix the name or remove the allowance"
                )
        return self
