"""One emulated cell: vLLM's configuration phase for a GPU, in the order a worker runs it.

What a real engine does before its first forward pass, as far as it goes without a
device, each step vLLM's own function:

1. `EngineArgs(**engine_kwargs).create_engine_config()`: the model config from the
   miniature's config.json, the platform's `check_and_update_config`, the hybrid model
   configs' updates (mamba cache mode, the SSM state dtype); kvrig's general plugin is
   loaded here as in any engine, with the cell's crafted backends and the probe;
2. the model built on the meta device by vLLM's loader: every layer asks the selector for
   its backend (the arch's priority list and `validate_configuration`) and registers;
3. `current_platform.update_block_size_for_backend`: phase 1, the hybrid alignment, the
   early check (and XPU's GDN rounding with its second check);
4. the KV-cache specs of the real layers, the layout, `get_kv_cache_configs`, and the
   worker's `init_attn_backend` up to `prepare_kernel_block_sizes` (where the late check
   lives); what follows it needs a device.

With tensor parallelism each rank is a forked process of its own on a gloo group, as
vLLM's multiprocess executor gives each rank a worker, and every rank sizes its cache.
Nothing here generates: a `runs` cell passes when configuration completes at the size
it should (kvrig.judge.verdict).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from kvrig.run.emulation import KV_CACHE_BYTES, fakes, standins, target
from kvrig.run.identity import vllm_identity
from kvrig.run.vllm_plugin import probe
from kvrig.run.vllm_plugin.probe import error_info
from kvrig.run.vllm_plugin.symbols import need, need_attr

USER = "kvrig's emulation"
RANK_FILE = "rank{}.json"
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
    tp = int(kwargs.get("tensor_parallel_size") or 1)
    # The ranks meet in a file store; one left by an earlier run of the cell would hold
    # a stale rendezvous, and one removed after a rank has joined would strand it.
    (workdir / STORE_FILE).unlink(missing_ok=True)
    ranks = [0]
    children = []
    for rank in range(1, tp):
        pid = os.fork()
        if pid == 0:  # another rank's worker: the same steps, its summary in a file
            summary = _configure(kwargs, workdir, rank, tp, {"timings": {}})
            (workdir / RANK_FILE.format(rank)).write_text(json.dumps(summary, default=str))
            os._exit(0)
        children.append(pid)
        ranks.append(rank)
    t1 = time.monotonic()
    _configure(kwargs, workdir, 0, tp, out)
    out["timings"]["engine_start_s"] = round(time.monotonic() - t1, 3)
    for pid in children:
        os.waitpid(pid, 0)
    out["emulation"]["ranks"] = _ranks(workdir, ranks, out)
    if probe.missing:  # hooks whose vLLM names the release lacks: the verdict names them
        out["emulation"]["probe_missing"] = dict(probe.missing)
    out["timings"]["cell_s"] = round(time.monotonic() - t0, 3)
    return out


def _ranks(workdir: Path, ranks: list[int], own: dict[str, Any]) -> list[dict[str, Any]]:
    """What each rank chose: a rank whose size differs from rank 0's is an engine that
    could not start (the engine core takes one block size for all)."""
    rows = [{"rank": 0, "block_size": own.get("engine_block_size")}]
    for rank in ranks[1:]:
        path = workdir / RANK_FILE.format(rank)
        data = json.loads(path.read_text()) if path.is_file() else {}
        rows.append(
            {
                "rank": rank,
                "block_size": data.get("engine_block_size"),
                "error": (data.get("frontend_error") or {}).get("message"),
            }
        )
    return rows


def _configure(
    kwargs: dict[str, Any], workdir: Path, rank: int, world: int, out: dict[str, Any]
) -> dict[str, Any]:
    """Steps 1-4 for one rank; an exception ends them and is the cell's outcome."""
    try:
        _steps(kwargs, workdir, rank, world, out)
        out["configured"] = True
    except KernelSizesChosen as done:
        out["kernel_block_sizes"] = done.sizes
        out["configured"] = True
    except Exception as exc:  # the record says what vLLM raised, and where
        out["frontend_error"] = {**error_info(exc), "process": "front end"}
        import traceback

        traceback.print_exc()
    return out


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
    kwargs: dict[str, Any], workdir: Path, rank: int, world: int, out: dict[str, Any]
) -> None:
    import torch

    set_current_vllm_config = _vllm("config.vllm.set_current_vllm_config")
    config = _vllm("engine.arg_utils.EngineArgs")(**kwargs).create_engine_config()
    platform_cls = type(_vllm("platforms.current_platform"))
    emulation = out.setdefault("emulation", {})
    emulation["platform_class"] = platform_cls.__name__
    emulation["model_runner"] = model_runner(config)
    store = workdir / STORE_FILE
    with set_current_vllm_config(config):
        _vllm("distributed.init_distributed_environment")(
            world, rank, f"file://{store}", rank, "gloo"
        )
        _vllm("distributed.ensure_model_parallel_initialized")(world, 1)
    # The worker sets its workspace manager up before the model runner builds a layer
    # (gpu_worker.py, _init_workspace_and_model_runner); sparse MLA layers take theirs.
    _vllm("v1.worker.workspace.init_workspace_manager")(torch.device("meta"))
    _build_model(config)
    need_attr(platform_cls, "update_block_size_for_backend", USER)(config)
    out["engine_block_size"] = config.cache_config.block_size
    _kv_cache(config, kwargs)


def _build_model(config: Any) -> None:
    """vLLM's loader builds the real layers, on the meta device, with the CUDA objects
    some layers take as they are built standing in (kvrig.run.emulation.standins)."""
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
        loader.create_model(vllm_config=config, model_config=config.model_config)


def _kv_cache(config: Any, kwargs: dict[str, Any]) -> None:
    """The engine core's KV-cache planning and the worker's kernel block sizes."""
    import torch

    set_current_vllm_config = _vllm("config.vllm.set_current_vllm_config")
    planning = "v1.core.kv_cache_planning"
    attn_utils = _vllm("v1.worker.gpu.attn_utils")
    get_kv_cache_spec = _vllm("v1.worker.gpu.attn_utils.get_kv_cache_spec")
    init_attn_backend = _vllm("v1.worker.gpu.attn_utils.init_attn_backend")
    # The probe's wrapper, in force now (the warm parent imported attn_utils before the
    # plugin loaded, so the probe replaced this module's reference too).
    chosen = _vllm("v1.worker.gpu.attn_utils.prepare_kernel_block_sizes")

    _vllm("v1.core.single_type_kv_cache_manager.register_all_kvcache_specs")(config)
    memory = int(kwargs.get("kv_cache_memory_bytes") or KV_CACHE_BYTES)
    with set_current_vllm_config(config):
        specs = get_kv_cache_spec(config)
        backends = _vllm("distributed.kv_transfer.kv_connector.utils.get_current_attn_backends")
        supported = _vllm("v1.attention.backends.utils.get_supported_kv_cache_layouts")
        layouts = [x.name for x in supported(backends(config))]
        _vllm("v1.attention.backends.utils.resolve_kv_cache_layout")(
            config, [layouts], list(specs.values())
        )
        groups = _vllm(f"{planning}.get_global_kv_cache_groups")(config, [specs])
        need_attr(config, "adjust_dcp_kv_cache_interleave_size", USER)(groups)
        kv_config = _vllm(f"{planning}.get_kv_cache_configs")(config, [specs], [memory], groups)[0]

    def stop_after(kv_cache_config: Any, attn_groups: Any) -> list[int]:
        raise KernelSizesChosen(list(chosen(kv_cache_config, attn_groups)))

    attn_utils.prepare_kernel_block_sizes = stop_after
    try:
        with set_current_vllm_config(config):
            init_attn_backend(kv_config, config, torch.device("meta"))
    finally:
        attn_utils.prepare_kernel_block_sizes = chosen
