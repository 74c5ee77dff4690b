"""What the engine core plans past the worker's block: the state group's block, its own
block, its KV-cache groups, and what one request pins of them.

The worker's block is only half of what a deployment sees: the engine core takes the
smallest block of its groups (max_model_len for a hybrid's state without prefix caching,
an unaligned pipeline stage's), and each request holds at least one block of every
group. The cells' verdicts (kvrig.rules.blocksize) and `kvrig predict` read them here.

Pure: sizes and counts in, sizes and counts out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from kvrig.define.vllm_models import HYBRID_FAMILIES, Family
from kvrig.define.vllm_names import OWN_CONTEXT_DRAFT_METHODS

# The families whose layers keep a state the engine core plans groups of.
STATE_FAMILIES = HYBRID_FAMILIES | {Family.MAMBA}

MAMBA_BLOCK_REFUSED = "--mamba-block-size can only be set with --enable-prefix-caching"


def mamba_block_refused(mamba_block_size: int | None, align: bool, max_model_len: int) -> bool:
    """VllmConfig.validate_mamba_block_size: a --mamba-block-size other than max_model_len
    without prefix caching is refused before any engine starts."""
    return mamba_block_size not in (None, max_model_len) and not align


def served_context(
    max_model_len: int, method: str | None = None, draft_max_model_len: int | None = None
) -> int:
    """The context the engine serves: a drafter with positions of its own and a shorter
    context lowers the target's to it (VllmConfig._limit_max_model_len_to_draft)."""
    if method in OWN_CONTEXT_DRAFT_METHODS and draft_max_model_len is not None:
        return min(max_model_len, draft_max_model_len)
    return max_model_len


def pipeline_split(layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as get_pp_indices splits them: evenly, the
    remainder to the stages before the last."""
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    starts = list(itertools.accumulate([0, *sizes]))
    return [range(starts[i], starts[i + 1]) for i in range(pp)]


def core_blocks(
    family: Family,
    blocks: Sequence[int],
    *,
    align: bool,
    max_model_len: int,
    configured: int | None = None,
) -> tuple[int | None, int]:
    """(the state group's block, the engine core's block) over the workers' blocks: the
    core takes the smallest block of its groups (EngineCore._initialize_kv_caches), an
    attention group at its worker's block, a state group at that block in align mode and
    at max_model_len otherwise (MambaModelConfig). An attention-free model's state in
    align mode keeps the block configured before any platform set the worker's
    (`configured`: CacheConfig's default, where the CPU then sets 128), since nothing
    aligns it."""
    if family not in STATE_FAMILIES:
        return None, min(blocks)
    if family == Family.MAMBA:
        state = (configured or blocks[0]) if align else max_model_len
        return state, state
    states = list(blocks) if align else [max_model_len]
    return (blocks[0] if align else max_model_len), min([*blocks, *states])


def group_count(attention_layers: int, state_layers: int) -> int:
    """How many KV-cache groups the engine core forms for one kind of attention layer and
    one kind of state layer (kv_cache_planning: equal-sized groups, their size the fewer
    layers of a kind, or the more where that pads less than half): each request holds a
    block of every group."""
    kinds = [n for n in (attention_layers, state_layers) if n]
    if not kinds:
        return 0
    size = min(kinds)
    if max(kinds) < size * 1.5:
        size = max(kinds)
    return sum(math.ceil(n / size) for n in kinds)
