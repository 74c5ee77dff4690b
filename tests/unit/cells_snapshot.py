"""Every cell matrix.yaml expands to, on every column, as one digest each: what a reshaped
matrix must keep (define/test_matrix_shorthands.py). Regenerate after a deliberate change
of the cells (a case added or changed; not their prose), from the checkout's root, and
review the diff (REGENERATE, which the failing test prints):

    python -m tests.unit.cells_snapshot > tests/unit/data/matrix-cells.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from kvrig.define import gpus
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix, load
from kvrig.host import isa

from .builders import ROOT

MATRIX = ROOT / "matrix.yaml"
# The one command that writes the snapshot; the test that reads it prints it on failure.
REGENERATE = "python -m tests.unit.cells_snapshot > tests/unit/data/matrix-cells.json"
PROSE = {"doc", "review", "expect", "expect_by_isa", "expect_by_arch"}


def _cell(cell: Cell) -> dict[str, Any]:
    return {
        "case": cell.case.model_dump(mode="json", exclude=PROSE, exclude_none=True),
        "model": cell.model_name,
        # A field at its empty default is as if unwritten: adding one changes no cell.
        "model_spec": cell.model.model_dump(
            mode="json", exclude={"source"} | (set() if cell.model.needs else {"needs"})
        ),
        "expect": cell.expect.model_dump(mode="json", exclude_none=True),
        "defect": cell.defect.model_dump(mode="json", exclude_none=True) if cell.defect else None,
    }


def cells(matrix: Matrix) -> dict[str, str]:
    """`<cell id>@<class or arch>` -> the sha256 of what the cell asks and expects."""
    out: list[Cell] = []
    for platform in matrix.platforms:
        if platform == "cpu":
            out += expand(matrix, "cpu")
            for cls in isa.CLASSES:
                out += expand(matrix, "cpu", isa=cls)
            continue
        out += expand(matrix, platform)
        for arch in gpus.GPUS[platform]:
            out += expand(matrix, platform, gpu_arch=arch, device_emulated=True)
    digests = {}
    for cell in out:
        text = json.dumps(_cell(cell), sort_keys=True)
        digests[f"{cell.id}@{cell.isa or cell.gpu_arch or ''}"] = hashlib.sha256(
            text.encode()
        ).hexdigest()[:16]
    return digests


def main() -> int:
    json.dump(cells(load(MATRIX)), sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
