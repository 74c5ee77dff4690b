"""What a results folder holds: the vLLM its rows are of, in `holds.json` beside them.

The release gate reads a folder named as a column as that column's run on the pinned
vLLM, and a side run (an overlay, a release named with `--vllm`) writes rows with the same
cell ids. So each column run records what its folder holds and refuses a folder of another
kind of run, a side run never lands in a release column's folder, and the gate refuses a
release folder whose record says it holds a side run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kvrig.define.column_names import hardware_columns
from kvrig.define.paths import column_of_folder

FILE = "holds.json"
# The kinds of run: the vLLM matrix.yaml declares (its pin, or the overlay it names), an
# overlay asked for on the command line, another release named with --vllm.
RELEASE = "release"
OVERLAY = "overlay"
NAMED = "named release"


class HoldsError(Exception):
    """The folder holds (or is) another kind of run's; the message says what to do."""


@dataclass(frozen=True)
class Holds:
    """The vLLM a folder's rows are of: its kind, as people read it, and the column."""

    kind: str
    vllm: str
    column: str

    @property
    def side(self) -> bool:
        return self.kind != RELEASE

    def describe(self) -> str:
        what = {RELEASE: "the vLLM matrix.yaml declares", OVERLAY: "an overlay"}.get(
            self.kind, "a release named with --vllm"
        )
        return f"{self.column} on {what} ({self.vllm})"


def read(folder: Path) -> Holds | None:
    """The folder's record, or None when it has none (a folder of an older kvrig, or one
    no column has run in); an unreadable one is treated as none."""
    try:
        data = json.loads((folder / FILE).read_text())
        return Holds(str(data["kind"]), str(data["vllm"]), str(data["column"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(folder: Path, holds: Holds) -> None:
    tmp = folder / f".{FILE}.tmp"
    tmp.write_text(json.dumps(asdict(holds), indent=2) + "\n")
    tmp.replace(folder / FILE)


def release_column(folder: Path) -> str | None:
    """The hardware column a folder is the release's own of (by its name: what the gate
    reads), or None. Emulated devices' folders are never gated, and the release diff
    writes a named release's emulated columns under folders named as them."""
    return column_of_folder(folder.name, hardware_columns())


def check(folder: Path, holds: Holds) -> None:
    """Refuses, before anything is written, a side run into a release column's folder and
    a run into a folder that holds another kind of run; a release whose pin moved, or an
    overlay reworked, may follow its own kind (its rows replace the old ones, which the
    column keeps as previous-results.jsonl)."""
    column = release_column(folder)
    if holds.side and column is not None:
        raise HoldsError(
            f"The results folder {folder} is the {column} column's own: the release gate reads"
            f" it as the run of the vLLM matrix.yaml pins, and this run is of {holds.vllm}, a"
            " side run. Leave out --results (the run then writes its own folder beside the"
            " release's, results/<column>-overlay-<digest> or results/<column>-vllm-<version>)"
            " or name a folder of its own (--results results/<name>). Nothing was run."
        )
    found = read(folder)
    if found is not None and found.kind != holds.kind:
        raise HoldsError(
            f"The results folder {folder} holds the rows of {found.describe()} (its {FILE}),"
            f" and this run is of {holds.describe()}: the two would mix in one folder. Name"
            " another folder with --results, or remove that one to reuse it. Nothing was run."
        )
