"""What matrix.yaml holds: `kvrig validate`, `kvrig cells`, `kvrig pipeline`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvrig.cli.usage import UsageError
from kvrig.define import column_choice, show
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix, load
from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import hardware, isa
from kvrig.publish import pipeline
from kvrig.rules import versions
from kvrig.rules.explain import explain


def cmd_validate(ns: argparse.Namespace, extra: list[str]) -> int:
    m = load(ns.matrix)
    n = sum(len(expand(m, p)) for p in m.platforms)
    print(f"{m.path}: valid ({len(m.models)} models, {len(m.cases)} cases, {n} cells)")
    for platform, spec in m.platforms.items():
        release = versions.source_version(spec.vllm)
        note = versions.unread_note(platform, versions.parse(release)) if release else None
        if note:
            print(f"note: platforms.{platform} pins vLLM {release}: {note}")
    return 0


def cmd_cells(ns: argparse.Namespace, extra: list[str]) -> int:
    m = load(ns.matrix)
    if ns.show:
        return _show(m, ns.show)
    # Named, not run: a class or a device this host lacks still lists its cells.
    choice = column_choice.requested(ns.platform, ns.isa, ns.emulate, ns.gpu_arch)
    cells = expand(
        m,
        ns.platform,
        isa=choice.isa,
        emulated=choice.emulated,
        gpu_arch=choice.device or choice.arch,
        device_emulated=bool(choice.device),
    )
    if ns.explain:
        return _explain(cells, ns.explain)
    for cell in cells:
        gate = " [gate]" if cell.case.gate else ""
        print(f"{cell.id:<45} {cell.expect.outcome:<12}{gate}")
    return 0


def _show(m: Matrix, wanted: str) -> int:
    """A case or cell as it expands, each value after its line (kvrig.define.show)."""
    try:
        print("\n".join(show.show(m, wanted)))
    except show.UnknownId as exc:
        raise UsageError(str(exc)) from None
    return 0


def _explain(cells: list[Cell], cell_id: str) -> int:
    """How kvrig.rules computes one cell, on the host's CPU class when none is named."""
    cell = next((c for c in cells if c.id == cell_id), None)
    if cell is None:
        raise UsageError(
            f"--explain {cell_id}: not a cell here; `kvrig cells` lists them (with --platform,"
            " --isa or --emulate for another column)."
        )
    if cell.platform == "cpu" and cell.isa is None:
        cell = cell.model_copy(update={"isa": hardware.cpu_info().get("isa_class")})
    print("\n".join(explain(cell)))
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
    cl.add_argument(
        "--gpu-arch",
        metavar="ARCH",
        help="list the cells of this CUDA or ROCm architecture's column",
    )
    cl.add_argument(
        "--explain",
        metavar="CELL",
        help="print how kvrig.rules computes this cell's outcome (the verdict's steps)",
    )
    cl.add_argument(
        "--show",
        metavar="ID",
        help="print a case (its id, or <model>-<case>) or a cell as it expands, each value"
        " after the matrix.yaml line it comes from",
    )
    cl.set_defaults(run=cmd_cells)
    pl = sub.add_parser("pipeline", help="print the CI pipeline generated from the matrix")
    pl.add_argument("--format", choices=pipeline.FORMATS, required=True)
    pl.add_argument("--output", help="write it to this file instead of stdout")
    pl.set_defaults(run=cmd_pipeline)
