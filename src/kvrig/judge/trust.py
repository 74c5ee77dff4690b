"""Whether a record's facts are the ones its cell is about, whatever the cell expects.

Apart from the verdict because these checks ask nothing of the expected outcome: they come
first, for a known-defect cell too, and grow with the emulation and the probe.
"""

from __future__ import annotations

import re
from typing import Any

from kvrig.define import gpus
from kvrig.define.case_spec import EarlyError, Expectation, LateError, Runs
from kvrig.define.cells import Cell
from kvrig.host import isa
from kvrig.judge.computed import cpu_class
from kvrig.run.record import Record


def trust_problem(cell: Cell, expect: Expectation, rec: Record) -> str | None:
    """What makes the record's facts not the ones the cell is about, whatever it expects."""
    return (
        _probe_problem(expect, rec) or _emulation_problem(cell, rec) or _device_problem(cell, rec)
    )


PROBE_HOOKS = (".update_block_size_for_backend", ".prepare_kernel_block_sizes")


def _probe_problem(expect: Expectation, rec: Record) -> str | None:
    """Where the record's facts come from must be known: each hook installed in the process
    whose event it wraps and a running engine's KV cache seen sized, else a late error can
    look early or another process's hook vouch for a worker that had none."""
    outcomes = ("ran", "configured", "error")
    if not isinstance(expect, Runs | EarlyError | LateError) or rec.outcome not in outcomes:
        return None
    for hook in PROBE_HOOKS:
        if not any(h.endswith(hook) for h in rec.probe_hooks):
            bare = hook.lstrip(".")
            why = next(
                (m for h, m in rec.probe_missing.items() if h.split(".")[-1] == bare),
                None,
            )
            return f"probe not installed: {hook.lstrip('.')}" + (f" ({why})" if why else "")
    kernel = (rec.sources.get("kernel_block_sizes") or "").partition(":")[2] or None
    for pid, hook, what in (
        (rec.sizing_pid, PROBE_HOOKS[0], "chose the block size"),
        (rec.kv_sized_pid, PROBE_HOOKS[1], "sized the KV cache"),
        (kernel, PROBE_HOOKS[1], "chose the kernel block sizes"),
    ):
        if pid is None or not rec.probe_hooks_by_pid:
            continue
        own = rec.probe_hooks_by_pid.get(str(pid), [])
        if not any(h.endswith(hook) for h in own):
            return (
                f"probe not installed in the process that {what} (pid {pid}):"
                f" {hook.lstrip('.')} was reported only by other processes"
            )
    if isinstance(expect, EarlyError | LateError):
        untrusted = _error_source_problem(rec)
        if untrusted is not None:
            return untrusted
    if rec.outcome in ("ran", "configured") and not rec.kv_cache_sized_seen:
        return "the probe never saw the KV cache sized (prepare_kernel_block_sizes not called)"
    return None


def _hooked(hooks: list[str]) -> bool:
    return all(any(h.endswith(hook) for h in hooks) for hook in PROBE_HOOKS)


def _source_text(source: str | None) -> str:
    if source is None:
        return "a source the record does not name"
    kind, _, pid = source.partition(":")
    where = {
        "probe": "the probe",
        "log": "the log's text",
        "summary": "the front end's summary",
    }
    return where.get(kind, source) + (f" of pid {pid}" if pid else "")


def _error_source_problem(rec: Record) -> str | None:
    """An error passes on what it says of itself, so it must be the word of a process whose
    probe was installed: else the front end's hooks would vouch for a worker's printout.
    A record that keeps no hooks per process is not checked here."""
    err, by_pid = rec.error, rec.probe_hooks_by_pid
    if rec.outcome != "error" or err is None or not by_pid:
        return None
    front = None if rec.frontend_pid is None else str(rec.frontend_pid)
    pid = err.source_pid() or (front if err.process == "front end" else None)
    if pid is not None:
        candidates, lacking = [pid], f"pid {pid} did not report the probe's hooks"
    else:
        candidates = [p for p in by_pid if p != front]
        lacking = "no process besides the front end reported the probe's hooks"
    if any(_hooked(by_pid.get(p, [])) for p in candidates):
        return None
    hooked = [p for p in sorted(by_pid) if _hooked(by_pid[p])]
    reported = ", ".join(f"pid {p}{' (front end)' if p == front else ''}" for p in hooked)
    return (
        f"the {err.process}'s error was read from {_source_text(err.source)}, and {lacking}"
        f" ({f'only {reported} did' if reported else 'none did'}): where it was raised and"
        " whether the KV cache was sized before it are not that process's own word"
    )


def _emulation_problem(cell: Cell, rec: Record) -> str | None:
    """What the worker's vLLM saw of the CPU must be what its class gets on real hardware
    (vllm/platforms/cpu.py): the probes' answers and the kernel library loaded."""
    view = rec.isa_view
    if cell.platform != "cpu" or not view:
        return None
    cls = cpu_class(cell, rec)
    if cls is None or cls == "aarch64":
        return None
    facts = isa.facts(cls)
    wanted = {
        "avx512": facts.avx512,
        "avx512_bf16": facts.avx512_bf16,
        "amx": facts.amx,
    }
    seen = {k: view.get(k) for k in wanted}
    wrong = [f"{k} {seen[k]} (class {cls}: {v})" for k, v in wanted.items() if seen[k] != v]
    if wrong:
        return f"vLLM saw the CPU probes answer {', '.join(wrong)}"
    libraries = view.get("kernel_libraries") or []
    if facts.kernel_library not in libraries:
        return (
            f"vLLM loaded the kernel libraries {libraries or 'none'}, not"
            f" {facts.kernel_library}, which the {cls} class loads"
        )
    if cell.emulated and view.get("emulated_class") != cls:
        return f"the worker ran unemulated (it saw class {view.get('emulated_class')!r})"
    return None


EMULATED_PLATFORMS = {
    "cuda": "EmulatedCudaPlatform",
    "xpu": "EmulatedXpuPlatform",
    "rocm": "EmulatedRocmPlatform",
}


# What an emulated cell meets when vLLM's code reaches for the device the emulation does
# not have: torch initialising CUDA, a call into the stand-in driver or the XPU stubs.
DEVICE_GAPS = re.compile(
    r"Found no NVIDIA driver|CUDA driver version is insufficient|no CUDA device \(kvrig stub"
    r"|kvrig stub driver|an XPU kernel was called in an emulated XPU column|Torch not compiled"
    r" with (CUDA|XPU) enabled|No XPU devices are available|kvrig's inert stand-in"
    r"|an AITER kernel was called in an emulated ROCm column"
)


def undecided(cell: Cell, rec: Record) -> str | None:
    """Why an emulated cell's record cannot decide it, or None: kvrig reached for a vLLM
    name the release lacks, or vLLM's code reached for the device."""
    missing = missing_symbol(cell, rec)
    if missing is not None:
        return missing
    gap = device_gap(cell, rec)
    if gap is None:
        return None
    return (
        f"cannot be decided without a device: {gap} (an emulation limit, not vLLM's"
        " outcome; the record's emulation.fakes say what was faked)"
    )


def device_gap(cell: Cell, rec: Record) -> str | None:
    """The error of an emulated cell that reached for the device itself, or None."""
    if not cell.device_emulated or rec.outcome != "error" or rec.error is None:
        return None
    text = f"{rec.error.type}: {rec.error.message}"
    return rec.error.one_line() if DEVICE_GAPS.search(text) else None


def missing_symbol(cell: Cell, rec: Record) -> str | None:
    """Why an emulated cell cannot be judged, or None: kvrig's own code reached for a vLLM
    name the release lacks, so what vLLM would have done is unknown, neither fail nor pass."""
    if not cell.device_emulated:
        return None
    fits = "kvrig does not fit this vLLM release yet, not vLLM's outcome"
    for err in (rec.error, rec.frontend_error):
        if err is not None and err.missing_vllm_symbol:
            return f"{err.message.strip().splitlines()[0]} ({fits})"
    probe_missing = (rec.emulation or {}).get("probe_missing") or {}
    if probe_missing:
        hook, message = min(probe_missing.items())
        return f"{message}; probe not installed: {hook} ({fits})"
    return None


def _device_problem(cell: Cell, rec: Record) -> str | None:
    """An emulated record must show vLLM ran on the faked device the cell names, and a real
    cell's record must not be an emulated one."""
    emulation = rec.emulation
    if not cell.device_emulated:
        if emulation or rec.device_emulated:
            return "the record comes from an emulated device, and the cell is real hardware's"
        return _architecture_problem(cell.platform, cell.gpu_arch, rec)
    if rec.outcome == "skipped":
        return None
    if not emulation:
        return "the record says nothing of the emulated device (no emulation facts)"
    if emulation.get("arch") != cell.gpu_arch or emulation.get("platform") != cell.platform:
        return (
            f"vLLM emulated {emulation.get('platform')} {emulation.get('arch')}, the cell"
            f" is {cell.platform} {cell.gpu_arch}"
        )
    wanted = EMULATED_PLATFORMS[cell.platform]
    seen = emulation.get("platform_class")
    if seen is not None and seen != wanted:
        return f"vLLM's platform was {seen}, not kvrig's {wanted} (the platform plugin did not win)"
    if rec.outcome == "configured" and seen is None:
        return "vLLM's platform class was not recorded"
    if rec.outcome == "configured":
        return _ranks_problem(emulation.get("ranks") or [])
    return None


def _ranks_problem(ranks: list[dict[str, Any]]) -> str | None:
    """The workers of one pipeline stage share one block size (the executor starts them
    alike); stages may differ, each sizing from its own layers, which the verdict judges."""
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    if errors:
        return f"a rank failed where the engine configured ({'; '.join(errors)})"
    stages: dict[Any, set[Any]] = {}
    for r in ranks:
        stages.setdefault(r.get("stage", 0), set()).add(r.get("block_size"))
    split = [stage for stage, sizes in stages.items() if len(sizes) > 1]
    if split:
        shown = [
            f"rank {r['rank']} at {r.get('block_size')}"
            for r in ranks
            if r.get("stage", 0) in split
        ]
        return f"the tensor-parallel ranks of a stage disagree ({'; '.join(shown)})"
    return None


def _architecture_problem(platform: str, gpu_arch: str | None, rec: Record) -> str | None:
    """The device the cell's process saw must be its column's architecture: a runner
    labelled for one GPU that holds another would file results under the wrong column."""
    if gpu_arch is None or platform not in gpus.BY_ARCH or rec.outcome == "skipped":
        return None
    seen = (rec.host or {}).get(gpus.HOST_ARCH_KEY[platform])
    word = gpus.ARCH_WORD[platform]
    if not seen:
        tool = gpus.HOST_ARCH_TOOLS[platform]
        return (
            f"the record names no GPU {word} ({tool} in the cell's process answered none),"
            f" so the device cannot be shown to be the {gpu_arch} the cell's"
            " expectations are for"
        )
    if gpus.normalize(platform, str(seen)) != gpu_arch:
        return (
            f"the cell's process saw a {word} {seen} GPU, and the cell is for"
            f" {gpu_arch}: the runner's labels name another GPU than it holds"
        )
    return None
