"""What matrix.yaml holds: `kvrig validate`, `kvrig cells`, `kvrig pipeline`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvrig.define import column_choice
from kvrig.define.cells import expand
from kvrig.define.matrix import PLATFORMS, load
from kvrig.host import isa
from kvrig.publish import pipeline


def cmd_validate(ns: argparse.Namespace, extra: list[str]) -> int:
    m = load(ns.matrix)
    n = sum(len(expand(m, p)) for p in m.platforms)
    print(f"{m.path}: valid ({len(m.models)} models, {len(m.cases)} cases, {n} cells)")
    return 0


def cmd_cells(ns: argparse.Namespace, extra: list[str]) -> int:
    m = load(ns.matrix)
    # Named, not run: a class or a device this host lacks still lists its cells.
    choice = column_choice.requested(ns.platform, ns.isa, ns.emulate)
    for cell in expand(
        m,
        ns.platform,
        isa=choice.isa,
        emulated=choice.emulated,
        gpu_arch=choice.device,
        device_emulated=bool(choice.device),
    ):
        gate = " [gate]" if cell.case.gate else ""
        print(f"{cell.id:<45} {cell.expect.outcome:<12}{gate}")
    return 0


def cmd_pipeline(ns: argparse.Namespace, extra: list[str]) -> int:
    text = pipeline.render(load(ns.matrix), ns.format)
    if ns.output:
        Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.output).write_text(text)
        print(f"wrote {ns.output}")
    else:
        print(text, end="")
    return 0


def register(sub: Any) -> None:
    sub.add_parser("validate", help="check matrix.yaml and count its cells").set_defaults(
        run=cmd_validate
    )
    cl = sub.add_parser("cells", help="list the cells of the matrix")
    cl.add_argument("--platform", choices=PLATFORMS)
    cl.add_argument("--isa", default=isa.NATIVE, help="list the cells of this emulated class")
    cl.add_argument("--emulate", metavar="ARCH", help="list the cells of this emulated GPU")
    cl.set_defaults(run=cmd_cells)
    pl = sub.add_parser("pipeline", help="print the CI pipeline generated from the matrix")
    pl.add_argument("--format", choices=pipeline.FORMATS, required=True)
    pl.add_argument("--output", help="write it to this file instead of stdout")
    pl.set_defaults(run=cmd_pipeline)
