"""The branches of vLLM's block-size code kvrig means to reach, as data (reach_branches.yaml).

One record per branch: its number in the inventory it was read from, the vLLM file and
function, what it does, its arms (each found in the installed vLLM by a fragment of one
line, kvrig.publish.reach.anchors), and whether some engine or CLI path on the platforms
kvrig runs can take it, or why none can. `kvrig check reach` measures the table against
coverage of real cells; the cells' processes read the files it names to know what to
measure (kvrig.run.reach).

Pure: the YAML file in, validated records out.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

TABLE = Path(__file__).with_name("reach_branches.yaml")
Kind = Literal["line", "true", "false"]
Class = Literal["reachable", "hardware", "dead", "elsewhere"]
PLATFORMS = ("cpu", "cuda", "xpu", "rocm")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arm(_Strict):
    """One arm of a branch: the line fragment that finds it, and what counts as taking it."""

    at: str = Field(min_length=1)
    arm: Kind
    nth: int | None = Field(None, ge=1, description="which of several lines matching `at`")
    file: str | None = None  # default: the row's
    function: str | None = None  # default: the row's
    platforms: tuple[Literal["cpu", "cuda", "xpu", "rocm"], ...] = PLATFORMS


class Branch(_Strict):
    n: int = Field(ge=1)
    file: str = Field(min_length=1, description="relative to the vllm package")
    function: str = Field(min_length=1, description="dotted path of classes and functions")
    what: str = Field(min_length=1)
    arms: tuple[Arm, ...] = Field(min_length=1)
    together: bool = False  # one cell must take every arm
    class_: Class = Field(alias="class")
    reason: str = Field(min_length=1)

    def file_of(self, arm: Arm) -> str:
        return arm.file or self.file

    def function_of(self, arm: Arm) -> str:
        return arm.function or self.function

    @property
    def reachable(self) -> bool:
        return self.class_ == "reachable"


class Table(_Strict):
    release: str
    rows: tuple[Branch, ...]

    @model_validator(mode="after")
    def _numbers_unique(self) -> Table:
        seen = [r.n for r in self.rows]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise ValueError(f"rows numbered twice: {twice}")
        return self

    @property
    def files(self) -> tuple[str, ...]:
        """Every vLLM file an arm lies in, relative to the vllm package, sorted."""
        return tuple(sorted({r.file_of(a) for r in self.rows for a in r.arms}))


def parse(text: str) -> Table:
    return Table.model_validate(yaml.safe_load(text))


@cache
def load(path: Path = TABLE) -> Table:
    return parse(path.read_text())
