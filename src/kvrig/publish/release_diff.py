"""What moved between two vLLMs, cell by cell, and whether kvrig's rules say why.

On the day a release ships, the question is not "is it green" but "what did it change,
and do we understand it". So records are compared, not verdicts, and a move is explained
only when each release's rules compute what it did and a switch of kvrig.define.releases
accounts for the difference; any other move is red, because someone must read it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvrig.define.case_spec import EarlyError, Runs
from kvrig.define.cells import Cell
from kvrig.define.vllm_names import STATE_BACKENDS
from kvrig.judge.computed import computed_kind
from kvrig.judge.messages import EARLY_FUNCTION, early_error_backends
from kvrig.publish import compare
from kvrig.rules import backend_facts, blocksize, refusals, shapes, versions
from kvrig.rules.backends import Backend, NoCommonKernelBlock, kernel_block_size

Row = dict[str, Any]
Record = dict[str, Any]
PHASE1_FUNCTION = "_preferred_block_size_for_backends"
# What the rules compute; the other facts of a record are vLLM's alone. Of the kernel
# block sizes, the rules compute the attention groups' (the worker's split of a block
# among the group's backends); a state group's (Mamba, GDN) is its own block size, and
# a move there is vLLM's alone.
MODELED = ("kind", "block", "rejecting", "backends", "kernels")
ASPECTS = ("kind", "block", "rejecting", "backends", "kernels", "error")


@dataclass(frozen=True)
class Side:
    """One vLLM of the two: how the report names it, the release whose rules judge it, and
    why those rules may not be its own (a release newer than any read, a patch)."""

    label: str
    release: str
    unread: str | None = None


@dataclass(frozen=True)
class Observed:
    """What one record shows, with the block size written as N in the kernel sizes and
    error text, so a size that moves is one move, not three."""

    kind: str
    block: int | None = None
    rejecting: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    error: str = ""
    # The attention KV-cache groups, each as (its backends, its kernel block, its own block
    # size: a group of layers whose KV pages are smaller holds more tokens a block), and the
    # state groups' kernel blocks: how the kernel sizes split between the rules and vLLM.
    groups: tuple[tuple[tuple[str, ...], str, int | None], ...] = ()
    state_kernels: tuple[str, ...] = ()
    # The kernel sizes each backend declared (get_supported_kernel_block_sizes), by name.
    declared: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # An early error whose first line does not read as the check's: that line, as raised.
    unread_early: str | None = None

    def get(self, aspect: str) -> object:
        return getattr(self, aspect)

    @property
    def attention(self) -> tuple[str, ...]:
        """The backends the block-size steps read: the layers' own, state backends aside."""
        return tuple(b for b in self.backends if b not in STATE_BACKENDS)

    def text(self, aspect: str) -> str:
        value = self.get(aspect)
        if isinstance(value, tuple):
            return ", ".join(value) or "-"
        return "-" if value in (None, "") else str(value)


def _kind(record: Record, row: Row | None) -> str:
    """The outcome in the rules' words: runs (a late error too: its size passed the early
    check), early_error, phase1_error, unsupported; or undecided, skipped, not run."""
    status = (row or {}).get("status")
    if status in ("undecided", "skip"):
        return "undecided" if status == "undecided" else "skipped"
    outcome = record.get("outcome")
    if outcome in ("ran", "configured"):
        return "runs"
    error = record.get("error") or {}
    if outcome != "error" or not error:
        return str(outcome or "not run")
    if error.get("function") == EARLY_FUNCTION:
        return "early_error"
    if error.get("function") == PHASE1_FUNCTION:
        return "phase1_error"
    return "runs" if record.get("kv_cache_sized_before_error") else "unsupported"


def observe(record: Record | None, row: Row | None = None) -> Observed:
    if record is None:
        return Observed("not run")
    kind = _kind(record, row)
    error = record.get("error") or {}
    message = str(error.get("message") or "").strip().splitlines()[:1]
    block, rejecting = record.get("worker_block_size"), ()
    unread_early = None
    if kind == "early_error":
        parsed = early_error_backends(message[0] if message else "")
        block, rejecting = (parsed[0], tuple(sorted(parsed[1]))) if parsed else (None, ())
        unread_early = None if parsed else (message[0] if message else "")
    text = ""
    if error and (kind != "early_error" or unread_early is not None):
        text = f"{error.get('type')} from {error.get('function')}: {message[0] if message else ''}"
        # A config's repr as its class name alone: a release that adds a field to the
        # selector's config (AttentionSelectorConfig) changes no outcome.
        text = re.sub(r"\b(\w+Config)\([^()]*\)", r"\1(...)", text)
        text = _reasons_sorted(text)
    return Observed(
        kind=kind,
        block=block,
        rejecting=rejecting,
        backends=tuple(sorted(set((record.get("layer_backends") or {}).values()))),
        kernels=tuple(_as_n(str(k), block) for k in record.get("kernel_block_sizes") or []),
        error=_as_n(text, block),
        **_groups(record.get("kv_cache_groups") or [], block),
        declared=tuple(sorted(_declared(record).items())),
        unread_early=unread_early,
    )


def _reasons_sorted(text: str) -> str:
    """The selector's reasons per backend in name order: the order is the platform's
    priority, a move of the backends (a switch's), not of the error."""

    def by_name(found: re.Match[str]) -> str:
        items = sorted(re.findall(r"\w+: \[[^\]]*\]", found.group(1)))
        return "Reasons: {" + ", ".join(items) + "}"

    return re.sub(r"Reasons: \{([^{}]*)\}", by_name, text)


def _declared(record: Record) -> dict[str, tuple[str, ...]]:
    """The kernel sizes each backend declared in the record, by name."""
    sizes = record.get("backend_kernel_sizes") or {}
    return {str(k): tuple(str(x) for x in v) for k, v in sizes.items() if isinstance(v, list)}


def _groups(groups: Sequence[Mapping[str, Any]], block: int | None) -> dict[str, tuple]:
    """Observed's groups and state_kernels, from a record's KV-cache groups."""
    attention, state = [], []
    for g in groups:
        names = tuple(sorted(g.get("backends") or []))
        kernel = _as_n(str(g.get("kernel_block_size")), block)
        if any(n not in STATE_BACKENDS for n in names):
            own = g.get("block_size")
            attention.append((names, kernel, own if isinstance(own, int) else None))
        else:
            state.append(kernel)
    return {"groups": tuple(attention), "state_kernels": tuple(state)}


def _as_n(text: str, block: int | None) -> str:
    """The block size written as N (whole numbers only)."""
    return text if block is None else re.sub(rf"\b{block}\b", "N", text)


def _with_backends_as_b(text: str, names: Sequence[str]) -> str:
    """An error's text with the backends that moved written as B: the same error about the
    backend the new selector picks is the backends' move, not another."""
    for name in names:
        text = re.sub(rf"\b{re.escape(name)}\b", "B", text)
    return text


@dataclass(frozen=True)
class Predicted:
    """What one release's rules compute for a cell."""

    kind: str
    block: int | None
    rejecting: tuple[str, ...] = ()
    # The layers' attention backends (sorted names), None where the rules cannot say.
    backends: tuple[str, ...] | None = None
    # Each pipeline stage's block size where the stages decide apart (a stage without
    # attention keeps the configured block): its state groups' kernel blocks.
    stages: tuple[int, ...] = ()
    # The same backends as the rules see them, for the worker's kernel block; not part of
    # what a release's rules compute as an outcome, so not compared.
    chosen: tuple[Backend, ...] = field(default=(), compare=False)
    # A block-outermost KV-cache layout: every group's block is its kernel block.
    whole_kernel_blocks: bool = field(default=False, compare=False)
    # The refusal in the words the rules hold (its opening: vLLM may say more after it).
    refusal: str | None = field(default=None, compare=False)

    def text(self) -> str:
        if self.kind == "early_error":
            return f"an early error at {self.block} naming {', '.join(self.rejecting)}"
        if self.kind == "runs":
            return f"a run at {self.block}"
        return self.kind.replace("_", " ")


def predict(cell: Cell, rules: versions.Rules | None = None) -> tuple[Predicted | None, str]:
    """The rules' outcome for an emulated cell (or why there is none)."""
    try:
        exp = blocksize.expected(cell, cell.config, cpu=None, gpu_arch=cell.gpu_arch, rules=rules)
    except (shapes.ConfigError, KeyError, ValueError) as exc:
        return None, str(exc)
    kind = computed_kind(exp)
    asked = blocksize.asked(cell, rules or blocksize.cell_rules(cell))
    try:
        chosen = tuple(blocksize.layer_backends(cell, cell.config, exp.block_size, release=rules))
        backends: tuple[str, ...] | None = tuple(sorted({b.name for b in chosen}))
    except (shapes.ConfigError, KeyError, ValueError):
        chosen, backends = (), None
    if exp.unsupported is not None and exp.unsupported == refusals.config_refusal(asked):
        chosen, backends = (), ()  # refused by the configuration: no backend was selected
    predicted = Predicted(
        kind,
        exp.block_size,
        tuple(sorted(exp.rejecting)),
        backends,
        tuple(exp.stage_block_sizes),
        chosen,
        blocksize.block_outermost(cell),
        exp.unsupported,
    )
    return predicted, exp.explain()


def kernel_problem(seen: Observed, predicted: Predicted) -> str | None:
    """Where an attention group's kernel block is not the worker's split of the block among
    the group's backends as the rules have them (kvrig.rules.backends.kernel_block_size);
    None when every group's is."""
    if not seen.groups:
        return "no KV-cache groups recorded"
    for names, kernel, own in seen.groups:
        members = [b for b in predicted.chosen if b.name in names]
        if len(members) != len(names) or seen.block is None:
            return f"a group of {', '.join(names)}, backends its rules do not choose together"
        try:
            size = kernel_block_size(
                own or seen.block, members, whole=predicted.whole_kernel_blocks
            )
            computed = _as_n(str(size), seen.block)
        except NoCommonKernelBlock:
            computed = "no kernel block"
        if computed != kernel:
            group = ", ".join(names)
            return f"{group} split into kernel blocks of {kernel}; its rules compute {computed}"
    return None


def agrees(seen: Observed, predicted: Predicted | None) -> bool:
    """Whether a release did what its rules compute, in the facts the rules speak of."""
    if predicted is None or seen.kind != predicted.kind:
        return False
    if seen.kind in ("runs", "early_error") and seen.block != predicted.block:
        # A late error stops before the size is known to the record; its kind is enough.
        return seen.block is None and seen.kind == "runs"
    return seen.kind != "early_error" or seen.rejecting == predicted.rejecting


@dataclass(frozen=True)
class Move:
    """One cell that moved: what, on which side, and whether the rules say why."""

    column: str
    cell_id: str
    where: str | None
    old: Observed
    new: Observed
    aspects: tuple[str, ...]
    explained: bool
    why: str
    switches: tuple[str, ...] = ()
    # Only the words of a refusal both releases' rules compute moved (the reasons vLLM
    # gives after it): listed, not red.
    reworded: bool = False


@dataclass(frozen=True)
class MatrixChange:
    """An edit of matrix.yaml a move implies, for review."""

    where: str
    cell_id: str
    what: str


@dataclass(frozen=True)
class DeclaredChange:
    """A backend whose declared kernel sizes moved between the releases on a platform, once,
    with its cells; red where kvrig's backend table, which every computed size reads, lacks
    the new sizes."""

    platform: str
    backend: str
    old: tuple[str, ...]
    new: tuple[str, ...]
    cells: tuple[str, ...]
    table: str | None = None

    @property
    def red(self) -> bool:
        return self.table is not None

    def text(self) -> str:
        known = self.table or "kvrig's backend table holds the new sizes"
        cells = f"{len(self.cells)} cell(s): {compare.names(self.cells)}"
        return (
            f"{self.platform}: {self.backend} declares {', '.join(self.old) or '-'} ->"
            f" {', '.join(self.new) or '-'} ({cells}); {known}"
        )


def _table_says(platform: str, backend: str, new: tuple[str, ...]) -> str | None:
    """None where kvrig's table holds the new sizes; else what it holds, or that it does
    not restate the backend."""
    if backend not in backend_facts.table(platform):
        return f"kvrig's backend table does not restate {backend} on {platform}"
    differ = backend_facts.disagreements(platform, {backend: list(new)})
    return f"not the table's: {differ[0]}" if differ else None


def declared_changes(pairs: Sequence[CellPair]) -> list[DeclaredChange]:
    """Each vLLM backend's declared kernel sizes that differ between a cell's two records,
    one change per backend and pair; a crafted backend's follow the cell, not the release."""
    found: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for pair in pairs:
        crafted = pair.old_cell.case.crafted
        if pair.old_record is None or pair.new_record is None or crafted.replace is not None:
            continue  # a replaced backend declares the case's sizes, not the release's
        old, new = _declared(pair.old_record), _declared(pair.new_record)
        for name in sorted(set(old) & set(new) - {s.name for s in crafted.siblings}):
            if old[name] != new[name]:
                key = (pair.old_cell.platform, name, old[name], new[name])
                found.setdefault(key, []).append(pair.old_cell.id)
    return [
        DeclaredChange(*key, tuple(cells), _table_says(key[0], key[1], key[3]))
        for key, cells in found.items()
    ]


@dataclass
class Diff:
    old: Side
    new: Side
    columns: list[str] = field(default_factory=list)
    compared: int = 0
    moves: list[Move] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    changes: list[MatrixChange] = field(default_factory=list)
    declared: list[DeclaredChange] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Move]:
        return [m for m in self.moves if not m.explained]

    @property
    def reworded(self) -> list[Move]:
        return [m for m in self.moves if m.reworded]

    @property
    def red(self) -> bool:
        """Whether a release manager must read something: an unexplained move, kernel sizes
        kvrig's table lacks, or a cell one side could not show."""
        return bool(self.unexplained or self.missing or any(c.red for c in self.declared))


@dataclass(frozen=True)
class CellPair:
    """One cell on both sides: as each side's matrix expands it, with its record and row."""

    column: str
    old_cell: Cell
    new_cell: Cell
    old_record: Record | None
    new_record: Record | None
    old_row: Row | None = None
    new_row: Row | None = None


def explain(pair: CellPair, old: Side, new: Side) -> Move | None:
    """The cell's move, explained or not; None when nothing moved."""
    seen_old = observe(pair.old_record, pair.old_row)
    seen_new = observe(pair.new_record, pair.new_row)
    moved = tuple(a for a in ASPECTS if seen_old.get(a) != seen_new.get(a))
    if seen_old.kind == seen_new.kind == "unsupported":
        # Refused on both sides: the block reached before the refusal is no outcome of it.
        moved = tuple(a for a in moved if a not in ("block", "kernels"))
    if "backends" in moved and "error" in moved:
        names = sorted(set(seen_old.attention) ^ set(seen_new.attention))
        if _with_backends_as_b(seen_old.error, names) == _with_backends_as_b(seen_new.error, names):
            moved = tuple(a for a in moved if a != "error")
    if not moved:
        return None
    base = {
        "column": pair.column,
        "cell_id": pair.old_cell.id,
        "where": pair.old_cell.source,
        "old": seen_old,
        "new": seen_new,
        "aspects": moved,
    }
    reworded = _reworded(pair, moved, seen_old, seen_new)
    if reworded is not None:
        return Move(**base, explained=True, why=reworded, reworded=True)
    why, switches = _why(pair, moved, seen_old, seen_new, old, new)
    return Move(**base, explained=bool(switches), why=why, switches=switches)


def _reworded(
    pair: CellPair, moved: tuple[str, ...], seen_old: Observed, seen_new: Observed
) -> str | None:
    """Why a move is only vLLM's words: both releases refused as their rules compute, and
    the refusal the rules hold opens both messages; what follows it is vLLM's wording."""
    if moved != ("error",) or not seen_old.kind == seen_new.kind == "unsupported":
        return None
    rules_old, rules_new = _rules(pair.old_cell), _rules(pair.new_cell)
    if rules_old is None or rules_new is None:
        return None
    p_old, p_new = predict(pair.old_cell, rules_old)[0], predict(pair.new_cell, rules_new)[0]
    if p_old is None or p_new is None or p_old.refusal != p_new.refusal or not p_old.refusal:
        return None
    said = f": {p_old.refusal}"
    sides = ((seen_old, p_old), (seen_new, p_new))
    if not all(said in seen.error and agrees(seen, p) for seen, p in sides):
        return None
    return (
        f"the same refusal ({p_old.refusal!r}), reworded after it by vLLM: no switch needed,"
        " nothing the rules or the matrix hold moved"
    )


def _why(
    pair: CellPair,
    moved: tuple[str, ...],
    seen_old: Observed,
    seen_new: Observed,
    old: Side,
    new: Side,
) -> tuple[str, tuple[str, ...]]:
    """(why, the explaining switches: empty when unexplained)."""
    rules_old, rules_new = _rules(pair.old_cell), _rules(pair.new_cell)
    p_old, how_old = predict(pair.old_cell, rules_old) if rules_old else (None, "")
    p_new, how_new = predict(pair.new_cell, rules_new) if rules_new else (None, "")
    staged = _stages_computed(((seen_old, p_old), (seen_new, p_new)))
    beyond = _unread_early(((old.label, seen_old), (new.label, seen_new))) or _beyond_rules(
        moved, seen_old, seen_new, staged
    )
    if beyond is not None:
        return beyond, ()
    if rules_old is None or rules_new is None:
        return "no rules for one side's release", ()
    checks = ((old.label, seen_old, p_old, how_old), (new.label, seen_new, p_new, how_new))
    for label, seen, p, how in checks:
        if not agrees(seen, p):
            computed = p.text() if p else f"nothing ({how})"
            return f"vLLM {label} did {_did(seen)}; its rules compute {computed}", ()
        # The chosen backends are the rules' words only where they moved (a platform's
        # selection, e.g. ROCm's per gfx target and release).
        if "backends" in moved and p is not None and seen.attention != p.backends:
            computed = ", ".join(p.backends) if p.backends is not None else "none"
            return (
                f"vLLM {label} chose {', '.join(seen.attention) or 'no backend'}; its rules"
                f" compute {computed}",
                (),
            )
        sized = seen.kind != "unsupported" or bool(seen.kernels)  # refused before sizing
        problem = kernel_problem(seen, p) if "kernels" in moved and p and sized else None
        if problem:
            return f"vLLM {label}: {problem}", ()
    if p_old == p_new:
        return (
            f"kvrig's rules compute the same for both ({p_new.text() if p_new else '-'}):"
            f" vLLM moved where no switch of kvrig.define.releases does{_unread(new)}",
            (),
        )
    names = _explaining(pair.new_cell, rules_old, rules_new, p_old)
    what = "; ".join(names) if names else "the switches together"
    kernels = ""
    if "kernels" in moved:
        old_k, new_k = (_attention_kernels(seen) for seen in (seen_old, seen_new))
        kernels = f"; the worker's kernel blocks {old_k} -> {new_k} follow"
    return f"{what}: rules compute {p_old.text()} -> {p_new.text()}{kernels}, as vLLM did", tuple(  # type: ignore[union-attr]
        names or [s.name for s in versions.differing(rules_old, rules_new)]
    )


def _stages_computed(sides: tuple[tuple[Observed, Predicted | None], ...]) -> bool:
    """Whether each side's state groups' kernel blocks are its pipeline stages' block sizes
    as its rules compute them (a stage without attention keeps the configured block)."""
    for seen, p in sides:
        if p is None or not p.stages or seen.block is None:
            return False
        numbers = [str(seen.block) if k == "N" else k for k in seen.state_kernels]
        if not all(n.isdigit() and int(n) in p.stages for n in numbers):
            return False
    return True


def _beyond_rules(
    moved: tuple[str, ...], seen_old: Observed, seen_new: Observed, staged: bool = False
) -> str | None:
    """Why no switch can say why: something moved that kvrig's rules do not speak of."""
    # A refusal that came or went with the kind moves its error and the state groups with
    # it: the kind is what the rules speak of.
    with_kind = "kind" in moved and not (seen_old.error and seen_new.error)
    if with_kind:
        moved = tuple(a for a in moved if a != "error")
    beyond = [f"{a}: {seen_old.text(a)} -> {seen_new.text(a)}" for a in moved if a not in MODELED]
    state_moved = seen_old.state_kernels != seen_new.state_kernels
    unsized = with_kind and not (seen_old.state_kernels and seen_new.state_kernels)
    if "kernels" in moved and state_moved and not staged and not unsized:
        old_k, new_k = (", ".join(s.state_kernels) or "-" for s in (seen_old, seen_new))
        beyond.append(f"the state groups' kernel blocks: {old_k} -> {new_k}")
    if not beyond:
        return None
    return f"moved where kvrig's rules do not reach ({'; '.join(beyond)}): no switch says why"


def _unread_early(sides: tuple[tuple[str, Observed], ...]) -> str | None:
    """Why a side's early error cannot be compared: its text does not read as the check's,
    so neither the size nor the backends can be read from it; quoted."""
    for label, seen in sides:
        if seen.unread_early is not None:
            return (
                f"vLLM {label}'s early error ({EARLY_FUNCTION}) no longer reads as the check's"
                " ('Aligned KV cache block size N is not supported by attention backend(s):"
                f" ...'): it says {seen.unread_early!r}; neither the size nor the backends can"
                " be read from it"
            )
    return None


def _attention_kernels(seen: Observed) -> str:
    """The attention groups' kernel blocks as numbers (N written out)."""
    return ", ".join(k if k != "N" else str(seen.block) for _, k, _ in seen.groups)


def _did(seen: Observed) -> str:
    if seen.unread_early is not None:
        return f"an early error that does not read as the check's ({seen.unread_early!r})"
    if seen.kind == "early_error":
        return f"an early error at {seen.block} naming {', '.join(seen.rejecting)}"
    if seen.kind == "runs":
        return f"a run at {seen.block}"
    return seen.kind.replace("_", " ")


def _unread(side: Side) -> str:
    return f" (its rules were not read for it: {side.unread})" if side.unread else ""


def _rules(cell: Cell) -> versions.Rules | None:
    try:
        return blocksize.cell_rules(cell)
    except (shapes.ConfigError, versions.VersionError):
        return None


def _explaining(
    cell: Cell, old: versions.Rules, new: versions.Rules, p_old: Predicted | None
) -> list[str]:
    """The switches that, reverted alone, give the old release's outcome back."""
    out = []
    for switch in versions.differing(old, new):
        back, _ = predict(cell, versions.reverted(new, old, switch))
        if back == p_old:
            was, now = getattr(old, switch.field), getattr(new, switch.field)
            out.append(f"{switch.name} {was} -> {now} ({switch.where})")
    return out


def implied_changes(pair: CellPair, seen_new: Observed) -> list[MatrixChange]:
    """Where matrix.yaml states what the new release's record contradicts (a size or an
    outcome), for review: nothing is applied."""
    cell, where = pair.new_cell, pair.new_cell.source or "matrix.yaml"
    expect = cell.expect
    key = f"{cell.platform}" + (f" ({cell.gpu_arch})" if cell.gpu_arch else "")
    out = []
    literal = expect.invariants.block_size if isinstance(expect, Runs) else None
    if literal is not None and seen_new.kind == "runs" and seen_new.block not in (None, literal):
        out.append(MatrixChange(where, cell.id, f"{key}: block size {literal} -> {seen_new.block}"))
    wanted = "early_error" if isinstance(expect, EarlyError) else expect.outcome
    if seen_new.kind in ("runs", "early_error", "phase1_error") and _outcome_differs(
        wanted, seen_new.kind
    ):
        what = f"{key}: expected {wanted}, the release shows {_did(seen_new)}"
        out.append(MatrixChange(where, cell.id, what))
    return out


def _outcome_differs(wanted: str, kind: str) -> bool:
    as_kind = {"runs": "runs", "late_error": "runs", "early_error": "early_error"}
    if wanted == "unsupported":
        return kind in ("runs", "early_error")
    return as_kind.get(wanted, wanted) != kind


def diff(pairs: Sequence[CellPair], old: Side, new: Side) -> Diff:
    out = Diff(old, new, columns=sorted({p.column for p in pairs}))
    out.declared = declared_changes(pairs)
    for pair in pairs:
        if pair.old_record is None or pair.new_record is None:
            side = old.label if pair.old_record is None else new.label
            out.missing.append(f"{pair.old_cell.id} (no record on {side})")
            continue
        out.compared += 1
        move = explain(pair, old, new)
        if move is not None:
            out.moves.append(move)
            out.changes.extend(implied_changes(pair, move.new))
    return out


# --- texts -----------------------------------------------------------------------------


def _facts(m: Move, side: str) -> str:
    seen = m.old if side == "old" else m.new
    return "; ".join(f"{a} {seen.text(a)}" for a in m.aspects)


def _mark(m: Move) -> str:
    if not m.explained:
        return "UNEXPLAINED"
    return "reworded" if m.reworded else "explained"


def summary(d: Diff) -> str:
    verdict = "RED" if d.red else "explained"
    return (
        f"{verdict}: {d.compared} cells compared on {len(d.columns)} column(s), {len(d.moves)}"
        f" moved, {len(d.moves) - len(d.unexplained) - len(d.reworded)} explained by a rule"
        f" switch, {len(d.reworded)} the same refusal reworded, {len(d.unexplained)}"
        f" unexplained, {len(d.missing)} not on both sides,"
        f" {len(d.declared)} backend(s) declaring other kernel sizes"
        f" ({sum(c.red for c in d.declared)} not as kvrig's table holds them)"
    )


DECLARED_HEADING = (
    "Declared kernel sizes that moved (each backend once; every size kvrig computes reads"
    " its backend table, kvrig.rules.backends: red where the table does not hold the new ones)"
)


def _header(d: Diff) -> list[str]:
    lines = [f"A: vLLM {d.old.label}", f"B: vLLM {d.new.label}"]
    for name, side in (("A", d.old), ("B", d.new)):
        if side.unread:
            lines.append(f"{name} is judged by rules not read for it: {side.unread}")
    return lines


def terminal(d: Diff) -> str:
    lines = _header(d)
    if d.moves:
        w = max(len(m.cell_id) for m in d.moves)
        lines.append(f"{'cell':<{w}}  {'':<11}  A -> B")
        for m in d.moves:
            mark = f"{_mark(m):<11}"
            lines.append(f"{m.cell_id:<{w}}  {mark}  {_facts(m, 'old')} -> {_facts(m, 'new')}")
            lines.append(f"{'':<{w}}  {'':<11}  {m.why}")
    lines += [f"not on both sides: {x}" for x in d.missing]
    if d.declared:
        lines.append(f"{DECLARED_HEADING}:")
        lines += [f"  {c.text()}" for c in d.declared]
    if d.changes:
        lines.append("matrix.yaml changes the moves imply (for review; nothing was applied):")
        lines += [f"  {c.where}: {c.cell_id}: {c.what}" for c in d.changes]
    lines.append(summary(d))
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(d: Diff, title: str) -> str:
    out = [f"# {title}", "", *[f"- {x}" for x in _header(d)], "", f"**{summary(d)}**", ""]
    if d.moves:
        out += ["| cell | | A | B | why |", "|---|---|---|---|---|"]
        for m in d.moves:
            mark = _mark(m) if m.explained else f"**{_mark(m)}**"
            out.append(
                f"| `{m.cell_id}` | {mark} | {_md(_facts(m, 'old'))} | {_md(_facts(m, 'new'))}"
                f" | {_md(m.why)} |"
            )
        out.append("")
    if d.missing:
        out += ["## Not on both sides", "", *[f"- {x}" for x in d.missing], ""]
    if d.declared:
        out += [f"## {DECLARED_HEADING}", "", *[f"- {_md(c.text())}" for c in d.declared], ""]
    if d.changes:
        out += ["## matrix.yaml changes the moves imply (for review, not applied)", ""]
        out += [f"- `{c.where}` `{c.cell_id}`: {c.what}" for c in d.changes]
        out.append("")
    return "\n".join(out)


def to_html(d: Diff, title: str) -> str:
    e = html.escape
    rows = "".join(
        f"<tr class='{'ok' if m.explained else 'red'}'><td><code>{e(m.cell_id)}</code></td>"
        f"<td>{_mark(m)}</td><td>{e(_facts(m, 'old'))}</td>"
        f"<td>{e(_facts(m, 'new'))}</td><td>{e(m.why)}</td></tr>"
        for m in d.moves
    )
    changes = "".join(
        f"<li><code>{e(c.where)}</code> <code>{e(c.cell_id)}</code>: {e(c.what)}</li>"
        for c in d.changes
    )
    missing = "".join(f"<li>{e(x)}</li>" for x in d.missing)
    declared = "".join(f"<li>{e(c.text())}</li>" for c in d.declared)
    head = "".join(f"<li>{e(x)}</li>" for x in _header(d))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
        "body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
        "table{border-collapse:collapse}.red{background:#fdd}.ok{background:#efe}"
        f"</style></head><body><h1>{e(title)}</h1><ul>{head}</ul><p><b>{e(summary(d))}</b></p>"
        "<table><tr><th>cell</th><th></th><th>A</th><th>B</th><th>why</th></tr>"
        f"{rows}</table>"
        + (f"<h2>Not on both sides</h2><ul>{missing}</ul>" if missing else "")
        + (f"<h2>{e(DECLARED_HEADING)}</h2><ul id=declared>{declared}</ul>" if declared else "")
        + (
            "<h2>matrix.yaml changes the moves imply (for review, not applied)</h2>"
            f"<ul>{changes}</ul>"
            if changes
            else ""
        )
        + "</body></html>"
    )


def as_json(d: Diff) -> dict[str, Any]:
    return {
        "old": vars(d.old),
        "new": vars(d.new),
        "columns": d.columns,
        "compared": d.compared,
        "red": d.red,
        "moves": [
            {
                "column": m.column,
                "cell_id": m.cell_id,
                "where": m.where,
                "aspects": list(m.aspects),
                "old": vars(m.old),
                "new": vars(m.new),
                "explained": m.explained,
                "reworded": m.reworded,
                "switches": list(m.switches),
                "why": m.why,
            }
            for m in d.moves
        ],
        "missing": d.missing,
        "declared": [
            {
                "platform": c.platform,
                "backend": c.backend,
                "old": list(c.old),
                "new": list(c.new),
                "cells": list(c.cells),
                "table": c.table,
                "red": c.red,
            }
            for c in d.declared
        ],
        "changes": [vars(c) for c in d.changes],
    }


def pairs_of(
    column: str,
    old_cells: Sequence[Cell],
    new_cells: Sequence[Cell],
    old_records: Mapping[str, Record],
    new_records: Mapping[str, Record],
    old_rows: Mapping[str, Row] | None = None,
    new_rows: Mapping[str, Row] | None = None,
) -> list[CellPair]:
    """The cells of one column on both sides, matched by id (the same case on both)."""
    news = {c.id: c for c in new_cells}
    return [
        CellPair(
            column,
            c,
            news[c.id],
            old_records.get(c.id),
            new_records.get(c.id),
            (old_rows or {}).get(c.id),
            (new_rows or {}).get(c.id),
        )
        for c in old_cells
        if c.id in news and c.expect.outcome != "skip"
    ]
