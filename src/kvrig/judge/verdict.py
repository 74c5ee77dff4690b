"""Judges a cell's record against its expectation (pure: a record in, a verdict out).

A failed verdict is one line saying what was expected and what happened, because that
line is what a maintainer reads first in a red CI job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from kvrig.define import gpus, patterns
from kvrig.define.cells import Cell
from kvrig.define.matrix import EarlyError, Expectation, LateError, Runs, Skip, Unsupported
from kvrig.host import isa
from kvrig.rules import backend_facts, versions
from kvrig.rules import blocksize as expected_mod
from kvrig.run.record import ErrorInfo, Record

EARLY_FUNCTION = "_check_aligned_block_size"
_EARLY_MESSAGE = re.compile(
    r"Aligned KV cache block size (\d+) is not supported by attention backend\(s\): (.+?)\.?$"
)
HYBRID_FAMILIES = ("hybrid_mamba", "gdn")


class Status(str, Enum):
    """A verdict's status; results rows carry its value."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    XFAIL = "xfail"  # a known vLLM defect, showing exactly as recorded
    # An emulated device's cell that vLLM's code could not decide without a device (it
    # reached for the device itself): never a pass, and not vLLM's failure either.
    UNDECIDED = "undecided"
    # vLLM did what the cell expects, as far as its own outcome shows, but the size it was
    # checked against comes from kvrig's rules for another vLLM (a release newer than any
    # read, or an overlay's Python): not a pass for the gate until the rules are read.
    UNREAD = "unread"

    @property
    def passed(self) -> bool:
        """A known vLLM defect showing as recorded passes, as a pass does."""
        return self in PASSING

    @property
    def word(self) -> str:
        return self.value.upper()


PASSING = (Status.PASS, Status.XFAIL)


@dataclass(frozen=True)
class Verdict:
    cell_id: str
    status: Status
    reason: str
    expected_block_size: int | None = None

    @property
    def passed(self) -> bool:
        return self.status.passed


def happened(rec: Record) -> str:
    """What the record shows, in a phrase."""
    if rec.outcome == "skipped":
        return f"skipped ({rec.skip_reason})"
    if rec.outcome in ("timeout", "memory", "crashed"):
        return f"{rec.outcome}: {rec.note or rec.signal or rec.exit_code}"
    if rec.outcome == "error" and rec.error is not None:
        when = (
            "after KV-cache sizing" if rec.kv_cache_sized_before_error else "before KV-cache sizing"
        )
        return f"{rec.error.one_line()} ({when}, in the {rec.error.process})"
    if rec.outcome == "configured":
        return (
            f"configuration completed at block size {rec.worker_block_size} (engine core"
            f" {rec.engine_block_size}; emulated device, nothing generated)"
        )
    return (
        f"engine ran, generated {rec.tokens_generated} token(s) at block size "
        f"{rec.worker_block_size} (engine core {rec.engine_block_size})"
    )


def matches(pattern: str, message: str) -> bool:
    """The pattern found in the message, every number written in it matched whole: "No
    common block size for 128" must not match a message about 1280, nor "for 28" one
    about 128 (kvrig.define.patterns)."""
    return re.search(patterns.whole_numbers(pattern), message) is not None


_LATE_MESSAGE = re.compile(r"No common block size for (\d+)")


def late_error_size(message: str) -> int | None:
    """The size the worker's late check names ("No common block size for 128"): the one
    that passed the early check, which the computed size must be, whatever the cell's
    pattern says (a pattern without it would pass a failure at any size)."""
    m = _LATE_MESSAGE.search(message)
    return int(m.group(1)) if m else None


def early_error_backends(message: str) -> tuple[int, list[str]] | None:
    m = _EARLY_MESSAGE.search(message.strip().splitlines()[0] if message.strip() else "")
    if not m:
        return None
    return int(m.group(1)), [n.strip() for n in m.group(2).split(",") if n.strip()]


@dataclass(frozen=True)
class Computed:
    """The independently computed outcome, or why it could not be computed."""

    expected: expected_mod.Expected | None
    why_not: str = ""


def cpu_class(cell: Cell, rec: Record) -> str | None:
    """The class whose rules the cell follows: the one it was run under, else the class
    of the host that ran it."""
    return cell.isa or (rec.host or {}).get("isa_class")


def computed(cell: Cell, rec: Record) -> Computed:
    """The independently computed size for this cell, on its CPU class when on CPU."""
    cpu = None
    if cell.platform == "cpu":
        cls = cpu_class(cell, rec)
        if cls is None:
            return Computed(None, "the CPU class is unknown (no ISA facts in the record)")
        cpu = isa.facts(cls)
    if not cell.config:
        return Computed(None, "the cell carries no model config")
    # The GPU decides CUDA's backends and GDN prefill kernel: the cell's architecture (an
    # emulated one, or the runner's read at the column's start), else the record's host.
    gpu_arch = cell.gpu_arch
    if gpu_arch is None and cell.platform == "cuda":
        gpu_arch = (rec.host or {}).get("gpu_compute_capability")
    try:
        return Computed(expected_mod.expected(cell, cell.config, cpu=cpu, gpu_arch=gpu_arch))
    except KeyError as exc:
        return Computed(None, f"the model config lacks {exc}")
    except (ValueError, FileNotFoundError) as exc:
        return Computed(None, str(exc))


def judge(cell: Cell, rec: Record) -> Verdict:
    """Whether the record meets the cell's expectation. Every cell, a known-defect one too,
    first gets the checks that make its record trustworthy (the probe in the process that
    decided, the CPU class or emulated device vLLM saw); then the expectation's own checks
    and kvrig.rules' computed outcome; a defect cell that misses its expectation is held
    to the defect by the same checks."""
    expect = cell.expect
    if isinstance(expect, Skip):
        return Verdict(cell.id, Status.SKIP, expect.reason)
    calc = computed(cell, rec)
    size = calc.expected.block_size if calc.expected else None
    why = undecided(cell, rec)
    if why is not None:
        return Verdict(cell.id, Status.UNDECIDED, why)
    untrusted = _trust_problem(cell, expect, rec)
    if untrusted is not None:
        return Verdict(
            cell.id, Status.FAIL, f"expected {_describe(expect)}; got {happened(rec)} [{untrusted}]"
        )
    problem, note = _against(cell, expect, rec, calc)
    stale = unread(cell, rec, calc)
    if problem is None:
        if stale is not None and cell.defect is None:
            return Verdict(
                cell.id,
                Status.UNREAD,
                f"as vLLM's outcome shows: {happened(rec)}{note}; not a pass: {stale}",
                size,
            )
        if cell.defect is not None:
            return Verdict(
                cell.id,
                Status.FAIL,
                f"known vLLM defect no longer shows ({cell.case.known_defect.reason});"  # type: ignore[union-attr]
                f" the cell now does what it should: {happened(rec)}. Remove known_defect.",
                size,
            )
        return Verdict(cell.id, Status.PASS, f"as expected: {happened(rec)}{note}", size)
    failure = f"expected {_describe(expect)}; got {happened(rec)}" + (
        f" [{problem}]" if problem else ""
    )
    if stale is not None:
        failure += f" [judged by rules that may not be this vLLM's: {stale}]"
    if cell.defect is not None:
        shown, _ = _against(cell, cell.defect, rec, calc)
        if shown is None:
            reason = cell.case.known_defect.reason  # type: ignore[union-attr]
            return Verdict(cell.id, Status.XFAIL, f"known vLLM defect: {reason}; {failure}", size)
        detail = f": {shown}" if shown else ""
        failure += f"; nor does it show the known defect ({_describe(cell.defect)}{detail})"
    return Verdict(cell.id, Status.FAIL, failure, size)


def unread(cell: Cell, rec: Record, calc: Computed) -> str | None:
    """Why the size this cell is judged by may not be its vLLM's, or None: the rules were
    not read for the release that ran (a newer one, or a checkout or patch over a release),
    and the verdict rests on them (a size was computed and the cell's outcome is checked
    against it). An overlay that changes no file is its base release."""
    if calc.expected is None or not isinstance(cell.expect, Runs | EarlyError | LateError):
        return None
    try:
        rules = expected_mod.cell_rules(cell)
    except ValueError:
        return None
    if rules.unread is not None:
        return rules.unread
    ran = _parsed_version(rec.vllm_version)
    if ran is not None and versions.unread_note(cell.platform, ran):
        return versions.unread_note(cell.platform, ran)
    overlay = rec.vllm_overlay or {}
    if overlay.get("files"):
        what = overlay.get("patch") or overlay.get("source")
        return (
            f"vLLM ran with the Python of {what} over {overlay.get('base')}, and kvrig's"
            f" rules were read for {versions.shown(rules.version)}'s code, not for this"
            " change (kvrig release diff shows what it moved)"
        )
    return None


def _parsed_version(text: str | None) -> versions.Version | None:
    try:
        return versions.parse(text) if text else None
    except versions.VersionError:
        return None


def _trust_problem(cell: Cell, expect: Expectation, rec: Record) -> str | None:
    """What makes the record's facts not the ones the cell is about, whatever it expects."""
    return (
        _probe_problem(expect, rec) or _emulation_problem(cell, rec) or _device_problem(cell, rec)
    )


def _against(
    cell: Cell, expect: Expectation, rec: Record, calc: Computed
) -> tuple[str | None, str]:
    """(problem or None, note) of the record against one expectation: what it asks, the
    size and pages vLLM chose against the computed ones, the computed outcome against
    what it asks, and what the alignment set."""
    problem = _problem(expect, rec, cell.model.family, cell.device_emulated, cell.pinned_instead)
    if problem is not None:
        return problem, ""
    problem, note = _size_problem(cell, expect, rec, calc)
    if problem is not None:
        return problem, note
    disagree = _rules_problem(expect, calc.expected)
    if disagree is not None:
        if _strict(cell):
            return disagree, note
        note += f" (note: {disagree})"
    differ = backend_facts.disagreements(cell.platform, rec.backend_kernel_sizes)
    if differ:
        problem = f"kvrig's backend table disagrees with vLLM here: {'; '.join(differ)}"
        if _strict(cell):
            return problem, note
        note += f" (note: {problem})"
    exp = calc.expected
    if isinstance(expect, Runs) and exp is not None and cell.model.family in HYBRID_FAMILIES:
        problem = _alignment_problem(exp, rec)
        if problem is not None:
            if _strict(cell):
                return problem, note
            note += f" (note: {problem})"
    return None, note


def _strict(cell: Cell) -> bool:
    """Whether kvrig.rules must agree with vLLM here: on a platform whose rules real
    engines confirmed, and on every emulated device (vLLM's own code decided)."""
    return expected_mod.RULES[cell.platform].measured or cell.device_emulated


PROBE_HOOKS = (".update_block_size_for_backend", ".prepare_kernel_block_sizes")


def _probe_problem(expect: Expectation, rec: Record) -> str | None:
    """Where the record's facts come from must be known: each hook of the probe reported
    installed in the process whose event it wraps (else an error that came late looks
    early, or another process's hook vouches for a worker that had none), an early or late
    error the word of a process whose probe was installed (`_error_source_problem`), and a
    running engine's KV cache seen sized (else vLLM sizes it somewhere the probe no longer
    wraps)."""
    outcomes = ("ran", "configured", "error")
    if not isinstance(expect, Runs | EarlyError | LateError) or rec.outcome not in outcomes:
        return None
    for hook in PROBE_HOOKS:
        if not any(h.endswith(hook) for h in rec.probe_hooks):
            bare = hook.lstrip(".")
            why = next((m for h, m in rec.probe_missing.items() if h.split(".")[-1] == bare), None)
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
    where = {"probe": "the probe", "log": "the log's text", "summary": "the front end's summary"}
    return where.get(kind, source) + (f" of pid {pid}" if pid else "")


def _error_source_problem(rec: Record) -> str | None:
    """An early or late error passes on what it says of itself (who raised it, whether
    the KV cache was sized before it), so it must be the word of a process whose probe
    was installed: the process its source names, or for a worker's error read from the
    log without a pid, some process besides the front end. Otherwise a front end that
    alone reported the probe's hooks would vouch for an error the worker only printed.
    A record without hooks per process (written before they were kept) is let be."""
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
    wanted = {"avx512": facts.avx512, "avx512_bf16": facts.avx512_bf16, "amx": facts.amx}
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


EMULATED_PLATFORMS = {"cuda": "EmulatedCudaPlatform", "xpu": "EmulatedXpuPlatform"}
# What an emulated cell meets when vLLM's code reaches for the device the emulation does
# not have: torch initialising CUDA, a call into the stand-in driver or the XPU stubs.
DEVICE_GAPS = re.compile(
    r"Found no NVIDIA driver|CUDA driver version is insufficient|no CUDA device \(kvrig stub"
    r"|kvrig stub driver|an XPU kernel was called in an emulated XPU column|Torch not compiled"
    r" with CUDA enabled|No XPU devices are available|kvrig's inert stand-in"
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
    """Why an emulated cell cannot be judged when kvrig's own code reached for a vLLM name
    the release lacks (kvrig.run.vllm_plugin.symbols), or None: raised by its emulation,
    plugin or platform, or a probe hook left uninstalled. kvrig does not fit that release
    yet; what vLLM would have done is unknown, neither its failure nor a pass."""
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
    """An emulated device's record must show vLLM ran on the faked device the cell names
    (the plugin's platform class, the architecture), every tensor-parallel rank at one
    size; a real cell's record must not be an emulated one."""
    emulation = rec.emulation
    if not cell.device_emulated:
        if emulation or rec.device_emulated:
            return "the record comes from an emulated device, and the cell is real hardware's"
        return _architecture_problem(cell, rec)
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
    ranks = emulation.get("ranks") or []
    sizes = {r.get("block_size") for r in ranks}
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    if rec.outcome == "configured" and (errors or len(sizes) > 1):
        shown = errors or [f"rank {r['rank']} at {r.get('block_size')}" for r in ranks]
        return f"the tensor-parallel ranks disagree ({'; '.join(shown)})"
    return None


def _architecture_problem(cell: Cell, rec: Record) -> str | None:
    """A real GPU cell follows its architecture's expectations (its column is cuda-sm90),
    so the device the cell's process saw must be that architecture: a runner labelled for
    one GPU that holds another would otherwise file its results under the wrong column."""
    if cell.gpu_arch is None or cell.platform not in gpus.BY_ARCH or rec.outcome == "skipped":
        return None
    seen = (rec.host or {}).get("gpu_compute_capability")
    if not seen:
        return (
            f"the record names no GPU compute capability (nvidia-smi in the cell's process"
            f" answered none), so the device cannot be shown to be the {cell.gpu_arch} the"
            " cell's expectations are for"
        )
    if gpus.normalize(cell.platform, str(seen)) != cell.gpu_arch:
        return (
            f"the cell's process saw a compute capability {seen} GPU, and the cell is for"
            f" {cell.gpu_arch}: the runner's labels name another GPU than it holds"
        )
    return None


def _size_problem(
    cell: Cell, expect: Expectation, rec: Record, calc: Computed
) -> tuple[str | None, str]:
    """Compares vLLM's size with the computed one: (problem, note for a passing verdict).

    On a platform whose rules were not confirmed by real engines a mismatch is a note. A
    size that cannot be computed is said so; for a cell that gates a release it fails.
    """
    checked = isinstance(expect, Runs | EarlyError)
    if calc.expected is None:
        if not checked:
            return None, ""
        why = f"size not checked: {calc.why_not}"
        return (why, "") if cell.case.gate else (None, f" ({why})")
    exp = calc.expected
    if exp.block_size is None or exp.phase1_error:
        return None, ""
    chose = _chosen_size(expect, rec, exp)
    if chose is None:
        return None, ""
    if chose == exp.block_size:
        problem = _pages_problem(exp, rec) if isinstance(expect, Runs) else None
        if problem is None:
            return None, ""
    else:
        verb = "chose" if isinstance(expect, Runs) else "raised at"
        problem = f"vLLM {verb} {chose}, expected {exp.block_size} ({exp.explain()})"
    if _strict(cell):
        return problem, ""
    return None, (
        f" (note: {problem}; no published log or run confirms the {cell.platform} rules yet,"
        " so a mismatch is noted, not failed)"
    )


def _chosen_size(expect: Expectation, rec: Record, exp: expected_mod.Expected) -> int | None:
    """The size vLLM chose, as the record shows it for what the cell expects: a running
    engine's, the one an early error rejects, the one a late error fails at; None where
    the computed outcome is no size to compare it with."""
    if isinstance(expect, Runs) and not exp.rejecting:
        return rec.worker_block_size
    if rec.error is None:
        return None
    if isinstance(expect, EarlyError):
        parsed = early_error_backends(rec.error.message)
        return parsed[0] if parsed else None
    if isinstance(expect, LateError) and not exp.rejecting:
        return late_error_size(rec.error.message)
    return None


def computed_kind(exp: expected_mod.Expected) -> str:
    """What kvrig.rules says vLLM does: runs, early_error, phase1_error or unsupported."""
    if exp.unsupported:
        return "unsupported"
    if exp.phase1_error:
        return "phase1_error"
    return "early_error" if exp.rejecting else "runs"


def _computed_text(exp: expected_mod.Expected) -> str:
    kind = computed_kind(exp)
    if kind == "early_error":
        return f"an early error at {exp.block_size} naming {', '.join(exp.rejecting)}"
    if kind == "phase1_error":
        return "phase 1 finding no size every backend accepts"
    if kind == "unsupported":
        return f"a refusal ({exp.unsupported})"
    return f"a run at {exp.block_size}"


def _rules_problem(expect: Expectation, exp: expected_mod.Expected | None) -> str | None:
    """The outcome kvrig.rules computes must be the one the expectation states: a `runs`
    (or `late_error`, whose size passes the early check) cell must compute no rejection,
    an `early_error` cell a rejection by exactly the backends it names. An `unsupported`
    refusal comes before any size, so the rules have no say there."""
    if exp is None:
        return None
    kind = computed_kind(exp)
    where = f"kvrig.rules computes {_computed_text(exp)} ({exp.explain()})"
    if isinstance(expect, Runs | LateError) and kind != "runs":
        return f"{where}, and the cell expects {expect.outcome}"
    if isinstance(expect, EarlyError):
        if kind != "early_error":
            return f"{where}, and the cell expects an early error"
        if sorted(exp.rejecting) != sorted(expect.backends):
            return f"{where}, and the cell expects it to name {', '.join(expect.backends)}"
    return None


def _alignment_problem(exp: expected_mod.Expected, rec: Record) -> str | None:
    """What the hybrid alignment sets besides the size must be what it computes: the
    padded mamba page (None when the pages already match), the mamba block in align mode,
    and the lines vLLM logs about both; a later step can mask one that went missing."""
    if rec.outcome not in ("ran", "configured") or exp.page is None or not exp.page.mamba:
        return None
    padded = exp.padded if exp.padded != exp.page.mamba else None
    if rec.mamba_page_size_padded != padded:
        return (
            f"mamba_page_size_padded {rec.mamba_page_size_padded}, computed {padded}"
            f" ({exp.explain()})"
        )
    if rec.mamba_cache_mode == "align" and rec.mamba_block_size != rec.worker_block_size:
        return (
            f"mamba_block_size {rec.mamba_block_size} in align mode, not the block size"
            f" {rec.worker_block_size}"
        )
    logged, wanted = set(rec.alignment_log), set(exp.log)
    if logged != wanted:
        missing = sorted(wanted - logged)
        extra = sorted(logged - wanted)
        parts = [f"missing {m!r}" for m in missing] + [f"unexpected {e!r}" for e in extra]
        return f"vLLM's alignment log differs from the computed one: {'; '.join(parts)}"
    return None


def _pages_problem(exp: expected_mod.Expected, rec: Record) -> str | None:
    """The pages the engine laid out must be the computed ones, not only the size: each
    attention group's page (the chosen size's), the mamba state page, and the mamba page
    padded to exactly the attention page (what vLLM logs as "Padding mamba page size")."""
    if exp.page is None or not exp.page.mamba or exp.padded is None:
        return None
    per_token, size = exp.page.attention_per_token, exp.block_size
    for g in rec.kv_cache_groups:
        if "Attention" in g.kind and g.page_size_bytes != exp.padded:
            return (
                f"attention page {g.page_size_bytes} B, computed {exp.padded} B"
                f" ({per_token} B/token x {size})"
            )
        if not g.kind.startswith("Mamba"):
            continue
        real = g.real_page_size_bytes
        if real is not None and real != exp.page.mamba:
            return f"mamba state page {real} B, computed {exp.page.mamba} B ({exp.explain()})"
        if g.page_size_bytes != exp.padded:
            return (
                f"mamba page padded to {g.page_size_bytes} B, computed {exp.padded} B (exactly"
                f" the attention page, {per_token} B/token x {size})"
            )
    return None


def _describe(expect: Expectation) -> str:
    if isinstance(expect, Runs):
        return "the engine to run and generate"
    if isinstance(expect, EarlyError):
        return f"an early ValueError from {EARLY_FUNCTION} naming {', '.join(expect.backends)}"
    if isinstance(expect, LateError):
        return (
            f"a late {expect.error} from {expect.function} after KV-cache sizing matching"
            f" /{expect.match}/"
        )
    if isinstance(expect, Unsupported):
        return f"{expect.error} matching /{expect.match}/"
    return expect.outcome


def _problem(
    expect: Expectation,
    rec: Record,
    family: str,
    emulated: bool = False,
    pinned_instead: str | None = None,
) -> str | None:
    """None when the record meets the expectation, else the specific shortfall ("" if the
    headline already says it all)."""
    if isinstance(expect, Runs):
        return _runs_problem(expect, rec, family, emulated, pinned_instead)
    if rec.outcome != "error" or rec.error is None:
        return ""
    err, sized = rec.error, rec.kv_cache_sized_before_error
    if isinstance(expect, EarlyError):
        return _early_problem(expect, err, sized)
    if isinstance(expect, LateError):
        return _late_problem(expect, err, sized)
    if isinstance(expect, Unsupported):
        return _raised_as(err, expect.error, expect.function, expect.match)
    return "unknown expectation"


def _early_problem(expect: EarlyError, err: ErrorInfo, sized: bool | None) -> str | None:
    """An early error is the alignment check's own ValueError, raised before the KV cache
    was sized, naming exactly the backends the cell expects to reject the size."""
    if err.type != "ValueError" or err.function != EARLY_FUNCTION:
        return "" if sized else f"raised by {err.function}"
    if sized:
        return "it came after the KV cache was sized"
    parsed = early_error_backends(err.message)
    if parsed is None:
        return "the message does not name backends the way the check does"
    _, names = parsed
    if sorted(names) != sorted(expect.backends):
        return f"named {', '.join(names)} instead of {', '.join(expect.backends)}"
    return None


def _late_problem(expect: LateError, err: ErrorInfo, sized: bool | None) -> str | None:
    """A late error is one the size passed the early check for: raised after the KV cache
    was sized, and by what the cell names."""
    if err.function == EARLY_FUNCTION:
        return "the early check fired where it must not"
    if not sized:
        return "it came before the KV cache was sized"
    return _raised_as(err, expect.error, expect.function, expect.match)


def _raised_as(err: ErrorInfo, error: str, function: str, match: str) -> str | None:
    """The error must be the expected type, raised by the expected function, with a
    message the pattern matches: a different error that happens to match is not it."""
    if err.type != error:
        return f"error type {err.type}, not {error}"
    if err.function != function:
        return f"raised by {err.function}, not {function}"
    if not matches(match, err.message):
        return "message does not match"
    return None


def _runs_problem(
    expect: Runs,
    rec: Record,
    family: str,
    emulated: bool = False,
    pinned_instead: str | None = None,
) -> str | None:
    """A real engine must have generated; an emulated device's must have come through the
    whole configuration phase (nothing generates there)."""
    if rec.outcome != ("configured" if emulated else "ran"):
        return ""
    if not emulated and rec.tokens_generated < 1:
        return "no token generated"
    if rec.worker_block_size is None:
        return "the probe saw no block-size decision (is the kvrig plugin loaded?)"
    return (
        _acceptance_problem(expect, rec)
        or (_page_problem(rec) if family in HYBRID_FAMILIES else None)
        or _invariants_problem(expect, rec, sizes=pinned_instead is None)
    )


def _acceptance_problem(expect: Runs, rec: Record) -> str | None:
    """Each backend of the model must accept the chosen size, except the ones the cell
    names as rejecting it, which must be in the model and reject it."""
    must_reject = set(expect.invariants.rejected_by or [])
    for name, ok in rec.backends_accept.items():
        if name in must_reject and ok:
            return f"{name} accepts block size {rec.worker_block_size}, expected it to reject"
        if name not in must_reject and not ok:
            return f"{name} rejects the chosen block size {rec.worker_block_size}"
    missing = must_reject - set(rec.backends_accept)
    if missing:
        return f"backend(s) {', '.join(sorted(missing))} not in the model"
    return None


def _invariants_problem(expect: Runs, rec: Record, sizes: bool = True) -> str | None:
    """The invariants the matrix states for a run: the size (or sizes it may be), the
    kernel block sizes it must include, the backends some layer must use. The sizes are
    the pinned release's (`sizes` False for another release: its computed size is checked
    exactly instead)."""
    inv = expect.invariants
    if sizes and inv.block_size is not None and rec.worker_block_size != inv.block_size:
        return f"block size {rec.worker_block_size}, expected {inv.block_size}"
    if sizes and inv.block_size_in is not None and rec.worker_block_size not in inv.block_size_in:
        return f"block size {rec.worker_block_size} not in {inv.block_size_in}"
    for size in inv.kernel_block_sizes_include or []:
        if size not in rec.kernel_block_sizes:
            return f"kernel block sizes {rec.kernel_block_sizes} lack {size}"
    for name in inv.backends_include or []:
        if name not in rec.layer_backends.values():
            return f"no layer uses backend {name}"
    return None


def _page_problem(rec: Record) -> str | None:
    """Hybrid invariant: an attention page holds at least a whole (unpadded) mamba state."""
    attn = [g for g in rec.kv_cache_groups if "Attention" in g.kind]
    mamba = [g for g in rec.kv_cache_groups if g.kind.startswith("Mamba")]
    if not attn or not mamba:
        kinds = [g.kind for g in rec.kv_cache_groups]
        return f"expected attention and mamba KV-cache groups, got {kinds}"
    mamba_page = max(g.real_page_size_bytes or g.page_size_bytes for g in mamba)
    for g in attn:
        page = g.real_page_size_bytes or g.page_size_bytes
        if page < mamba_page:
            return f"attention page {page} B < mamba page {mamba_page} B"
    return None
