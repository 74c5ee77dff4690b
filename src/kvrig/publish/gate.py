"""The release gate: every required cell of the gated platforms ran and passed.

A required cell (`gate: true`) that is missing, failed or skipped fails the gate, so a
column that crashed halfway cannot pass by omission; so does a row that does not stand
for this matrix, this kvrig or the release's own vLLM. Side runs share cell ids, so only
release columns are read. An expired allowance fails the gate by itself, so excuses
cannot quietly become permanent, and a moved block size fails it unless accepted: a size
that changes silently is what this rig exists to catch.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvrig.define import column_names, gpus
from kvrig.define.cells import Cell, expand, judged_under
from kvrig.define.matrix import Matrix
from kvrig.define.paths import column_of_folder, column_of_side_folder
from kvrig.define.platform_spec import VllmSource
from kvrig.define.schema import ALLOWANCE_DAYS, Allowance, allowance_too_long
from kvrig.judge.verdict import PASSING, Status
from kvrig.provision import overlay_inputs
from kvrig.provision.overlay import Manifest
from kvrig.publish import results as results_mod
from kvrig.publish.results import block_text, overlays_of, overrides_of
from kvrig.rules import versions
from kvrig.run import holds as holds_mod

Row = dict[str, Any]
# (cell id, column, image, overlay) -> the commands that rerun it (kvrig.publish.repro.lines)
Repro = Callable[[str, str, str | None, dict[str, Any] | None], list[str]]


def column_cells(matrix: Matrix, column: str, rows: list[Row]) -> list[Cell]:
    """The cells of a column (`cpu`, `cpu-avx2`, `cuda-sm90`); a host's own CPU column
    follows the class its rows ran under."""
    named = column_names.parse(column)
    if named is None:
        return []
    if named.isa:
        return expand(matrix, named.platform, isa=named.isa, emulated=True)
    if named.gpu_arch:
        return expand(
            matrix,
            named.platform,
            gpu_arch=named.gpu_arch,
            device_emulated=named.device_emulated,
        )
    seen = {r.get("isa") for r in rows if r.get("column", r.get("platform")) == column}
    seen.discard(None)
    return expand(matrix, named.platform, isa=seen.pop() if len(seen) == 1 else None)


@dataclass(frozen=True)
class GateResult:
    passed: bool
    lines: list[str]
    problems: list[str] = field(default_factory=list)


def _block(row: Row) -> tuple[Any, Any]:
    return (row.get("worker_block_size"), row.get("engine_block_size"))


KNOWN = tuple(s.value for s in Status)
RERUN = "rerun the column"


def known(row: Row) -> bool:
    """A status kvrig writes (kvrig.judge.verdict.Status); anything else is read as nothing
    (an "error" would otherwise count as not failed)."""
    return row.get("status") in KNOWN


def stale(row: Row, cell: Cell, judged_by: str | None = None) -> str | None:
    """Why a row does not stand for this matrix's cell (judged under another spec or by
    another kvrig, or run on another vLLM than the pin); None when it does."""
    if row.get("judged_under") != judged_under(cell):
        was = "names none" if not row.get("judged_under") else "differs"
        return f"judged under another expectation (the row's matrix identity {was}): {RERUN}"
    mine = judged_by or results_mod.judged_by()
    theirs = row.get("judged_by")
    if theirs != mine:
        was = "names none" if not theirs else f"is {theirs}, this kvrig's {mine}"
        return (
            "judged by another kvrig (the row's digest of kvrig's rules, judge and matrix"
            f" code {was}): {RERUN}"
        )
    return _version_problem(row, cell)


def _version_problem(row: Row, cell: Cell) -> str | None:
    """Why the row's vLLM is not the one the matrix pins, or None: another version, or
    none named by a row that counts as passed (a skip or a crash ran none)."""
    pinned = versions.source_version(cell.platform_spec.vllm.installed)
    ran = row.get("vllm_version")
    if ran is None:
        if row.get("status") not in {s.value for s in PASSING}:
            return None
        return (
            "judged under another expectation (the row names no vLLM version, so it cannot be"
            f" shown to have run {cell.platform_spec.vllm.installed.describe()}): {RERUN}"
        )
    if pinned is None:  # an image or a wheel that names no version
        return None
    try:
        same = versions.parse(str(ran)) == versions.parse(pinned)
    except versions.VersionError:
        same = False
    if same:
        return None
    return (
        f"judged under another expectation (it ran vLLM {ran}, the matrix pins {pinned}): {RERUN}"
    )


@dataclass(frozen=True)
class Standing:
    """What a row must have been judged by and run on to stand for its cell, besides the
    cell: this kvrig, matrix.yaml's folder (for its overlay) and the side runs named."""

    judged_by: str
    matrix_dir: Path | None = None
    side_cells: frozenset[str] = frozenset()

    @classmethod
    def of(cls, matrix: Matrix, side_cells: Collection[str] = ()) -> Standing:
        where = matrix.path.parent if matrix.path else None
        return cls(results_mod.judged_by(), where, frozenset(side_cells))


def _problem(row: Row | None, cell: Cell, standing: Standing | None = None) -> str | None:
    """Why a required cell does not count as passed, or None when it does."""
    if row is None:
        return "not run: the results hold no row for it (the column crashed or was cut short?)"
    if not known(row):
        return f"unknown status {row.get('status')!r} (kvrig writes {', '.join(KNOWN)})"
    standing = standing or Standing(results_mod.judged_by())
    old = (
        stale(row, cell, standing.judged_by)
        or other_vllm(row, cell, standing)
        or other_device(row, cell)
    )
    if old is not None:
        return old
    if row["status"] == Status.FAIL:
        return f"failed: {row['reason']}"
    if row["status"] == Status.SKIP:
        # A skip proves nothing about the release, even the matrix's own `skip`: a gate cell
        # that may not run is excused only by an allowance, which names an owner and
        # expires, so marking a hard cell `skip` cannot take it out of the gate for good.
        return f"skipped: {row['reason']}"
    if Status(row["status"]) not in PASSING:
        return f"{row['status']}: {row['reason']}"
    return None


def other_vllm(row: Row, cell: Cell, standing: Standing) -> str | None:
    """Why the row ran on another vLLM than the release's own though of its version (an
    overlay or overrides matrix.yaml does not declare); None when it did not."""
    if row.get("cell_id") not in standing.side_cells:
        problem = _overlay_problem(row, cell.platform_spec.vllm, standing.matrix_dir)
        if problem is not None:
            return problem
    ran = results_mod.listed(row.get("vllm_overrides") or [])
    extra = results_mod.undeclared(ran, list(cell.platform_spec.pin_overrides.values()))
    if not extra:
        return None
    return (
        f"ran with overrides matrix.yaml does not declare ({', '.join(extra)}): not the"
        " release's own environment; reinstall it without them (kvrig setup vllm, no"
        f" --override) and {RERUN}, or declare them in platforms.{cell.platform}.pin_overrides"
    )


def other_device(row: Row, cell: Cell) -> str | None:
    """Why a row of a real GPU's column does not stand for that GPU, or None. The judge
    refuses such a record, but a row is taken as written, so the gate asks again."""
    if cell.gpu_arch is None or cell.device_emulated or cell.platform not in gpus.BY_ARCH:
        return None
    word = gpus.ARCH_WORD[cell.platform]
    seen = (row.get("host") or {}).get(gpus.HOST_ARCH_KEY[cell.platform])
    named = row.get("gpu_arch")
    for said, arch in (
        (f"its gpu_arch is {named}", named),
        (f"its host saw a {word} {seen} GPU", seen),
    ):
        if arch is not None and _arch(cell.platform, arch) != cell.gpu_arch:
            return (
                f"claims another device than its column's: {said}, and {cell.column}'s cells"
                f" are for {cell.gpu_arch}; a row filed under the wrong column: {RERUN} on a"
                f" {cell.gpu_arch} GPU"
            )
    if seen is None and row.get("status") in {s.value for s in PASSING}:
        return (
            f"names no GPU {word} its host saw, so it cannot be shown to have run on the"
            f" {cell.gpu_arch} GPU {cell.column} stands for: {RERUN}"
        )
    return None


def _arch(platform: str, arch: Any) -> str | None:
    try:
        return gpus.normalize(platform, str(arch))
    except gpus.GpuError:
        return None


def _overlay_problem(row: Row, declared: VllmSource, matrix_dir: Path | None) -> str | None:
    ran = row.get("vllm_overlay")
    if not ran:
        return None
    if declared.kind == "overlay" and _is_declared(ran, declared, matrix_dir or Path.cwd()):
        return None
    return (
        f"ran on an overlay, not on the vLLM matrix.yaml declares ({declared.describe()}):"
        f" {_overlay_text(ran)}; a side run's row in the release's column: {RERUN} without"
        " --vllm-source/--vllm-patch, or gate the overlay's own folder with --side"
    )


def _overlay_text(ran: Any) -> str:
    try:
        return Manifest.of_summary(ran).describe()
    except (TypeError, ValueError, AttributeError):
        return f"overlay {ran!r}"


def _is_declared(ran: Mapping[str, Any], declared: VllmSource, matrix_dir: Path) -> bool:
    """Whether the row's overlay is the one matrix.yaml declares: the same patch (by its
    sha256) or the same checkout (by its path), read relative to matrix.yaml."""
    try:
        if declared.patch is not None:
            patch = overlay_inputs.resolve(declared.patch, matrix_dir)
            return ran.get("patch_sha256") == overlay_inputs.sha256(patch)
        source = overlay_inputs.resolve(str(declared.source), matrix_dir)
        return bool(ran.get("source")) and Path(str(ran["source"])).resolve() == source
    except (OSError, AttributeError):
        return False


def side_folders(held: Mapping[Path, holds_mod.Holds | None]) -> list[str]:
    """The release folders whose record (kvrig.run.holds) says they hold a side run's rows,
    each said with what to do: a release column's folder stands for the release only."""
    return [
        f"{folder} holds {h.describe()} (its {holds_mod.FILE}), not the release's own run:"
        f" remove it and {RERUN} into it, or gate it by name with --side {folder}"
        for folder, h in held.items()
        if h is not None and h.side
    ]


def row_column(row: Row) -> str | None:
    return row.get("column")


@dataclass(frozen=True)
class Selection:
    """The results the gate reads, and what it left out, each named."""

    sources: list[tuple[Path, list[Row]]]
    columns: list[str]  # the columns of the folders read, in the order first seen
    ignored: list[str]


def select(
    sources: list[tuple[Path, list[Row]]], columns: list[str], side: Collection[Path] = ()
) -> Selection:
    """The release columns' results files among `sources` (pure), and a side run's only
    when named, so a side run's rows never stand for the release unasked."""
    kept: list[tuple[Path, list[Row]]] = []
    seen: list[str] = []
    ignored: list[str] = []
    emulated = gpus.emulated_columns()
    for path, rows in sources:
        folder = path.parent
        if column_of_folder(folder.name, emulated) or any(r.get("device_emulated") for r in rows):
            ignored.append(
                f"{folder}: an emulated device's results (vLLM's own code on a CPU host,"
                " configuration only), which the release gate never counts as hardware"
            )
            continue
        if path in side:
            column = column_of_side_folder(folder.name, columns)
        else:
            column = column_of_folder(folder.name, columns)
            if column is None:
                ignored.append(
                    f"{folder}: not a release column's folder (<column> or"
                    " <column>-shard<i>) but a side run; name it with --side to gate on it"
                )
                continue
        mine, others = [], Counter[str]()
        for r in rows:
            own = row_column(r)
            if own is not None and column in (None, own):
                mine.append(r)
            else:
                others[str(own or "none named")] += 1
        if others:
            shown = ", ".join(f"{c} ({n})" for c, n in sorted(others.items()))
            ignored.append(f"{folder}: rows of another column than {column or 'its own'}: {shown}")
        kept.append((path, mine))
        for c in [column] if column else sorted({str(row_column(r)) for r in mine}):
            if c not in seen:
                seen.append(c)
    return Selection(kept, seen, ignored)


def changes(rows: list[Row], previous: list[Row]) -> tuple[list[str], list[str], list[str]]:
    """New failures, fixes and block-size changes against a previous run (pure)."""
    before = {r["cell_id"]: r for r in previous}
    new_fail, fixed, moved = [], [], []
    for r in rows:
        old = before.get(r["cell_id"])
        if old is None:
            continue
        if r.get("status") == Status.FAIL and old.get("status") != Status.FAIL:
            new_fail.append(f"{r['cell_id']}: {r.get('reason')}")
        elif r.get("status") == Status.PASS and old.get("status") == Status.FAIL:
            fixed.append(r["cell_id"])
        was, now = _block(old), _block(r)
        if was[0] is not None and now[0] is not None and was != now:
            moved.append(f"{r['cell_id']}: {block_text(old)} -> {block_text(r)}")
    return new_fail, fixed, moved


def _allowance_column(allowance: Allowance) -> str:
    # The allowance's own column (a cell id is `<column>-<model>-<case>`, and neither a
    # model nor a case has a hyphen): a prefix would take `cpu-avx2-m-c` for `cpu`'s.
    return allowance.cell.rsplit("-", 2)[0]


def _allowance_problems(
    matrix: Matrix, columns: list[str], today: dt.date
) -> tuple[list[str], list[str]]:
    """(problems, lines) of the allowances of the gated columns that are expired or run
    further ahead than an allowance may."""
    problems, lines = [], []
    for a in matrix.allowances:
        if _allowance_column(a) not in columns:
            continue
        latest = allowance_too_long(a, today)
        if a.expires < today:
            problems.append(f"allowance for {a.cell} expired")
            lines.append(
                f"EXPIRED allowance for {a.cell} (owner {a.owner}, expired {a.expires}: {a.reason})"
                "; renew its expiry date in matrix.yaml or remove it"
            )
        elif latest is not None:
            problems.append(f"allowance for {a.cell} runs past {latest}")
            lines.append(
                f"REFUSED allowance for {a.cell} (owner {a.owner}, expires {a.expires}:"
                f" {a.reason}): an allowance may run at most {ALLOWANCE_DAYS} days ahead;"
                f" set its expiry on or before {latest} in matrix.yaml"
            )
    return problems, lines


def _ran_nothing(column: str, rows: list[Row]) -> str | None:
    """Why a gated column ran no cell, or None when it ran one: a column of skips (or of
    nothing) proves nothing about the release, however its gate cells are excused."""
    mine = [r for r in rows if row_column(r) == column]
    if not mine:
        return "the results hold no row of it"
    if all(r.get("status") == Status.SKIP for r in mine):
        return f"all {len(mine)} of its row(s) are skips"
    return None


def required_columns(matrix: Matrix, found: list[str]) -> list[str]:
    """The columns of the platforms matrix.yaml's release names, and any other column found
    of a required platform (`cpu-avx2`), which is held to the same cells."""
    required = matrix.required_columns
    platforms = set(matrix.required_platforms)
    for c in found:
        column = column_names.parse(c)
        if c not in required and column is not None and column.platform in platforms:
            required.append(c)
    return required


def named_columns(matrix: Matrix, names: list[str]) -> list[str]:
    """The columns --platform names: a column as given, a platform as its release
    columns (`cuda`: one per CI architecture)."""
    out: list[str] = []
    for name in names:
        more = matrix.platform_columns(name) if name in matrix.platforms else [name]
        out += [c for c in more if c not in out]
    return out


def evaluate(
    matrix: Matrix,
    rows: list[Row],
    columns: list[str],
    today: dt.date,
    previous: list[Row] | None = None,
    accept_block_size_changes: bool = False,
    repro: Repro | None = None,
    ignored: list[str] | None = None,
    standing: Standing | None = None,
    refused: list[str] | None = None,
) -> GateResult:
    """The gate over `rows` for `columns` (pure but for reading matrix.yaml's overlay
    patch); whatever is left out is named, so no row is silently taken or dropped."""
    tally = _Tally(lines=[f"IGNORED {x}" for x in ignored or []])
    tally.standing = standing or Standing.of(matrix)
    for x in refused or []:
        tally.problems.append(f"{x.split(' holds ')[0]} holds a side run")
        tally.lines.append(f"FAIL    folder {x}")
    other = _other_columns(rows, columns)
    if other is not None:
        tally.lines.append(f"IGNORED rows of columns the gate does not gate on: {other}")
    rows = [r for r in rows if row_column(r) in columns]
    if not columns:
        tally.problems.append("no column results to gate on")
    _gate_columns(tally, matrix, rows, columns, today, repro)
    _unknown_statuses(tally, rows)
    more, said = _allowance_problems(matrix, columns, today)
    tally.problems += more
    tally.lines += said
    tally.lines += _not_required_failures(rows, tally.required, repro)
    if previous is not None:
        _since_previous(tally, rows, previous, accept_block_size_changes)
    declared = [o for spec in matrix.platforms.values() for o in spec.pin_overrides.values()]
    return _result(tally, columns, rows, declared)


@dataclass
class _Tally:
    """What the gate has said so far, in the order it is printed, and its counts."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    required: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: {"passed": 0, "allowed": 0, "failed": 0})
    standing: Standing | None = None


def _other_columns(rows: list[Row], columns: list[str]) -> str | None:
    """The columns of rows the gate leaves out, with their counts, or None when none:
    named, so a row the gate did not read is never silently taken for one it did."""
    other = Counter(
        str(row_column(r) or "none named") for r in rows if row_column(r) not in columns
    )
    if not other:
        return None
    return ", ".join(f"{c} ({n})" for c, n in sorted(other.items()))


def _gate_columns(
    tally: _Tally,
    matrix: Matrix,
    rows: list[Row],
    columns: list[str],
    today: dt.date,
    repro: Repro | None,
) -> None:
    """Each gated column must have run a cell, and each of its required cells passed or
    been excused by an allowance."""
    by_id = {r["cell_id"]: r for r in rows}
    allowances: dict[str, Allowance] = {a.cell: a for a in matrix.allowances}
    for column in columns:
        nothing = _ran_nothing(column, rows)
        if nothing is not None:
            tally.problems.append(f"{column} ran no cell")
            tally.lines.append(f"FAIL    column {column} ran no cell: {nothing}")
        for cell in column_cells(matrix, column, rows):
            if cell.case.gate:
                tally.required.add(cell.id)
                row, allowance = by_id.get(cell.id), allowances.get(cell.id)
                _gate_cell(tally, cell, column, row, allowance, today, repro)


def _gate_cell(
    tally: _Tally,
    cell: Cell,
    column: str,
    row: Row | None,
    allowance: Allowance | None,
    today: dt.date,
    repro: Repro | None,
) -> None:
    """One required cell: passed, allowed, or failed with the commands that rerun it."""
    why = _problem(row, cell, tally.standing)
    if why is None:
        tally.counts["passed"] += 1
        tally.lines.append(f"ok      {cell.id}")
        if allowance is not None:
            tally.lines.append(f"        (its allowance by {allowance.owner} is no longer needed)")
        return
    if allowance is not None and _excused(row, allowance, today):
        tally.counts["allowed"] += 1
        tally.lines.append(
            f"ALLOWED {cell.id}: {why} -- allowed until {allowance.expires} by"
            f" {allowance.owner}: {allowance.reason}"
        )
        return
    tally.counts["failed"] += 1
    tally.problems.append(f"{cell.id} {why.split(':')[0].split(' (')[0]}")
    tally.lines.append(f"FAIL    {cell.id}: {why}")
    if repro is not None:
        image = row.get("image") if row else None
        under = results_mod.overlay_of(row) if row else None
        tally.lines += _rerun_lines(repro, cell.id, column, image, under)


def _excused(row: Row | None, allowance: Allowance, today: dt.date) -> bool:
    """Whether the allowance excuses the cell today: in force and within ALLOWANCE_DAYS. An
    unreadable row is no failure an allowance was written for."""
    return (
        (row is None or known(row))
        and _state(row) in allowance.excuses
        and allowance.expires >= today
        and allowance_too_long(allowance, today) is None
    )


def _state(row: Row | None) -> str:
    """What an allowance is asked to excuse: no row, a skip, or any other way of not passing."""
    if row is None:
        return "missing"
    return "skip" if row.get("status") == Status.SKIP else "fail"


def _rerun_lines(
    repro: Repro, cell_id: str, column: str, image: str | None, under: dict[str, Any] | None
) -> list[str]:
    try:
        lines = repro(cell_id, column, image, under)
    except (TypeError, ValueError):  # an overlay not as kvrig writes one: rerun without it
        lines = repro(cell_id, column, image, None)
    return [f"          {x}" for x in lines]


def _unknown_statuses(tally: _Tally, rows: list[Row]) -> None:
    """A row of a cell that is not required still fails the gate when its status is not
    one kvrig writes: something other than kvrig wrote or changed it."""
    for r in rows:
        if r["cell_id"] not in tally.required and not known(r):
            tally.problems.append(f"{r['cell_id']} unknown status")
            tally.lines.append(
                f"FAIL    {r['cell_id']}: unknown status {r.get('status')!r}"
                f" (kvrig writes {', '.join(KNOWN)})"
            )


def _not_required_failures(rows: list[Row], required: set[str], repro: Repro | None) -> list[str]:
    """The failed cells the gate does not require, listed (with how to rerun them) so
    they are seen, though they do not fail it."""
    others = [r for r in rows if r.get("status") == Status.FAIL and r["cell_id"] not in required]
    if not others:
        return []
    lines = [f"not required, failed ({len(others)}):"]
    for r in others:
        lines.append(f"        {r['cell_id']}: {r.get('reason')}")
        if repro is not None:
            column = r.get("column") or r["cell_id"].split("-", 1)[0]
            lines += _rerun_lines(
                repro, r["cell_id"], column, r.get("image"), results_mod.overlay_of(r)
            )
    return lines


def _since_previous(tally: _Tally, rows: list[Row], previous: list[Row], accept: bool) -> None:
    """New failures, fixes and moved block sizes against the previous run; a moved block
    size fails the gate unless the change is accepted."""
    new_fail, fixed, moved = changes(rows, previous)
    tally.lines.append(
        f"since the previous run: {len(new_fail)} new failure(s), {len(fixed)} fixed,"
        f" {len(moved)} block size change(s)"
    )
    tally.lines.extend(f"  NEW FAILURE {x}" for x in new_fail)
    tally.lines.extend(f"  FIXED       {x}" for x in fixed)
    for x in moved:
        tally.lines.append(f"  BLOCK SIZE CHANGED {x}")
        if not accept:
            tally.problems.append(f"block size of {x.split(':')[0]} changed")
    if moved and not accept:
        tally.lines.append(
            "  A chosen block size changed. If vLLM meant it, rerun the gate with"
            " --accept-block-size-changes (and update the matrix's invariants)."
        )


def _result(tally: _Tally, columns: list[str], rows: list[Row], declared: list[str]) -> GateResult:
    counts = tally.counts
    lines = [
        *tally.lines,
        f"required cells on {', '.join(columns) or 'no column'}: {counts['passed']} passed,"
        f" {counts['allowed']} allowed, {counts['failed']} failed",
        *(f"vLLM under test: {text}" for text in overlays_of(rows)),
        *(f"vLLM under test: {text}" for text in overrides_of(rows, declared)),
    ]
    passed = not tally.problems
    verdict = "PASS" if passed else f"FAIL ({'; '.join(tally.problems)})"
    lines.append(f"gate: {verdict}")
    return GateResult(passed, lines, tally.problems)
