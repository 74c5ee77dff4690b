"""Records and results rows the unit tests share, built by hand (no engine runs): a CPU
cell's record as the runner writes it (`ran`, `failed`), an emulated CUDA cell's
(`configured`), and the results row kvrig.publish.results writes for a cell of BASE."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import Matrix
from kvrig.judge.verdict import Status, Verdict
from kvrig.publish import results
from kvrig.run.record import ErrorInfo, KVGroup, Record

from .builders import BASE

# --- a CPU cell's record -----------------------------------------------------------------

HOOKS = [
    "CpuPlatform.update_block_size_for_backend",
    "vllm.v1.worker.utils.prepare_kernel_block_sizes",
]


def alignment(size: int, mamba: int, start: int = 128, per_token: int = 256) -> dict[str, Any]:
    """What vLLM's hybrid alignment sets and logs when it takes `start` to `size` against
    a mamba page of `mamba` bytes (interface.py, _align_hybrid_block_size)."""
    page = size * per_token
    log = []
    if size > start:
        log.append(
            f"Setting attention block size to {size} tokens to ensure that attention page"
            " size is >= mamba page size."
        )
    if page != mamba:
        log.append(
            f"Padding mamba page size by {100 * (page - mamba) / mamba:.2f}% to ensure that"
            " mamba page size and attention page size are exactly equal."
        )
    return {"mamba_page_size_padded": page if page != mamba else None, "alignment_log": log}


def ran(**kw: Any) -> Record:
    """A record of cell_with's cell, `c`, on CPU: ran at 384 as vLLM 0.32.0 aligns granite."""
    base: dict[str, Any] = dict(
        cell_id="cpu-granite_hybrid-c",
        platform="cpu",
        model="granite_hybrid",
        case="c",
        family="hybrid_mamba",
        outcome="ran",
        tokens_generated=4,
        worker_block_size=384,
        engine_block_size=384,
        backends_accept={"CPU_ATTN": True},
        kv_cache_groups=[
            KVGroup(
                kind="MambaSpec", block_size=384, page_size_bytes=98304, real_page_size_bytes=67840
            ),
            KVGroup(
                kind="FullAttentionSpec",
                block_size=384,
                page_size_bytes=98304,
                real_page_size_bytes=98304,
            ),
        ],
        kernel_block_sizes=[384, 384],
        layer_backends={"model.layers.1.self_attn.attn": "CPU_ATTN"},
        probe_hooks=HOOKS,
        kv_cache_sized_seen=True,
        **alignment(384, 67840),
    )
    base.update(kw)
    return Record(**base)


def failed(message: str, function: str, sized: bool, type_: str = "ValueError") -> Record:
    """`ran`'s cell, ended by `type_(message)` raised in `function`, before any token."""
    return ran(
        outcome="error",
        tokens_generated=0,
        worker_block_size=None,
        error=ErrorInfo(type=type_, message=message, function=function),
        kv_cache_sized_before_error=sized,
        kv_cache_sized_seen=sized,
    )


# --- an emulated CUDA cell's record --------------------------------------------------------

SETTING = (
    "Setting attention block size to 144 tokens to ensure that attention page size is >="
    " mamba page size."
)
PADDING = (
    "Padding mamba page size by 5.11% to ensure that mamba page size and attention page size"
    " are exactly equal."
)


def configured(cell: Any, **kw: Any) -> Record:
    """An emulated record as kvrig.run.emulation writes it: granite at 144 (bf16 state)."""
    base: dict[str, Any] = dict(
        **cell.identity(),
        outcome="configured",
        worker_block_size=144,
        engine_block_size=144,
        mamba_page_size_padded=36864,
        mamba_block_size=144,
        mamba_cache_mode="align",
        alignment_log=[SETTING, PADDING],
        backends=["FLASH_ATTN"],
        backends_accept={"FLASH_ATTN": True},
        kv_cache_groups=[
            KVGroup(kind="MambaSpec", block_size=144, page_size_bytes=36864),
            KVGroup(kind="FullAttentionSpec", block_size=144, page_size_bytes=36864),
        ],
        kernel_block_sizes=[144, 144],
        layer_backends={"model.layers.1.self_attn.attn": "FLASH_ATTN"},
        probe_hooks=[
            "EmulatedCudaPlatform.update_block_size_for_backend",
            "vllm.v1.worker.gpu.attn_utils.prepare_kernel_block_sizes",
        ],
        probe_hooks_by_pid={
            "7": [
                "EmulatedCudaPlatform.update_block_size_for_backend",
                "vllm.v1.worker.gpu.attn_utils.prepare_kernel_block_sizes",
            ]
        },
        sizing_pid=7,
        kv_sized_pid=7,
        kv_cache_sized_seen=True,
        emulation={
            "platform": "cuda",
            "arch": "9.0",
            "platform_class": "EmulatedCudaPlatform",
            "ranks": [{"rank": 0, "block_size": 144}],
        },
    )
    base.update(kw)
    return Record(**base)


# --- results rows -------------------------------------------------------------------------

ENDED = dt.datetime(2026, 11, 29, 17, 40, tzinfo=dt.timezone.utc)
# BASE's two cells: the gated one, and the other.
REQUIRED = "cpu-granite_hybrid-default"
OTHER = "cpu-granite_hybrid-sibling_rejects"


def row(cell_id: str, status: str, **kw: Any) -> dict[str, Any]:
    """A results row as kvrig.publish.results.row writes it, for a cell of BASE."""
    cell = next(c for c in expand(Matrix.model_validate(BASE)) if c.id == cell_id)
    return cell_row(cell, status, **kw)


def cell_row(cell: Cell, status: str, host_isa: str | None = None, **kw: Any) -> dict[str, Any]:
    """A results row for a cell, written on a host of class `host_isa` (None: unknown)."""
    cell_id = cell.id
    host: dict[str, Any] = {"hostname": "vm", "cores": 2, "cpu_model": "Xeon"}
    if host_isa is not None:
        host["isa_class"] = host_isa
    rec = Record(
        **cell.identity(),
        outcome="ran",
        worker_block_size=kw.pop("block", 384),
        engine_block_size=kw.pop("core", 384),
        timings={"wall_s": 30.0},
        vllm_version="0.32.0",
        host=host,
    )
    out = results.row(
        cell, rec, Verdict(cell_id, Status(status), kw.pop("reason", "as expected: ran")), ENDED
    )
    out.update(kw)
    return out
