"""Runs one cell: builds a real engine from the cell, generates, and writes what it saw.

This module is the body of the cell's own process (`python -m kvrig.run.cell WORKDIR`), which
kvrig.run.runner starts, watches and kills. The pure parts (engine arguments, environment,
crafted-backend spec) are importable without vLLM so the runner and unit tests use them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kvrig.define import models
from kvrig.define.cells import OFFLINE_ENV, Cell
from kvrig.host import isa
from kvrig.rules import blocksize
from kvrig.run import emulation, reach
from kvrig.run.emulation import EMULATE_ENV
from kvrig.run.identity import vllm_identity
from kvrig.run.vllm_plugin import CRAFT_ENV, PROBE_ENV
from kvrig.run.vllm_plugin.crafted import BackendSpec, CraftSpec
from kvrig.run.vllm_plugin.probe import error_info

CELL_FILE = "cell.json"
FRONTEND_FILE = "frontend.json"
PROBE_FILE = "probe.jsonl"
# A test hook: tests of the runner set it to make a cell misbehave without an engine
# ("sigill", "sleep:SECONDS", "orphan:SECONDS", "fake:SECONDS"); nothing in the rig sets it.
FAULT_ENV = "KVRIG_TEST_FAULT"
ORPHAN_PID_FILE = "orphan.pid"
# The cell's engine, kept alive until the process exits (os._exit): tearing it down
# costs about a second per cell, and nothing after the summary needs it gone.
_ENGINES: list[Any] = []
# A folder with only a sitecustomize.py: first on PYTHONPATH in an emulated cell.
ISA_BOOT = Path(__file__).resolve().parent / "isa_boot"


TP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def emulation_env(cell: Cell, pythonpath: str | None) -> dict[str, str]:
    """What makes every process of an emulated cell see its CPU class: the class, torch's
    and oneDNN's caps, and the boot folder whose sitecustomize caps torch's probes in each
    interpreter that starts (the warm parent, an engine core or worker vLLM spawns)."""
    if not (cell.emulated and cell.isa):
        return {}
    path = os.pathsep.join(p for p in (str(ISA_BOOT), pythonpath) if p)
    return {**isa.emulation_env(cell.isa), "PYTHONPATH": path}


# Set by an emulated column's run (kvrig.column.column_run) once the stand-in driver is built.
STUB_ENV = "KVRIG_LIBCUDA_STUB"
STUB_SYMBOLS_ENV = "KVRIG_LIBCUDA_STUB_SYMBOLS"


def device_env(cell: Cell, env: dict[str, str]) -> dict[str, str]:
    """What makes vLLM see the emulated device (kvrig.run.emulation): the device to fake,
    the stand-in libcuda.so.1 first on the loader's path, and no CUDA device for Triton."""
    if not (cell.device_emulated and cell.gpu_arch):
        return {}
    stub = env.get(STUB_ENV, "")
    path = os.pathsep.join(p for p in (stub, env.get("LD_LIBRARY_PATH")) if p)
    out = {
        EMULATE_ENV: emulation.spec(cell.platform, cell.gpu_arch),
        "CUDA_VISIBLE_DEVICES": "",
        "LD_LIBRARY_PATH": path,
        # humming (vLLM's quantized-kernel library) starts background builds of its CUDA
        # launcher at import, a thread and an interpreter per import; none serves a
        # configuration, and its thread would keep a warm parent from forking cells.
        "HUMMING_DISABLE_PARALLEL_BUILD": "1",
        # MoE layers open a CUDA stream for their shared experts as they are built.
        "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1",
        # vLLM caches what it inspects of each model class under its cache root, keyed by
        # the class's file and not by the release: two releases' columns side by side (the
        # release diff) would each find the other's entry stale and inspect the model again
        # in a fresh interpreter, for every cell. Each environment keeps its own.
        "VLLM_CACHE_ROOT": env.get("VLLM_CACHE_ROOT") or str(Path(sys.prefix) / "vllm-cache"),
    }
    if cell.platform == "rocm":
        # On ROCm vLLM's Triton check reads HIP_VISIBLE_DEVICES, not CUDA_VISIBLE_DEVICES,
        # to accept no active driver (vllm/triton_utils/importing.py).
        out["HIP_VISIBLE_DEVICES"] = ""
    if env.get("VLLM_TARGET_DEVICE") == "cpu":  # an explicit CPU target would win over it
        out["VLLM_TARGET_DEVICE"] = "cuda"
    return out


def selected_backend(cell: Cell) -> str:
    """The member the platform's selector picks for the cell's attention layers, as the
    rules restate it (kvrig.rules.blocksize.selected): on CUDA per compute capability and
    KV-cache dtype (FLASHINFER on SM10.x), on ROCm per gfx target, release and AITER, an
    MLA backend for latent layers; crafted backends are built over it, so they stand in
    for the backend vLLM would really give the layers."""
    return blocksize.selected(cell).name


def craft_spec(cell: Cell) -> CraftSpec | None:
    """The plugin's instructions for this cell, with bases resolved for its platform and
    an `aligned` size for the size alignment lands on under its CPU class."""
    crafted = cell.case.crafted
    if crafted.replace is None and not crafted.siblings:
        return None
    platform = cell.platform_spec
    # A replacement overrides the member the platform would pick; a case may name it (e.g.
    # TRITON_ATTN when the case selects that backend).
    default = cell.case.knobs.attention_backend or selected_backend(cell)
    aligned = None
    if blocksize.uses_aligned(crafted):
        aligned = blocksize.aligned_size(cell, cell.config, blocksize.cpu_of(cell))
    replace = None
    if crafted.replace is not None:
        r = crafted.replace
        sizes = blocksize.concrete_sizes(r.sizes, aligned)
        replace = BackendSpec(r.name, sizes, r.exact, r.target or default)
    siblings = tuple(
        BackendSpec(
            s.name, blocksize.concrete_sizes(s.sizes, aligned), s.exact, s.base or default, s.layers
        )
        for s in crafted.siblings
    )
    return CraftSpec(replace=replace, siblings=siblings, route=platform.crafted_route)


def cell_env(cell: Cell, workdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the cell's process; vLLM reads most of it at import time."""
    env = dict(os.environ if base is None else base)
    env.update(cell.env)
    env.update(OFFLINE_ENV)
    env.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if cell.multiprocessing else "0",
            "VLLM_PLUGINS": "kvrig",
            "PYTHONUNBUFFERED": "1",
            PROBE_ENV: str(workdir / PROBE_FILE),
        }
    )
    env.update(emulation_env(cell, env.get("PYTHONPATH")))
    env.pop(EMULATE_ENV, None)  # only an emulated cell's own setting may fake a device
    env.update(device_env(cell, env))
    tp = ranks(cell)
    if cell.platform == "cpu" and tp > 1:
        # vllm-cpu binds each rank's threads to a NUMA node of its own and refuses more
        # ranks than nodes; a core per rank works on any host with as many cores.
        env[TP_BIND_ENV] = "|".join(str(i) for i in range(tp))
    spec = craft_spec(cell)
    if spec is not None:
        env[CRAFT_ENV] = spec.to_json()
    else:
        env.pop(CRAFT_ENV, None)
    return env


# The knobs handed to vllm.LLM as they are written (the rest need a word of their own).
PASSED_KNOBS = (
    "block_size",
    "enable_prefix_caching",
    "mamba_ssm_cache_dtype",
    "mamba_cache_dtype",
    "mamba_block_size",
    "enable_chunked_prefill",
    "disable_hybrid_kv_cache_manager",
    "kv_cache_dtype",
    "kv_cache_dtype_skip_layers",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "cp_kv_cache_interleave_size",
    "prefix_match_unit",
    "disable_chunked_mm_input",
)


def ranks(cell: Cell) -> int:
    """The engine's worker processes: tensor x pipeline parallel ranks."""
    knobs = cell.case.knobs
    return (knobs.tensor_parallel_size or 1) * (knobs.pipeline_parallel_size or 1)


def speculative_config(cell: Cell) -> dict[str, Any]:
    """--speculative-config as vLLM reads it; a drafter of the matrix is written offline
    beside the target, as the target is."""
    spec = cell.case.knobs.speculative_config
    assert spec is not None
    out: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.method.startswith("ngram"):
        out["prompt_lookup_max"] = 3  # vLLM asks for a window; the block size ignores it
    if spec.model is not None and cell.draft is not None:
        out["model"] = str(models.write(spec.model, cell.draft_config or models.render(cell.draft)))
    if spec.max_model_len is not None:
        out["max_model_len"] = spec.max_model_len
    return out


def engine_kwargs(cell: Cell, model_dir: Path) -> dict[str, Any]:
    """Arguments for vllm.LLM: a tiny offline engine plus the case's knobs."""
    m = cell.model
    knobs = cell.case.knobs
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": m.dtype,
        "max_model_len": cell.max_model_len,
        "max_num_seqs": 4,
        "max_num_batched_tokens": max(256, cell.max_model_len),
        "enforce_eager": True,
        "seed": 0,
    }
    if cell.platform_spec.kv_cache_mb is not None:
        kwargs["kv_cache_memory_bytes"] = cell.platform_spec.kv_cache_mb * 2**20
    for name in PASSED_KNOBS:
        value = getattr(knobs, name)
        if value is not None:
            kwargs[name] = value
    if knobs.speculative_config is not None:
        kwargs["speculative_config"] = speculative_config(cell)
    if ranks(cell) > 1:
        kwargs["distributed_executor_backend"] = "mp"  # a process per rank, on one host
    backend = knobs.attention_backend
    if cell.case.crafted.replace is not None and cell.platform_spec.crafted_route == "custom":
        backend = "CUSTOM"
    if backend is not None:
        kwargs["attention_config"] = {"backend": backend}
    return kwargs


def run(workdir: Path) -> dict[str, Any]:
    """The engine's life for one cell; every result goes into the returned dict."""
    cell = Cell.model_validate_json((workdir / CELL_FILE).read_text())
    out: dict[str, Any] = {"timings": {}, "tokens_generated": 0, "pid": os.getpid()}
    t0 = time.monotonic()
    model_dir = models.write(cell.model_name, cell.config or models.render(cell.model))
    if cell.device_emulated:
        from kvrig.run.emulation import configure

        return configure.run(workdir, engine_kwargs(cell, model_dir))
    import vllm

    out["timings"]["import_s"] = round(time.monotonic() - t0, 3)
    wrong = vllm_identity(out)
    if wrong:  # the cell would test the base, not the overlay it is named for
        out["frontend_error"] = wrong
        return out
    kwargs = engine_kwargs(cell, model_dir)
    out["engine_kwargs"] = kwargs
    t1 = time.monotonic()
    try:
        llm = vllm.LLM(**kwargs)
        _ENGINES.append(llm)  # not torn down when run() returns: the process just exits
        out["timings"]["engine_start_s"] = round(time.monotonic() - t1, 3)
        out["engine_block_size"] = llm.llm_engine.vllm_config.cache_config.block_size
        params = vllm.SamplingParams(
            max_tokens=cell.case.max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
        )
        # bf16 prompts of <= 4 tokens hit an illegal instruction on some AMX CPUs; the
        # matrix keeps prompts at >= 5 tokens.
        prompt = {
            "prompt_token_ids": [(7 * i + 3) % 500 + 1 for i in range(cell.case.prompt_tokens)]
        }
        t2 = time.monotonic()
        result = llm.generate([prompt], params, use_tqdm=False)
        out["timings"]["generate_s"] = round(time.monotonic() - t2, 3)
        out["tokens_generated"] = len(result[0].outputs[0].token_ids)
    except Exception as exc:  # the record says what went wrong; the process itself is fine
        out["timings"].setdefault("engine_start_s", round(time.monotonic() - t1, 3))
        out["frontend_error"] = {**error_info(exc), "process": "front end"}
        traceback.print_exc()
    out["timings"]["cell_s"] = round(time.monotonic() - t0, 3)
    return out


def inject_fault(fault: str, workdir: Path) -> dict[str, Any]:
    """Misbehaves as a test asked, then returns a summary without an engine (if alive)."""
    kind, _, arg = fault.partition(":")
    print(f"kvrig test fault: {fault}", flush=True)
    if kind == "sigill":
        os.kill(os.getpid(), signal.SIGILL)
    elif kind == "orphan":
        pid = os.fork()
        if pid == 0:  # stays in the cell's session, meant to outlive the cell
            time.sleep(600)
            os._exit(0)
        (workdir / ORPHAN_PID_FILE).write_text(str(pid))
        time.sleep(float(arg or 0))
    elif kind in ("sleep", "fake"):
        time.sleep(float(arg or 0))
    else:
        raise ValueError(f"unknown {FAULT_ENV}: {fault!r}")
    return {"timings": {"cell_s": float(arg or 0)}, "tokens_generated": 0, "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kvrig.run.cell WORKDIR", file=sys.stderr)
        return 2
    workdir = Path(args[0])
    fault = os.environ.get(FAULT_ENV)
    with reach.measured(workdir / CELL_FILE):  # only under `kvrig check reach`
        out = inject_fault(fault, workdir) if fault else run(workdir)
    tmp = workdir / (FRONTEND_FILE + ".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str))
    tmp.replace(workdir / FRONTEND_FILE)
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's shutdown can linger on background threads; the record is written, so leave.
    os._exit(0)


if __name__ == "__main__":
    main()
