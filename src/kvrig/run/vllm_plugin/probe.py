"""The block-size probe: what the worker chose, in the process that chose it.

In vLLM's default multiprocess engine the block size is settled in a worker process the
cell cannot inspect, and an early error reaches the caller only as "Engine core
initialization failed". So the probe wraps the two places that matter, in whichever
process they run, and appends one JSON line per event to the cell's probe file:

- `block_size_update`: `update_block_size_for_backend` (the early check lives inside);
- `kv_cache_sized`: entry to `prepare_kernel_block_sizes`, which only runs once the KV
  cache has been sized, with the KV-cache groups it was given;
- `kernel_block_sizes`: what it chose per group (the late check lives inside).
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import Any

from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol, missing_in, need, need_attr

_path: str | None = None


def emit(event: str, **data: Any) -> None:
    """Appends one event; a line per write keeps concurrent processes from interleaving."""
    if _path is None:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), **data}, default=str) + "\n"
    with open(_path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def error_info(exc: BaseException) -> dict[str, Any]:
    """Type, message and the innermost function of the traceback: where it was raised. A
    vLLM name kvrig reached for and did not find is the error, even where vLLM re-raised
    it as its own, and the record names it (missing_vllm_symbol)."""
    missing = missing_in(exc)
    if missing is not None:
        exc = missing
    frames = traceback.extract_tb(exc.__traceback__)
    info: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "function": frames[-1].name if frames else None,
        "frames": [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-8:]],
    }
    if missing is not None:
        info["missing_vllm_symbol"] = missing.symbol
    return info


_KERNEL_LIB = re.compile(r"/vllm/(_C(?:_[A-Z0-9]+)?)\.[\w.-]*so$")


def kernel_libraries(maps: str) -> list[str]:
    """The vllm._C* kernel libraries mapped into a process, from /proc/<pid>/maps."""
    return sorted({m.group(1) for line in maps.splitlines() if (m := _KERNEL_LIB.search(line))})


def isa_view(cache_config: Any) -> dict[str, Any]:
    """What this process's vLLM sees of the CPU: torch's probes, the class kvrig
    emulates (if any), the kernel library loaded and the SSM state dtype it settled on."""
    import torch

    try:
        with open("/proc/self/maps") as fh:
            libraries = kernel_libraries(fh.read())
    except OSError:
        libraries = []
    caps = torch.cpu.get_capabilities()
    return {
        "emulated_class": caps.get("kvrig_isa"),
        "avx512": bool(torch.cpu._is_avx512_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "amx": bool(torch.cpu._is_amx_tile_supported()),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_libraries": libraries,
        "mamba_ssm_cache_dtype": getattr(cache_config, "mamba_ssm_cache_dtype", None),
    }


# The hooks this process could not install, each with the MissingVllmSymbol message that
# names the vLLM name it needed (an emulated cell's record carries them).
missing: dict[str, str] = {}
USER = "kvrig's probe"


def install(path: str) -> None:
    """Wraps the two places that matter and says which it reached: a record whose probe
    did not report its hooks cannot tell an early error from a late one. A hook whose vLLM
    name the release lacks is left out and said, by name: the cell still runs, and its
    verdict says why its record cannot be trusted."""
    global _path
    _path = path
    hooks: list[str] = []
    for name, wrap in (
        ("update_block_size_for_backend", _wrap_update_block_size),
        ("prepare_kernel_block_sizes", _wrap_prepare_kernel_block_sizes),
    ):
        try:
            hooks.extend(wrap())
        except MissingVllmSymbol as exc:
            missing[name] = str(exc)
    emit("probe_installed", hooks=hooks, **({"missing": dict(missing)} if missing else {}))


def _layer_backends(vllm_config: Any) -> dict[str, str]:
    ctx = getattr(vllm_config.compilation_config, "static_forward_context", {}) or {}
    out = {}
    for name, layer in ctx.items():
        get = getattr(layer, "get_attn_backend", None)
        if get is None:
            continue
        try:
            out[name] = get().get_name()
        except Exception as exc:  # a layer without a backend yet says so
            out[name] = f"<{type(exc).__name__}>"
    return out


def _wrap_update_block_size() -> list[str]:
    platform_cls = type(need("vllm.platforms.current_platform", USER))
    original = need_attr(platform_cls, "update_block_size_for_backend", USER).__func__
    # What the wrapper reads once vLLM has chosen: missing, the hook is not installed
    # rather than failing the cell after vLLM's own code succeeded.
    need_attr(platform_cls, "_find_non_ssm_backends", USER)
    need("vllm.config.vllm.set_current_vllm_config", USER)

    def update_block_size_for_backend(cls: type, vllm_config: Any) -> None:
        cache = vllm_config.cache_config
        before = {
            "block_size_before": cache.block_size,
            "user_specified_block_size": bool(getattr(cache, "user_specified_block_size", False)),
            "platform": cls.__name__,
            **_worker_ranks(),
        }
        try:
            original(cls, vllm_config)
        except BaseException as exc:
            emit(
                "block_size_update",
                **before,
                layer_backends=_layer_backends(vllm_config),
                isa_view=isa_view(cache),
                error=error_info(exc),
            )
            raise
        backends = cls._find_non_ssm_backends(vllm_config)  # type: ignore[attr-defined]
        accepts = _accepts(vllm_config, backends, cache.block_size)
        emit(
            "block_size_update",
            **before,
            block_size=cache.block_size,
            mamba_block_size=getattr(cache, "mamba_block_size", None),
            mamba_page_size_padded=getattr(cache, "mamba_page_size_padded", None),
            mamba_cache_mode=getattr(cache, "mamba_cache_mode", None),
            backends=[b.get_name() for b in backends],
            backend_kernel_sizes={
                b.get_name(): [str(s) for s in b.get_supported_kernel_block_sizes()]
                for b in backends
            },
            accepts=accepts,
            layer_backends=_layer_backends(vllm_config),
            isa_view=isa_view(cache),
        )

    platform_cls.update_block_size_for_backend = classmethod(  # type: ignore[method-assign]
        update_block_size_for_backend
    )
    return [f"{platform_cls.__name__}.update_block_size_for_backend"]


def _worker_ranks() -> dict[str, int]:
    """The worker's pipeline stage and tensor-parallel rank, where vLLM's groups exist: each
    stage chooses its block from its own layers, so the record keeps them apart."""
    try:
        from vllm.distributed import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            return {}
        return {
            "pp_rank": parallel_state.get_pp_group().rank_in_group,
            "tp_rank": parallel_state.get_tp_group().rank_in_group,
        }
    except Exception:  # a release without these groups: the record has no stages
        return {}


def _accepts(vllm_config: Any, backends: list[type], block_size: int) -> dict[str, bool]:
    """Each backend's own supports_block_size() verdict on the chosen size."""
    from vllm.config.vllm import set_current_vllm_config

    with set_current_vllm_config(vllm_config):
        return {b.get_name(): bool(b.supports_block_size(block_size)) for b in backends}


def _group_info(group: Any, backends: list[str]) -> dict[str, Any]:
    spec = group.kv_cache_spec
    inner = getattr(spec, "kv_cache_specs", None)
    if inner:  # UniformTypeKVCacheSpecs: one type for all its layers
        spec = next(iter(inner.values()))
    info: dict[str, Any] = {
        "kind": type(spec).__name__,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "layers": list(group.layer_names),
        "backends": backends,
    }
    real = getattr(spec, "real_page_size_bytes", None)
    if real is not None:
        info["real_page_size_bytes"] = real
    return info


def _wrap_prepare_kernel_block_sizes() -> list[str]:
    original = need("vllm.v1.worker.utils.prepare_kernel_block_sizes", USER)

    def prepare_kernel_block_sizes(kv_cache_config: Any, attn_groups: Any) -> list[int]:
        groups = []
        for gid, group in enumerate(kv_cache_config.kv_cache_groups):
            names = []
            if gid < len(attn_groups):
                names = [g.backend.get_name() for g in attn_groups[gid]]
            groups.append(_group_info(group, names))
        emit("kv_cache_sized", num_blocks=kv_cache_config.num_blocks, groups=groups)
        try:
            result = original(kv_cache_config, attn_groups)
        except BaseException as exc:
            emit("kernel_block_sizes", error=error_info(exc))
            raise
        emit("kernel_block_sizes", kernel_block_sizes=list(result))
        return result

    # Every module that holds the function (a runner imported before the plugin, as in a
    # warm parent, took its own reference): each one is replaced, and named.
    holders = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("vllm.")
        and getattr(module, "prepare_kernel_block_sizes", None) is original
    ]
    for name in holders:
        sys.modules[name].prepare_kernel_block_sizes = prepare_kernel_block_sizes
    return [f"{name}.prepare_kernel_block_sizes" for name in sorted(holders)]
