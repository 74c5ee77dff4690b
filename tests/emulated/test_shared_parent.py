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
# from the same root. On a platform's first device only: each costs two more imports of
# vLLM after the root's (a shared side's and an own side's).
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


def sharing(parents: Parents, group: str, folder: Path, **how: Any) -> Shared:
    return Shared(
        Path(parents.env(group)[PARENTS_ENV]), os.getpid(), sys.executable, folder / "logs", **how
    )


def run(cells: list[Cell], platform: str, folder: Path, shared: Shared | None) -> dict[str, Record]:
    """The cells in turn, through the shared parents when given (each asserted forked from
    the run's root, not an interpreter of its own: its log says why)."""
    records = {}
    preload = preload_for(platform, emulated=True)
    with Pool(log_dir=folder / "logs", preload=preload, sharing=shared) as pool:
        for cell in cells:
            records[cell.id] = run_cell(cell, folder / cell.column, pool=pool)
            if shared is not None:
                assert all(isinstance(s, SharedParent) for s in pool.servers), shared.refused
                assert all(s.forked_from for s in pool.servers), list(folder.glob("logs/*.log"))
    return records


def keyed(cell: Cell) -> bool:
    return any(cell.id.endswith(f"-{case}") for case in ENV_KEYED)


def differ(a: dict[str, Record], b: dict[str, Record]) -> dict[str, tuple[Any, Any]]:
    pairs = {cid: (facts(a[cid]), facts(b[cid])) for cid in b}
    return {cid: pair for cid, pair in pairs.items() if pair[0] != pair[1]}


def test_each_architectures_cells_after_anothers_match_a_parent_of_their_own(
    tmp_path: Path, stand_in_driver: None
) -> None:
    """Three sides. Shared: a platform's parent holding vLLM serves each architecture after
    another. Own: each device's parent imports all of vLLM once its device is chosen,
    forked from the same root (before any of vLLM: the root's watch proves it read nothing
    a platform decides). Fresh: on each platform's first device, an interpreter of its own,
    which proves the root adds nothing either. An interpreter per device would prove no
    more, for an import of vLLM (25 s of a core) each."""
    shared_dir, own_dir, fresh_dir = tmp_path / "shared", tmp_path / "own", tmp_path / "fresh"
    with Parents() as parents, ThreadPoolExecutor(2) as pool:
        # The longest first: each run waits on an import of vLLM, two at a time.
        shared_runs = [
            pool.submit(run, in_turn(p), p, shared_dir, sharing(parents, p, shared_dir))
            for p in SHARED_PLATFORMS
        ]
        ordinary = {p: [c for c in sample(p, FIRST[p]) if not keyed(c)] for p in SHARED_PLATFORMS}
        fresh_runs = [pool.submit(run, ordinary[p], p, fresh_dir, None) for p in ordinary]
        own_runs = [
            pool.submit(
                run, sample(p, a), p, own_dir,
                sharing(parents, f"{p}-own", own_dir, vllm_before_a_device=False),
            )
            for p, a in DEVICES
        ]  # fmt: skip
        shared = {k: v for r in shared_runs for k, v in r.result().items()}
        fresh = {k: v for r in fresh_runs for k, v in r.result().items()}
        own = {k: v for r in own_runs for k, v in r.result().items()}
    assert sorted(shared) == sorted(own) and len(own) >= 3 * len(DEVICES)
    assert [c for c in own if c.endswith("-aiter_on")] and [c for c in own if "-batch_inv" in c]
    assert not differ(shared, own), differ(shared, own)
    assert all(len(cells) >= 3 for cells in ordinary.values()), ordinary
    assert not differ(shared, fresh), differ(shared, fresh)
    # The samples hold what each architecture decides: DeepSeek's sparse MLA is missing
    # below 9.0 and there on 9.0.
    dsa = {c: own[c].outcome for c in own if c.endswith("deepseek_v32-default")}
    assert (
        dsa["cuda-sm80-emulated-deepseek_v32-default"]
        != dsa["cuda-sm90-emulated-deepseek_v32-default"]
    )
