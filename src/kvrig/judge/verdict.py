"""Judges a cell's record against its expectation (pure: a record in, a verdict out).

A failed verdict is one line saying what was expected and what happened, because that
line is what a maintainer reads first in a red CI job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from kvrig.define import patterns
from kvrig.define.case_spec import (
    EarlyError,
    Expectation,
    Invariants,
    LateError,
    Runs,
    Skip,
    Unsupported,
)
from kvrig.define.cells import Cell
from kvrig.define.vllm_models import HYBRID_FAMILIES, Family
from kvrig.judge.computed import (
    Computed,
    alignment_problem,
    computed,
    rules_must_agree,
    rules_problem,
    size_problem,
    unread,
)
from kvrig.judge.messages import EARLY_FUNCTION, early_error_backends
from kvrig.judge.trust import trust_problem, undecided
from kvrig.rules import backend_facts
from kvrig.run.record import ErrorInfo, Record


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


def judge(cell: Cell, rec: Record) -> Verdict:
    """Whether the record meets the cell's expectation. The trust checks come first for
    every cell, a known-defect one too: an untrusted record proves nothing either way."""
    expect = cell.expect
    if isinstance(expect, Skip):
        return Verdict(cell.id, Status.SKIP, expect.reason)
    calc = computed(cell, rec)
    size = calc.expected.block_size if calc.expected else None
    why = undecided(cell, rec)
    if why is not None:
        return Verdict(cell.id, Status.UNDECIDED, why)
    untrusted = trust_problem(cell, expect, rec)
    if untrusted is not None:
        return Verdict(
            cell.id,
            Status.FAIL,
            f"expected {_describe(expect)}; got {happened(rec)} [{untrusted}]",
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


def _against(
    cell: Cell, expect: Expectation, rec: Record, calc: Computed
) -> tuple[str | None, str]:
    """(problem or None, note) of the record against one expectation: one function, so a
    defect cell is held to its defect by the same checks as to its expectation."""
    problem = _problem(expect, rec, cell.model.family, cell.device_emulated, cell.pinned_instead)
    if problem is not None:
        return problem, ""
    problem, note = size_problem(cell, expect, rec, calc)
    if problem is not None:
        return problem, note
    disagree = rules_problem(expect, calc.expected)
    if disagree is not None:
        if rules_must_agree(cell):
            return disagree, note
        note += f" (note: {disagree})"
    differ = backend_facts.disagreements(cell.platform, rec.backend_kernel_sizes)
    if differ:
        problem = f"kvrig's backend table disagrees with vLLM here: {'; '.join(differ)}"
        if rules_must_agree(cell):
            return problem, note
        note += f" (note: {problem})"
    exp = calc.expected
    if isinstance(expect, Runs) and exp is not None and cell.model.family in HYBRID_FAMILIES:
        problem = alignment_problem(exp, rec)
        if problem is not None:
            if rules_must_agree(cell):
                return problem, note
            note += f" (note: {problem})"
    return None, note


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
    family: Family,
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
    family: Family,
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
    """The invariants the matrix states for a run: the sizes, the kernel block sizes it
    must include, the backends some layer must use."""
    inv = expect.invariants
    problem = _sizes_problem(inv, rec, sizes)
    if problem is not None:
        return problem
    for size in inv.kernel_block_sizes_include or []:
        if size not in rec.kernel_block_sizes:
            return f"kernel block sizes {rec.kernel_block_sizes} lack {size}"
    exact = inv.kernel_block_sizes
    if exact is not None and list(rec.kernel_block_sizes) != exact:
        return f"kernel block sizes {rec.kernel_block_sizes}, expected exactly {exact}"
    for name in inv.backends_include or []:
        if name not in rec.layer_backends.values():
            return f"no layer uses backend {name}"
    return None


def _sizes_problem(inv: Invariants, rec: Record, sizes: bool) -> str | None:
    """The sizes the matrix states; `sizes` is False for a release other than the pinned
    one, whose numbers are checked against its computed sizes instead."""
    if inv.engine_block_size == "worker" and rec.engine_block_size != rec.worker_block_size:
        return (
            f"engine core block {rec.engine_block_size}, expected the worker's"
            f" {rec.worker_block_size}"
        )
    if not sizes:
        return None
    if inv.block_size is not None and rec.worker_block_size != inv.block_size:
        return f"block size {rec.worker_block_size}, expected {inv.block_size}"
    if inv.block_size_in is not None and rec.worker_block_size not in inv.block_size_in:
        return f"block size {rec.worker_block_size} not in {inv.block_size_in}"
    if inv.engine_block_size not in (None, "worker", rec.engine_block_size):
        return f"engine core block {rec.engine_block_size}, expected {inv.engine_block_size}"
    if inv.stage_block_sizes is not None and rec.stage_block_sizes != inv.stage_block_sizes:
        return f"pipeline stages at {rec.stage_block_sizes}, expected {inv.stage_block_sizes}"
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
