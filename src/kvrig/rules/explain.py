"""How kvrig.rules arrives at a cell's outcome, step by step, for people to read.

matrix.yaml's docs say why a case exists, not its arithmetic: the arithmetic is the one
every verdict checks, and a second hand-written copy in prose drifts. `kvrig cells
--explain <cell>` prints it from here instead.

Pure: a cell in, lines out.
"""

from __future__ import annotations

from kvrig.define.cells import Cell
from kvrig.rules import blocksize, shapes


def explain(cell: Cell) -> list[str]:
    """The computed outcome of a cell with each step, and the lines vLLM would log."""
    head = f"{cell.id}: expects {cell.expect.outcome}"
    if cell.isa:
        head += f" (CPU class {cell.isa})"
    if cell.gpu_arch:
        head += f" (GPU {cell.gpu_arch})"
    try:
        exp = blocksize.expected(
            cell, cell.config, cpu=blocksize.cpu_of(cell), gpu_arch=cell.gpu_arch
        )
    except (shapes.ConfigError, KeyError, ValueError) as exc:
        return [head, f"not computed: {exc}"]
    lines = [head, *(f"step        {step}" for step in exp.steps)]
    lines += [f"vLLM logs   {line}" for line in exp.log]
    if exp.unsupported:
        lines.append(f"computed    a refusal: {exp.unsupported}")
    elif exp.phase1_error:
        lines.append("computed    phase 1 finds no size every backend accepts")
    elif exp.rejecting:
        lines.append(
            f"computed    an early error at {exp.block_size} naming {', '.join(exp.rejecting)}"
        )
    else:
        lines.append(f"computed    block size {exp.block_size}")
    return lines
