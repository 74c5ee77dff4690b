"""A platform's shared warm parent gives each architecture's cells the records a parent of
their own gives, with vLLM's own platform code (run by `nox -s emulated`).

Sharing one vLLM import per platform, and one root (vLLM's libraries) per run, is only
sound if nothing of one architecture, platform or variable leaks into the next, so the
cells are the ones whose outcome the architecture decides, each forked after another
architecture's cell, with those that set a variable vLLM reads at import (AITER's switches
on ROCm, VLLM_BATCH_INVARIANT on XPU) among them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvrig.define import gpus
from kvrig.define.cells import Cell, expand
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import load
from kvrig.run.forkserver import PARENTS_ENV, Pool, preload_for
from kvrig.run.platform_parent import SHARED_PLATFORMS, Parents, Shared, SharedParent
from kvrig.run.record import Record
from kvrig.run.runner import run_cell

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("elftools") is None,
    reason="needs the emulated columns' environment (nox -s emulated)",
)

CASES = (
    "granite_hybrid-default",
    "granite_4h_tiny-kv_fp8",
    "deepseek_v32-default",
    "qwen35_4b-default",
    "granite_hybrid-sibling_rejects",
)
# Cells that set a variable vLLM reads at import: a platform parent of their own, forked
# from the same root. On a platform's first device only: each costs its parent of their
# own another import of vLLM.
ENV_KEYED = ("granite_hybrid-aiter_on", "llama-batch_invariant")
DEVICES = [(p, a) for p, a in gpus.EMULATED if p in SHARED_PLATFORMS]
FIRST = {p: next(a for q, a in DEVICES if q == p) for p in SHARED_PLATFORMS}
# What a record holds that a parent could change; timings, pids and paths aside.
FACTS = (
    "outcome", "block_size_before", "user_specified_block_size", "worker_block_size",
    "engine_block_size", "mamba_page_size_padded", "mamba_block_size", "mamba_cache_mode",
    "alignment_log", "backends", "backends_accept", "backend_kernel_sizes", "layer_backends",
    "kv_cache_groups", "kernel_block_sizes", "kv_cache_sized_before_error", "probe_missing",
    "tokens_generated",
)  # fmt: skip


def facts(record: Record) -> dict[str, Any]:
    data = record.model_dump()
    out = {name: data.get(name) for name in FACTS}
    for name in ("error", "frontend_error"):
        error = data.get(name) or {}
        out[name] = {k: error.get(k) for k in ("type", "function", "message")}
    emulation = data.get("emulation") or {}
    out["emulation"] = {k: v for k, v in emulation.items() if k != "ranks"}
    return out


@pytest.fixture(scope="module")
def stand_in_driver() -> None:
    from kvrig.provision import libcuda_stub
    from kvrig.run.cell import STUB_ENV, STUB_SYMBOLS_ENV

    folder, symbols = libcuda_stub.ensure()
    os.environ[STUB_ENV] = str(folder)
    os.environ[STUB_SYMBOLS_ENV] = str(symbols)


def sample(platform: str, arch: str) -> list[Cell]:
    cells = expand(load(default_matrix()), platform, gpu_arch=arch, device_emulated=True)
    cases = CASES + (ENV_KEYED if FIRST[platform] == arch else ())
    chosen = [c for c in cells if any(c.id.endswith(f"-{case}") for case in cases)]
    return [c for c in chosen if c.expect.outcome != "skip"]


def in_turn(platform: str) -> list[Cell]:
    """The platform's cells, each architecture's after another architecture's."""
    per_device = [sample(p, a) for p, a in DEVICES if p == platform]
    rounds = range(max(map(len, per_device)))
    return [cells[i] for i in rounds for cells in per_device if i < len(cells)]


def shared_run(platform: str, parents: Parents, folder: Path) -> dict[str, Record]:
    shared = Shared(
        Path(parents.env(platform)[PARENTS_ENV]), os.getpid(), sys.executable, folder / "logs"
    )
    records = {}
    preload = preload_for(platform, emulated=True)
    with Pool(log_dir=folder / "logs", preload=preload, sharing=shared) as pool:
        for cell in in_turn(platform):
            records[cell.id] = run_cell(cell, folder / cell.column, pool=pool)
            assert all(isinstance(s, SharedParent) for s in pool.servers), shared.refused
            # forked from the run's root, not an interpreter of its own (its log says why)
            assert all(s.forked_from for s in pool.servers), list(folder.glob("logs/*.log"))
    return records


def own_run(platform: str, arch: str, folder: Path) -> dict[str, Record]:
    """The device's cells from a parent of its own, as a lone column forks them."""
    preload = preload_for(platform, emulated=True)
    with Pool(log_dir=folder / "logs", preload=preload) as pool:
        return {c.id: run_cell(c, folder / c.column, pool=pool) for c in sample(platform, arch)}


def test_each_architectures_cells_after_anothers_match_a_parent_of_their_own(
    tmp_path: Path, stand_in_driver: None
) -> None:
    # One pool for both sides, the shared runs (the longest) first: each run waits on an
    # import of vLLM, so a side of its own would leave a core idle through its last one.
    with Parents() as parents, ThreadPoolExecutor(2) as pool:
        shared_runs = [
            pool.submit(shared_run, p, parents, tmp_path / "shared") for p in SHARED_PLATFORMS
        ]
        own_runs = [pool.submit(own_run, *d, tmp_path / "own") for d in DEVICES]
        shared = {k: v for run in shared_runs for k, v in run.result().items()}
        own = {k: v for run in own_runs for k, v in run.result().items()}
    assert sorted(shared) == sorted(own) and len(own) >= 3 * len(DEVICES)
    assert [c for c in own if c.endswith("-aiter_on")] and [c for c in own if "-batch_inv" in c]
    differ = {cid: (facts(shared[cid]), facts(own[cid])) for cid in own}
    differ = {cid: pair for cid, pair in differ.items() if pair[0] != pair[1]}
    assert not differ, differ
    # The samples hold what each architecture decides: DeepSeek's sparse MLA is missing
    # below 9.0 and there on 9.0.
    dsa = {c: own[c].outcome for c in own if c.endswith("deepseek_v32-default")}
    assert (
        dsa["cuda-sm80-emulated-deepseek_v32-default"]
        != dsa["cuda-sm90-emulated-deepseek_v32-default"]
    )
