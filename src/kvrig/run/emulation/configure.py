"""One emulated cell: vLLM's configuration phase for a GPU, in the order a worker runs it.

What a real engine does before its first forward pass, as far as it goes without a
device, each step vLLM's own function:

1. `EngineArgs(**engine_kwargs).create_engine_config()`: the platform's
   `check_and_update_config` and the hybrid model configs' updates, with kvrig's general
   plugin loaded as in any engine;
2. the model built on the meta device by vLLM's loader: every layer asks the selector for
   its backend;
3. `current_platform.update_block_size_for_backend`: phase 1, the hybrid alignment, the
   early check (and XPU's GDN rounding);
4. the KV-cache specs, the engine core's `EngineCore._initialize_kv_caches` over every
   worker's specs, and rank 0's `init_attn_backend` up to `prepare_kernel_block_sizes`
   (the late check); what follows needs a device.

Each tensor- or pipeline-parallel rank is a forked process on a gloo group, as vLLM's
multiprocess executor gives each rank a worker. Nothing generates: a `runs` cell passes
when configuration completes at the size it should (kvrig.judge.verdict).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.run.emulation import KV_CACHE_BYTES, fakes, standins, target
from kvrig.run.identity import vllm_identity
from kvrig.run.vllm_plugin import probe
from kvrig.run.vllm_plugin.probe import error_info
from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol, need, need_attr

USER = "kvrig's emulation"
RANK_FILE = "rank{}.json"
# A rank's KV-cache specs and supported layouts, for the engine core's step in rank 0.
SPECS_FILE = "rank{}.specs"
STORE_FILE = "dist-store"


class KernelSizesChosen(Exception):
    """Raised right after the worker chose its kernel block sizes: the rest of
    init_attn_backend builds metadata on the device."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sizes)
        self.sizes = sizes


def run(workdir: Path, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The cell's summary (the same keys as a real cell's front end writes), with what was
    faked and how far vLLM's code got."""
    device = target()
    assert device is not None, "an emulated cell runs only under KVRIG_EMULATE"
    out: dict[str, Any] = {"timings": {}, "tokens_generated": 0, "pid": os.getpid()}
    t0 = time.monotonic()
    import torch

    out["timings"]["import_s"] = round(time.monotonic() - t0, 3)
    wrong = vllm_identity(out)
    if wrong:  # the cell would configure the base, not the overlay it is named for
        out["frontend_error"] = wrong
        return out
    kwargs = dict(engine_kwargs)
    out["engine_kwargs"] = kwargs
    stub = os.environ.get("KVRIG_LIBCUDA_STUB_SYMBOLS")
    out["emulation"] = {
        "platform": device.platform,
        "arch": device.arch,
        "device_name": device.name,
        "torch_cuda": torch.version.cuda,
        "fakes": fakes(device, int(stub) if stub and stub.isdigit() else None),
    }
    layout = Layout(
        int(kwargs.get("tensor_parallel_size") or 1), int(kwargs.get("pipeline_parallel_size") or 1)
    )
    # The ranks meet in a file store; one left by an earlier run of the cell would hold
    # a stale rendezvous, and one removed after a rank has joined would strand it.
    (workdir / STORE_FILE).unlink(missing_ok=True)
    children = []
    for rank in range(1, layout.world):
        pid = os.fork()
        if pid == 0:  # another rank's worker: the same steps, its summary in files
            _other_rank(kwargs, workdir, rank, layout)
        children.append(pid)
    t1 = time.monotonic()
    worker = _configure(kwargs, workdir, 0, layout, out)
    for pid in children:
        os.waitpid(pid, 0)
    out["emulation"]["ranks"] = _ranks(workdir, layout, out)
    if worker is not None and "frontend_error" not in out:
        failed = _rank_error(workdir, layout)
        if failed is not None:  # the engine fails with the worker's own exception
            out["frontend_error"] = failed
        else:
            _engine_core(worker, kwargs, workdir, layout, out)
    out["timings"]["engine_start_s"] = round(time.monotonic() - t1, 3)
    if probe.missing:  # hooks whose vLLM names the release lacks: the verdict names them
        out["emulation"]["probe_missing"] = dict(probe.missing)
    out["timings"]["cell_s"] = round(time.monotonic() - t0, 3)
    return out


@dataclass(frozen=True)
class Layout:
    """The engine's ranks as vLLM's multiprocess executor lays them out: rank r holds
    tensor-parallel rank r % tp of pipeline stage r // tp."""

    tp: int
    pp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def stage(self, rank: int) -> int:
        return rank // self.tp


def _other_rank(kwargs: dict[str, Any], workdir: Path, rank: int, layout: Layout) -> None:
    """A forked rank's life: its worker's steps, then its summary and its specs for rank
    0's engine core, then out (the fork must not return into the cell's own code)."""
    summary: dict[str, Any] = {"timings": {}}
    try:
        worker = _configure(kwargs, workdir, rank, layout, summary)
        if worker is not None:
            _save_specs(workdir, rank, worker)
        (workdir / RANK_FILE.format(rank)).write_text(json.dumps(summary, default=str))
    finally:
        os._exit(0)


def _ranks(workdir: Path, layout: Layout, own: dict[str, Any]) -> list[dict[str, Any]]:
    """What each rank chose, with its pipeline stage: ranks of one stage that differ are
    an engine that could not start (its workers share one block size); stages may
    differ, each sizing from its own layers."""
    rows = [{"rank": 0, "stage": 0, "block_size": own.get("worker_block_size")}]
    for rank in range(1, layout.world):
        path = workdir / RANK_FILE.format(rank)
        data = json.loads(path.read_text()) if path.is_file() else {}
        rows.append(
            {
                "rank": rank,
                "stage": layout.stage(rank),
                "block_size": data.get("worker_block_size"),
                "error": (data.get("frontend_error") or {}).get("message")
                or (None if path.is_file() else "the rank wrote no summary"),
            }
        )
    return rows


def _rank_error(workdir: Path, layout: Layout) -> dict[str, Any] | None:
    """The first other rank's error, as its summary holds it (a real engine's front end
    reports the failing worker's exception)."""
    for rank in range(1, layout.world):
        path = workdir / RANK_FILE.format(rank)
        data = json.loads(path.read_text()) if path.is_file() else {}
        if data.get("frontend_error"):
            return {**data["frontend_error"], "process": "worker"}
    return None


class Worker:
    """What a rank's worker holds once its block size is chosen: its config, its KV-cache
    specs and the layouts its backends support (what the executor hands the core), and
    the engine core's config (the worker's own in one process, a copy left unaligned
    when the workers are processes of their own)."""

    def __init__(
        self, config: Any, core_config: Any, specs: dict[str, Any], layouts: list[str]
    ) -> None:
        self.config, self.core_config = config, core_config
        self.specs, self.layouts = specs, layouts


def _save_specs(workdir: Path, rank: int, worker: Worker) -> None:
    with open(workdir / SPECS_FILE.format(rank), "wb") as fh:
        pickle.dump((worker.specs, worker.layouts), fh)


def _load_specs(workdir: Path, rank: int) -> tuple[dict[str, Any], list[str]] | None:
    path = workdir / SPECS_FILE.format(rank)
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        loaded: tuple[dict[str, Any], list[str]] = pickle.load(fh)
    return loaded


def _configure(
    kwargs: dict[str, Any], workdir: Path, rank: int, layout: Layout, out: dict[str, Any]
) -> Worker | None:
    """Steps 1-3 and the worker's specs for one rank; an exception ends them and is the
    cell's outcome (None)."""
    try:
        return _steps(kwargs, workdir, rank, layout, out)
    except Exception as exc:  # the record says what vLLM raised, and where
        _failed(out, exc)
    return None


def _failed(out: dict[str, Any], exc: BaseException) -> None:
    out["frontend_error"] = {**error_info(exc), "process": "front end"}
    import traceback

    traceback.print_exc()


def _vllm(name: str) -> Any:
    """One of vLLM's names the steps call, named in the record if the release lacks it."""
    return need(f"vllm.{name}", USER)


def model_runner(config: Any) -> str:
    """Which model runner the release's workers build, as a fact of the release: 0.34.0
    removed Model Runner V1 and, with it, the config's switch."""
    if not hasattr(config, "use_v2_model_runner"):
        return "v2 (VllmConfig has no use_v2_model_runner: Model Runner V1 removed in this release)"
    return "v2" if config.use_v2_model_runner else "v1"


def _steps(
    kwargs: dict[str, Any], workdir: Path, rank: int, layout: Layout, out: dict[str, Any]
) -> Worker:
    import torch

    set_current_vllm_config = _vllm("config.vllm.set_current_vllm_config")
    config = _vllm("engine.arg_utils.EngineArgs")(**kwargs).create_engine_config()
    # The engine core's own copy, as vLLM's multiprocess executor leaves it: the workers
    # align theirs in their processes, and the core learns the block from their specs.
    core_config = copy.deepcopy(config) if layout.world > 1 else config
    platform_cls = type(_vllm("platforms.current_platform"))
    emulation = out.setdefault("emulation", {})
    emulation["platform_class"] = platform_cls.__name__
    emulation["model_runner"] = model_runner(config)
    config.parallel_config.rank = rank
    store = workdir / STORE_FILE
    with set_current_vllm_config(config):
        _vllm("distributed.init_distributed_environment")(
            layout.world, rank, f"file://{store}", rank, "gloo"
        )
        _vllm("distributed.ensure_model_parallel_initialized")(layout.tp, layout.pp)
    # The worker sets its workspace manager up before the model runner builds a layer
    # (gpu_worker.py, _init_workspace_and_model_runner); sparse MLA layers take theirs.
    _vllm("v1.worker.workspace.init_workspace_manager")(torch.device("meta"))
    _build_model(config)
    need_attr(platform_cls, "update_block_size_for_backend", USER)(config)
    out["worker_block_size"] = config.cache_config.block_size
    _vllm("v1.core.single_type_kv_cache_manager.register_all_kvcache_specs")(config)
    with set_current_vllm_config(config):
        specs = _vllm("v1.worker.gpu.attn_utils.get_kv_cache_spec")(config)
        backends = _vllm("distributed.kv_transfer.kv_connector.utils.get_current_attn_backends")
        supported = _vllm("v1.attention.backends.utils.get_supported_kv_cache_layouts")
        layouts = [x.name for x in supported(backends(config))]
    return Worker(config, core_config, specs, layouts)


def _build_model(config: Any) -> None:
    """vLLM's loader builds the real layers, on the meta device, with the CUDA objects
    some layers take as they are built standing in (kvrig.run.emulation.standins); a
    speculative config's drafter is built after the target, as the worker's model runner
    loads it (its layers join the ones the block size is chosen for)."""
    import torch

    from kvrig.run.emulation.meta import GpuToMeta

    loader = _vllm("model_executor.model_loader.get_model_loader")(config.load_config)
    with (
        _vllm("config.vllm.set_current_vllm_config")(config),
        _vllm("utils.torch_utils.set_default_torch_dtype")(config.model_config.dtype),
        torch.device("meta"),
        GpuToMeta(),
        standins.while_built(target()),
    ):
        model = loader.create_model(vllm_config=config, model_config=config.model_config)
        if config.speculative_config is not None and _is_last_stage():
            _build_drafter(config, model)


def _is_last_stage() -> bool:
    """The model runner builds a speculator on the last pipeline stage only."""
    return bool(_vllm("distributed.get_pp_group")().is_last_rank)


def _build_drafter(config: Any, model: Any) -> None:
    """The speculator vLLM's model runner builds (init_speculator), loading its drafter
    beside the target as load_model does; one without a drafter (ngram) builds no layer."""
    import torch

    speculator = _vllm("v1.worker.gpu.spec_decode.init_speculator")(
        config, torch.device("meta"), None
    )
    if isinstance(speculator, _vllm("v1.worker.gpu.spec_decode.speculator.DraftModelSpeculator")):
        speculator.load_model(model)


class _Executor:
    """What the engine core asks of its executor before the KV cache exists, answered with
    what the workers found (their specs and layouts), the fixed memory, and rank 0's own
    worker for the kernel block sizes."""

    def __init__(self, workers: list[tuple[dict[str, Any], list[str]]], memory: int, own: Worker):
        self.workers, self.memory, self.own = workers, memory, own
        self.kv_cache_configs: list[Any] = []

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [specs for specs, _ in self.workers]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [layouts for _, layouts in self.workers]

    def set_kv_cache_layout(self, layout_name: str, cp_kv_cache_interleave_size: int) -> None:
        return None

    def determine_available_memory(self) -> list[int]:
        return [self.memory] * len(self.workers)

    def extensible_kv_cache_unsupported_reason(self, kv_cache_specs: Any) -> str | None:
        return "kvrig's emulation sizes a fixed KV cache"

    def disable_extensible_kv_cache(self, reason: str) -> None:
        return None

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.kv_cache_configs = list(kv_cache_configs)
        _kernel_blocks(self.own.config, kv_cache_configs[0])

    def compile_or_warm_up_model(self) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        """A call this release's engine core makes that the emulation does not answer: kvrig
        does not fit the release yet (the cell is undecided), not vLLM's failure."""
        raise MissingVllmSymbol(
            f"vllm.v1.engine.core.EngineCore.model_executor.{name}",
            USER,
            "the engine core asks its executor for it, and kvrig's emulated executor does"
            " not answer it yet",
        )


class _Core:
    """The engine core as `_initialize_kv_caches` reads itself: its executor, and the
    collective call it makes when auto-fit moved max_model_len."""

    def __init__(self, executor: _Executor) -> None:
        self.model_executor = executor

    def collective_rpc(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def _engine_core(
    worker: Worker, kwargs: dict[str, Any], workdir: Path, layout: Layout, out: dict[str, Any]
) -> None:
    """The engine core's step over every rank's specs; its block is the record's
    engine_block_size, as a real engine's front end reads it."""
    workers = [(worker.specs, worker.layouts)]
    for rank in range(1, layout.world):
        loaded = _load_specs(workdir, rank)
        if loaded is None:
            out["frontend_error"] = {
                "type": "RuntimeError",
                "message": f"rank {rank} handed the engine core no KV-cache specs",
                "function": "_engine_core",
                "process": "front end",
            }
            return
        workers.append(loaded)
    memory = int(kwargs.get("kv_cache_memory_bytes") or KV_CACHE_BYTES)
    executor = _Executor(workers, memory, worker)
    config = worker.core_config
    try:
        with _vllm("config.vllm.set_current_vllm_config")(config):
            _vllm("v1.engine.core.EngineCore")._initialize_kv_caches(_Core(executor), config)
    except KernelSizesChosen as done:
        out["kernel_block_sizes"] = done.sizes
    except Exception as exc:
        _failed(out, exc)
        return
    out["engine_block_size"] = config.cache_config.block_size
    if executor.kv_cache_configs:
        kv = executor.kv_cache_configs[0]
        out["emulation"]["hash_block_size"] = getattr(kv, "hash_block_size", None)
    out["configured"] = "frontend_error" not in out


def _kernel_blocks(config: Any, kv_config: Any) -> None:
    """The worker's init_attn_backend up to its kernel block sizes (KernelSizesChosen)."""
    import torch

    attn_utils = _vllm("v1.worker.gpu.attn_utils")
    init_attn_backend = _vllm("v1.worker.gpu.attn_utils.init_attn_backend")
    # The probe's wrapper, in force now (the warm parent imported attn_utils before the
    # plugin loaded, so the probe replaced this module's reference too).
    chosen = _vllm("v1.worker.gpu.attn_utils.prepare_kernel_block_sizes")

    def stop_after(kv_cache_config: Any, attn_groups: Any) -> list[int]:
        raise KernelSizesChosen(list(chosen(kv_cache_config, attn_groups)))

    attn_utils.prepare_kernel_block_sizes = stop_after
    try:
        with _vllm("config.vllm.set_current_vllm_config")(config):
            init_attn_backend(kv_config, config, torch.device("meta"))
    finally:
        attn_utils.prepare_kernel_block_sizes = chosen
