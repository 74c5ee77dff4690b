"""What vLLM did against what kvrig.rules computes for the cell: size, outcome, pages, alignment.

Apart from the verdict because it rests on kvrig's own rules, not on vLLM's outcome: it
changes when the rules change, the verdict when the expectations do.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrig.define import gpus
from kvrig.define.case_spec import EarlyError, Expectation, LateError, Runs
from kvrig.define.cells import Cell
from kvrig.host import isa
from kvrig.judge.messages import early_error_backends, late_error_size
from kvrig.rules import blocksize as expected_mod
from kvrig.rules import shapes, versions
from kvrig.run.record import Record


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
    # The GPU decides CUDA's and ROCm's backends (and CUDA's GDN prefill kernel): the
    # cell's architecture (an emulated one, or the runner's read at the column's start),
    # else the record's host.
    gpu_arch = cell.gpu_arch
    if gpu_arch is None and cell.platform in gpus.HOST_ARCH_KEY:
        gpu_arch = (rec.host or {}).get(gpus.HOST_ARCH_KEY[cell.platform])
    try:
        return Computed(expected_mod.expected(cell, cell.config, cpu=cpu, gpu_arch=gpu_arch))
    except KeyError as exc:
        return Computed(None, f"the model config lacks {exc}")
    except (ValueError, FileNotFoundError) as exc:
        return Computed(None, str(exc))


def unread(cell: Cell, rec: Record, calc: Computed) -> str | None:
    """Why the size this cell is judged by may not be its vLLM's, or None: a pass that rests
    on rules not read for the release that ran (newer, or patched) is only UNREAD."""
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


def rules_must_agree(cell: Cell) -> bool:
    """Whether kvrig.rules must agree with vLLM here: on a platform whose rules real
    engines confirmed, and on every emulated device (vLLM's own code decided)."""
    if cell.device_emulated:
        return True
    try:
        return expected_mod.platform_rules(cell).measured
    except (shapes.ConfigError, versions.VersionError):
        return False  # rules that cannot be had for the cell confirm nothing


def size_problem(
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
        problem = (
            _pages_problem(exp, rec) or _core_problem(exp, rec)
            if isinstance(expect, Runs)
            else None
        )
        if problem is None:
            return None, ""
    else:
        verb = "chose" if isinstance(expect, Runs) else "raised at"
        problem = f"vLLM {verb} {chose}, expected {exp.block_size} ({exp.explain()})"
    if rules_must_agree(cell):
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


def rules_problem(expect: Expectation, exp: expected_mod.Expected | None) -> str | None:
    """The outcome kvrig.rules computes must be the one the expectation states. The rules
    have no say on `unsupported`: that refusal comes before any size."""
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


def alignment_problem(exp: expected_mod.Expected, rec: Record) -> str | None:
    """What the hybrid alignment sets besides the size must be what it computes, log lines
    included: a later step can mask one that went missing."""
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
    """The pages the engine laid out must be the computed ones, not only the size: a right
    size with a wrongly padded mamba page still breaks the hybrid layout."""
    if exp.page is None or not exp.page.mamba or exp.padded is None:
        return None
    per_token, size = exp.page.attention_per_token, exp.block_size
    page = exp.unified or exp.padded
    for g in rec.kv_cache_groups:
        if "Attention" in g.kind and g.page_size_bytes != page:
            return (
                f"attention page {g.page_size_bytes} B, computed {page} B"
                f" ({per_token} B/token x {size})"
            )
        if not g.kind.startswith("Mamba"):
            continue
        real = g.real_page_size_bytes
        if real is not None and real != exp.page.mamba:
            return f"mamba state page {real} B, computed {exp.page.mamba} B ({exp.explain()})"
        if g.page_size_bytes != page:
            return (
                f"mamba page padded to {g.page_size_bytes} B, computed {page} B (exactly"
                f" the attention page, {per_token} B/token x {size})"
            )
    return None


def _core_problem(exp: expected_mod.Expected, rec: Record) -> str | None:
    """Each stage's, the state group's and the engine core's block must be the computed
    ones too, where the record has them: max_model_len and the stages enter there."""
    if rec.outcome not in ("ran", "configured"):
        return None
    if exp.stage_block_sizes and rec.stage_block_sizes != list(exp.stage_block_sizes):
        return (
            f"the pipeline stages chose {rec.stage_block_sizes}, computed"
            f" {list(exp.stage_block_sizes)} ({exp.explain()})"
        )
    for name, computed_size, seen in (
        ("mamba_block_size", exp.mamba_block_size, rec.mamba_block_size),
        ("the engine core's block", exp.engine_block_size, rec.engine_block_size),
    ):
        if computed_size is not None and seen is not None and seen != computed_size:
            return f"{name} {seen}, computed {computed_size} ({exp.explain()})"
    return None
