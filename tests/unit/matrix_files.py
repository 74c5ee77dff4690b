"""Matrix files as a user writes them: the project's own matrix.yaml, changed in one place
and written to a folder, and the one paragraph loading it refuses it with, at its line."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvrig.define import shorthands
from kvrig.define.matrix import MatrixError, load

from .builders import ROOT

REPO_MATRIX = ROOT / "matrix.yaml"
Loc = tuple[Any, ...]
# libyaml's, as the loader under test uses: a changed matrix is dumped and composed again
# in hundreds of tests.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _repo_data() -> dict[str, Any]:
    return shorthands.expand(yaml.load(REPO_MATRIX.read_text(), Loader=_LOADER))


def repo_data() -> dict[str, Any]:
    """The project's matrix as plain data in its long form (a case per model, an
    expectation per platform), a fresh copy to change."""
    return copy.deepcopy(_repo_data())


def case_of(data: dict[str, Any], model: str, case_id: str) -> tuple[dict[str, Any], Loc]:
    """A case of the long form, and where it is."""
    i = next(i for i, c in enumerate(data["cases"]) if c["model"] == model and c["id"] == case_id)
    return data["cases"][i], ("cases", i)


def dumped(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.dump(data, Dumper=_DUMPER, sort_keys=False))
    return path


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    """The one paragraph loading `path` refuses it with (the test fails if it loads)."""
    with pytest.raises(MatrixError) as err:
        load(path)
    msg = str(err.value)
    assert "\n" not in msg, "one paragraph"
    return msg


def line_at(path: Path, loc: Loc) -> int:
    """The line of the key at `loc` in the file (a list item: its first key's), read with
    the YAML composer, not with the loader under test's constructors (both on libyaml's
    parser where PyYAML has it)."""
    node = yaml.compose(path.read_text(), Loader=_LOADER)
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            key, node = next((k, v) for k, v in node.value if k.value == str(part))
            line = key.start_mark.line + 1
        else:
            node = node.value[part]
            if isinstance(node, yaml.MappingNode):
                line = node.value[0][0].start_mark.line + 1
    assert line is not None
    return line


def refused_at(tmp_path: Path, data: dict[str, Any], loc: Loc) -> str:
    """Loading the changed matrix is refused with a paragraph that starts at `loc`'s line
    and names its field."""
    path = dumped(tmp_path, data)
    msg = refusal(path)
    field = ".".join(str(p) for p in loc)
    assert msg.startswith(f"{path}:{line_at(path, loc)}: the matrix is invalid at {field}:"), msg
    assert "Nothing was run" in msg
    return msg


def line_with(path: Path, needle: str, nth: int = 1) -> int:
    """The line of the nth line of the file holding `needle`."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]
    return hits[nth - 1]
