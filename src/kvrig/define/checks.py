"""What a schema-valid matrix can still get wrong, refused at load at the line it is on.

Each mistake here would otherwise show only after engines ran, as a red cell, or never:
a name that names nothing, a number no engine of the model can take, a pattern that would
pass a cell failing for an unrelated reason, an expectation no record can meet. They need
the model configs read, so they run after the schema, in kvrig.define.loader; a matrix
built in code (a unit test's) is not held to them.

Pure: a parsed and validated matrix in, the first refusal (or none) out.
"""

from __future__ import annotations

import builtins
import difflib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvrig.define import (
    column_names,
    gpus,
    knob_checks,
    lines,
    measured,
    modules,
    patterns,
    vllm_models,
)
from kvrig.define.case_spec import (
    Case,
    EarlyError,
    Expectation,
    LateError,
    Runs,
    Skip,
    Unsupported,
    expectations,
)
from kvrig.define.cells import by_arch
from kvrig.define.config_checks import stock_backends
from kvrig.define.refusal import Refusal
from kvrig.define.schema import Allowance, Matrix, MatrixError
from kvrig.define.vllm_models import HYBRID_FAMILIES
from kvrig.define.vllm_names import PLATFORM_BACKENDS
from kvrig.facts.platforms import PLATFORMS
from kvrig.host import isa

Configs = dict[str, dict[str, Any]]
# (model, case id) -> what its CPU cells were seen to do (kvrig.define.shorthands.cpu_facts).
Facts = dict[tuple[str, str], measured.CpuFacts]
# The function of vLLM's early alignment check and of the worker's late one (the verdicts
# name them too, kvrig.judge.messages, a layer this one cannot import).
EARLY_FUNCTION = "_check_aligned_block_size"
LATE_FUNCTION = "select_common_block_size"
# Python's own exception types: an expected `error:` a letter away from one is a typo (a
# name of vLLM's own, or another library's, is compared as it is).
EXCEPTIONS = sorted(
    n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
)
# vLLM lets max_model_len pass the config's positions only with this set.
LONG_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def check(
    path: Path, data: Any, matrix: Matrix, configs: Configs, facts: Facts | None = None
) -> None:
    """Raises MatrixError with the paragraph of the first mistake, at its line."""
    for refusal in refusals(data, matrix, configs, facts or {}):
        line = refusal.line or lines.line_of(data, lines.split_field(data, refusal.field))
        where = f"{path}:{line}" if line else str(path)
        raise MatrixError(
            f"{where}: the matrix is invalid at {refusal.field}: {refusal.what}. Nothing was"
            f" run; {refusal.fix} and start again."
        )


def refusals(data: Any, matrix: Matrix, configs: Configs, facts: Facts) -> Iterator[Refusal]:
    """Every mistake, names first, then numbers, patterns, expectations (and the sizes
    measured beside them) and allowances."""
    return itertools.chain(
        _default_backends(matrix),
        _unknown_modules(matrix),
        _crafted_bases(matrix, configs),
        _knob_backends(matrix, configs),
        _error_types(matrix),
        _skip_layers(matrix, configs),
        _tp_splits(matrix, configs),
        knob_checks.refusals(matrix, configs),
        _lengths_fit(matrix, configs),
        _case_lengths_fit(matrix, configs),
        _prompts_fit(matrix),
        _weak_patterns(matrix),
        _late_errors_after_sizing(matrix),
        _early_errors_that_cannot_fire(matrix),
        _defects_that_differ(matrix),
        _measured_against_expectations(matrix, facts),
        _skips_the_gate_requires(matrix),
        _allowances(data, matrix),
    )


# --- names that name nothing ------------------------------------------------------------


def _default_backends(matrix: Matrix) -> Iterator[Refusal]:
    """A platform's default_backend is what its selector gives these models on the device
    a cell without an architecture stands for (kvrig.facts.platforms): another name would
    build every crafted cell of the column over a backend vLLM does not pick."""
    for name, spec in matrix.platforms.items():
        fact = PLATFORMS.get(name)
        if fact is not None and spec.default_backend != fact.default_backend:
            yield Refusal(
                f"platforms.{name}.default_backend",
                f"{spec.default_backend} is not the backend vLLM's {fact.title} selector gives"
                f" these models: it picks {fact.default_backend} ({fact.selection})",
                f"write {fact.default_backend}; a backend a case wants is its"
                " knobs.attention_backend,",
            )


def _unknown_modules(matrix: Matrix) -> Iterator[Refusal]:
    """A module in `needs:` no known distribution provides would be missing everywhere:
    every cell of the model skipped on every column, passing the gate on its allowance."""
    for name, spec in matrix.models.items():
        for j, module in enumerate(spec.needs):
            if module in modules.KNOWN:
                continue
            close = modules.close_to(module)
            meant = f"; did you mean {' or '.join(close)}?" if close else ""
            yield Refusal(
                f"models.{name}.needs.{j}",
                f"{module!r} is no module kvrig knows a vLLM model to import{meant} (a name"
                f" no distribution provides would skip every cell of {name}, everywhere)",
                "fix the name, or add the module to kvrig.define.modules.KNOWN with the"
                " distribution that provides it,",
            )


def _mla(configs: Configs, model: str) -> bool:
    return vllm_models.mla(configs[model])


def _crafted_bases(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """A crafted backend is built on a stock one (a sibling's `base`, a replacement's
    `target`), and where crafted backends override a member (CPU, XPU) the replacement
    takes that member's place: one the platform never gives a layer of the model is a
    class the platform cannot run, or a replacement never used, so the cell runs vLLM's
    own backend and can pass without the one it exists to test."""
    for i, case in enumerate(matrix.cases):
        for field, base in _named_bases(i, case):
            for platform, expect in case.expect.items():
                if isinstance(expect, Skip):
                    continue
                stock = stock_backends(matrix, case, platform, _mla(configs, case.model))
                if base not in stock:
                    yield Refusal(
                        field,
                        f"on {platform} the crafted backend is built on {base}, which the"
                        f" {platform} platform never gives a layer of {case.model} (it gives"
                        f" {', '.join(sorted(stock))}), so the cell would not run it",
                        "name a backend the platform gives (or leave it out: the platform's own)",
                    )
                    break


def _named_bases(i: int, case: Case) -> list[tuple[str, str]]:
    """(field, backend) of each stock backend a case's crafted backends name."""
    crafted = case.crafted
    out = [(f"cases.{i}.crafted.replace.target", crafted.replace.target)] if crafted.replace else []
    out += [
        (f"cases.{i}.crafted.siblings.{j}.base", s.base) for j, s in enumerate(crafted.siblings)
    ]
    return [(field, base) for field, base in out if base]


def _knob_backends(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """An `attention_backend` knob a GPU platform's selector does not have for the model's
    layers stops the engine in vLLM's backend selection (the CPU ignores the knob; a
    refusal may be what a case expects)."""
    for i, case in enumerate(matrix.cases):
        knob = case.knobs.attention_backend
        for platform, expect in case.expect.items():
            if (
                knob is None
                or platform == "cpu"
                or not isinstance(expect, Runs | EarlyError | LateError)
            ):
                continue
            spec = matrix.platforms[platform]
            mla = _mla(configs, case.model)
            own = {
                n
                for n in {*PLATFORM_BACKENDS.get(platform, ()), spec.default_backend}
                if ("MLA" in n) == mla
            }
            if knob not in own:
                yield Refusal(
                    f"cases.{i}.knobs.attention_backend",
                    f"the {platform} platform's selector has no {knob} for the layers of"
                    f" {case.model} (it has {', '.join(sorted(own))}), so no {platform} engine"
                    " of the case starts",
                    "name one of them, or expect the refusal (unsupported)",
                )
                break


def _error_types(matrix: Matrix) -> Iterator[Refusal]:
    """An expected error type is compared with the record's by name: a misspelt one
    fails the cell whatever vLLM raises."""
    for i, case in enumerate(matrix.cases):
        for where, _, expect in expectations(i, case):
            if not isinstance(expect, LateError | Unsupported) or expect.error in EXCEPTIONS:
                continue
            close = difflib.get_close_matches(expect.error, EXCEPTIONS, n=1, cutoff=0.8)
            if close:
                yield Refusal(
                    f"{where}.error",
                    f"{expect.error!r} is no exception type (did you mean {close[0]}?), and the"
                    " record's error type is compared with it by name",
                    "fix the name",
                )


def _skip_layers(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """A layer index in kv_cache_dtype_skip_layers that is no attention layer keeps
    nothing at the model dtype: vLLM sizes one page where the rules size two."""
    for i, case in enumerate(matrix.cases):
        spec = matrix.models[case.model]
        layers = vllm_models.attention_layers(configs[case.model], spec.family)
        for j, entry in enumerate(case.knobs.kv_cache_dtype_skip_layers or []):
            if entry.strip().isdigit() and int(entry) not in layers:
                shown = ", ".join(str(k) for k in layers) or "none"
                yield Refusal(
                    f"cases.{i}.knobs.kv_cache_dtype_skip_layers.{j}",
                    f"layer {entry} is no attention layer of {case.model} (its attention"
                    f" layers: {shown}), so it keeps no KV cache at the model dtype",
                    "name an attention layer",
                )


# --- numbers out of range ---------------------------------------------------------------


def _configures(case: Case) -> bool:
    """Whether some cell of the case is expected to get past vLLM's configuration (a
    refusal of the configuration may be what a case is about)."""
    return any(isinstance(e, Runs | EarlyError | LateError) for e in case.expect.values())


def _tp_splits(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """vLLM refuses a --tp that does not divide the attention heads before any engine
    starts (ModelConfig.verify_with_parallel_config)."""
    for i, case in enumerate(matrix.cases):
        tp = case.knobs.tensor_parallel_size
        heads = vllm_models.text_config(configs[case.model]).get("num_attention_heads")
        if not tp or not isinstance(heads, int) or heads % tp == 0 or not _configures(case):
            continue
        yield Refusal(
            f"cases.{i}.knobs.tensor_parallel_size",
            f"{tp} ranks do not split the {heads} attention heads of {case.model}: vLLM"
            " refuses it before any engine starts (ModelConfig.verify_with_parallel_config)",
            f"pick a size that divides {heads}",
        )


def _lengths_fit(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """vLLM refuses a max_model_len past the config's max_position_embeddings (unless
    told to allow it), on every cell of the model that gets that far."""
    for name, spec in matrix.models.items():
        config = vllm_models.text_config(configs[name])
        longest = config.get("max_position_embeddings")
        if not isinstance(longest, int) or spec.max_model_len <= longest or _scaled(config):
            continue
        if not _checked_somewhere(matrix, name):
            continue
        overridden = "max_position_embeddings" in spec.overrides
        key = "overrides.max_position_embeddings" if overridden else "max_model_len"
        yield Refusal(
            f"models.{name}.{key}",
            f"max_model_len {spec.max_model_len} is past the config's max_position_embeddings"
            f" {longest}: vLLM refuses it before any engine starts (unless {LONG_MODEL_LEN}"
            " is set)",
            f"set a max_model_len of at most {longest}",
        )


def _scaled(config: dict[str, Any]) -> bool:
    """Whether RoPE scaling lengthens what vLLM derives from the positions (a `factor`,
    or a rope type other than the default)."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, dict) and (
            "factor" in rope or rope.get("rope_type", rope.get("type", "default")) != "default"
        ):
            return True
    return False


def _checked_somewhere(matrix: Matrix, model: str) -> bool:
    """Whether a cell of the model is configured on a platform that does not allow a long
    max_model_len."""
    return any(
        _configures(case) and LONG_MODEL_LEN not in matrix.platforms[p].env
        for case in matrix.cases
        if case.model == model
        for p in case.expect
    )


def _case_lengths_fit(matrix: Matrix, configs: Configs) -> Iterator[Refusal]:
    """A case's own max_model_len is held to the positions as a model's is."""
    for i, case in enumerate(matrix.cases):
        length = case.knobs.max_model_len
        config = vllm_models.text_config(configs[case.model])
        longest = config.get("max_position_embeddings")
        if length is None or not isinstance(longest, int) or length <= longest:
            continue
        if _scaled(config) or not _configures(case):
            continue
        if all(LONG_MODEL_LEN in matrix.platforms[p].env for p in case.expect):
            continue
        yield Refusal(
            f"cases.{i}.knobs.max_model_len",
            f"max_model_len {length} is past {case.model}'s max_position_embeddings"
            f" {longest}: vLLM refuses it before any engine starts (unless {LONG_MODEL_LEN}"
            " is set)",
            f"set a max_model_len of at most {longest}",
        )


def _prompts_fit(matrix: Matrix) -> Iterator[Refusal]:
    """A cell's prompt and the tokens it asks for must fit the model's length (the case's
    own where it sets one): the engine refuses a longer prompt, and generates fewer tokens
    than asked past it."""
    for i, case in enumerate(matrix.cases):
        room = case.knobs.max_model_len or matrix.models[case.model].max_model_len
        if case.prompt_tokens + case.max_tokens <= room or not _configures(case):
            continue
        key = "max_tokens" if "prompt_tokens" not in case.model_fields_set else "prompt_tokens"
        yield Refusal(
            f"cases.{i}.{key}",
            f"{case.prompt_tokens} prompt tokens and {case.max_tokens} to generate do not fit"
            f" the {room} tokens of {case.model}'s max_model_len",
            f"ask for at most {room} tokens in all",
        )


# --- patterns that prove nothing --------------------------------------------------------


def _weak_patterns(matrix: Matrix) -> Iterator[Refusal]:
    """A `match` must pin what the cell is about: a pattern also found in an unrelated
    error (running out of memory, another size's or another backend's block-size error)
    passes a cell that failed for that reason."""
    for i, case in enumerate(matrix.cases):
        for where, _, expect in expectations(i, case):
            if not isinstance(expect, LateError | Unsupported):
                continue
            why = _weakness(case, expect)
            if why is not None:
                yield Refusal(
                    f"{where}.match",
                    why,
                    "write vLLM's own words for what the cell is about (the size the error"
                    " names, the backends it names)",
                )


def _weakness(case: Case, expect: LateError | Unsupported) -> str | None:
    """Why the pattern would pass unrelated messages, or None."""
    pattern = expect.match
    own = patterns.own_characters(pattern)
    if own < patterns.MIN_OWN_CHARACTERS:
        return (
            f"{pattern!r} asks for {own} letter(s) or digit(s) of its own, which errors of"
            f" every kind hold (at least {patterns.MIN_OWN_CHARACTERS} are needed)"
        )
    hit = patterns.unrelated_match(pattern)
    if hit is not None:
        return f"{pattern!r} is also found in an error no cell is about ({hit!r})"
    if isinstance(expect, LateError) and expect.function == LATE_FUNCTION:
        for size in patterns.other_sizes(pattern):
            message = late_message(case, size)
            if patterns.found(pattern, message):
                return (
                    f"{pattern!r} does not pin the size the worker fails at: it is also found"
                    f" in {message!r} (write the size, as in 'No common block size for 128')"
                )
    return None


def late_message(case: Case, size: int) -> str:
    """vLLM's late error at `size` for the case's crafted backends beside a stock one:
    what a pattern naming only those backends would also be found in."""
    crafted = [*case.crafted.siblings, *([case.crafted.replace] if case.crafted.replace else [])]
    parts = ["FLASH_ATTN: [MultipleOf(16)]"] + [
        f"{b.name}: [{', '.join(str(size if s == 'aligned' else s) for s in b.sizes)}]"
        for b in crafted
    ]
    return f"No common block size for {size} ({'; '.join(parts)})."


# --- expectations that cannot be met ----------------------------------------------------


def _late_errors_after_sizing(matrix: Matrix) -> Iterator[Refusal]:
    """The early check raises before the KV cache is sized, and a late error is judged
    as one raised after it: a late error from that function fails whatever vLLM does."""
    for i, case in enumerate(matrix.cases):
        for where, _, expect in expectations(i, case):
            if isinstance(expect, LateError) and expect.function == EARLY_FUNCTION:
                yield Refusal(
                    f"{where}.function",
                    f"{EARLY_FUNCTION} raises before the KV cache is sized, and a late error"
                    " is one raised after it, so the cell would fail whatever vLLM does",
                    "expect an early_error for the alignment check, or name the function"
                    " that raises after sizing",
                )


def _early_errors_that_cannot_fire(matrix: Matrix) -> Iterator[Refusal]:
    """vLLM's early check looks at a size alignment moved, and alignment moves it only for
    a hybrid Mamba/GDN model, or (off the CPU) for a quantized KV cache beside skip
    layers: elsewhere an early error cannot come."""
    for i, case in enumerate(matrix.cases):
        family = matrix.models[case.model].family
        if family in HYBRID_FAMILIES:
            continue
        for where, platform, expect in expectations(i, case):
            mixed = bool(case.knobs.kv_cache_dtype_skip_layers) and platform != "cpu"
            if isinstance(expect, EarlyError) and not mixed:
                yield Refusal(
                    f"{where}.outcome",
                    f"{case.model} is a {family} model, and vLLM's early check fires only on a"
                    " size alignment moved (hybrid Mamba/GDN models; off the CPU, a quantized"
                    " KV cache beside kv_cache_dtype_skip_layers), so this early error cannot"
                    " come",
                    "expect what vLLM does without alignment (runs, with rejected_by for a"
                    " backend that rejects the size, or late_error)",
                )


def _refinements(case: Case, platform: str) -> list[tuple[str, Expectation]]:
    """A platform's expectation with the per-class or per-architecture ones beside it."""
    out = [(f"expect.{platform}", case.expect[platform])]
    if platform == "cpu":
        out += [(f"expect_by_isa.{c}", e) for c, e in case.expect_by_isa.items()]
    if platform in gpus.ARCH_KEYED:
        out += [
            (f"expect_by_arch.{k}.expect", a.expect)
            for k, a in case.expect_by_arch.items()
            if gpus.arch_platform(k) == platform
        ]
    return out


def _defects_that_differ(matrix: Matrix) -> Iterator[Refusal]:
    """A known defect must show something a record can show and the expectation does not:
    one equal to the expectation makes the cell fail whatever vLLM does, and a skip (as
    the defect, or as the expectation) is never judged against it."""
    for i, case in enumerate(matrix.cases):
        for platform, shows in (case.known_defect.shows if case.known_defect else {}).items():
            field = f"cases.{i}.known_defect.shows.{platform}"
            if isinstance(shows, Skip) or isinstance(case.expect.get(platform), Skip):
                yield Refusal(
                    field,
                    f"a skip is no record of vLLM: a known defect shown as one, or on a cell"
                    f" expected to skip ({platform}), is never what a cell is judged by",
                    "write what vLLM does wrong on a cell that runs, or remove it",
                )
                continue
            same = [w for w, e in _refinements(case, platform) if e == shows]
            if same:
                yield Refusal(
                    field,
                    f"it shows exactly what {same[0]} expects, so no record can tell the defect"
                    " from the fix and the cell fails whatever vLLM does",
                    "write what vLLM does wrong, or remove known_defect",
                )


def _measured_against_expectations(matrix: Matrix, facts: Facts) -> Iterator[Refusal]:
    """A `measured:` size is what vLLM did on a class, and the cell's expectation (or its
    known defect) what it must show there: when they disagree one of them is wrong, and
    only the shipped matrix's unit tests would have said so."""
    for i, case in enumerate(matrix.cases):
        fact = facts.get((case.model, case.id))
        if fact is None or fact.measured is None or "cpu" not in case.expect:
            continue
        for cls in isa.CLASSES:
            where, shown = _shown_on_class(case, cls)
            clash = _size_clash(fact.measured[cls], shown)
            if clash is not None:
                yield Refusal(
                    f"cases.{i}.measured",
                    f"`measured:` says vLLM {_chose(fact.measured[cls])} on {cls}, and"
                    f" {where} {clash}: one of the two is wrong",
                    f"write what vLLM does on {cls} in both (an expect_by_isa.{cls} where a"
                    " class differs)",
                    fact.lines.get("measured"),
                )
                break


def _shown_on_class(case: Case, cls: str) -> tuple[str, Expectation]:
    """What a CPU cell of the case must show on a class, and where that is written: a
    known defect's record where there is one (what released vLLM does), else the class's
    expectation."""
    defect = case.known_defect.shows.get("cpu") if case.known_defect else None
    if defect is not None:
        return "known_defect.shows.cpu", defect
    if cls in case.expect_by_isa:
        return f"expect_by_isa.{cls}", case.expect_by_isa[cls]
    return "expect.cpu", case.expect["cpu"]


def _chose(size: int | None) -> str:
    return f"chose block size {size}" if size is not None else "refuses the cell before a size"


_LATE_SIZE = re.compile(r"No common block size for (\d+)")


def _size_clash(size: int | None, shown: Expectation) -> str | None:
    """What the expectation says that a cell of this measured size (None: refused before
    one) cannot show, or None when they agree."""
    if isinstance(shown, Runs | EarlyError | LateError) and size is None:
        return f"expects it to reach a size ({shown.outcome})"
    if isinstance(shown, Runs):
        inv = shown.invariants
        if inv.block_size is not None and size != inv.block_size:
            return f"expects block size {inv.block_size}"
        if inv.block_size_in is not None and size not in inv.block_size_in:
            return f"expects a block size among {inv.block_size_in}"
    if isinstance(shown, LateError) and shown.function == LATE_FUNCTION:
        late = _LATE_SIZE.search(shown.match)
        if late is not None and size != int(late.group(1)):
            return f"expects the late error at {late.group(1)} ({shown.match!r})"
    return None


def _skips_the_gate_requires(matrix: Matrix) -> Iterator[Refusal]:
    """A required cell that only skips fails the release gate unless an allowance
    excuses its skip: a gate that can never pass."""
    excused = {a.cell for a in matrix.allowances if "skip" in a.excuses}
    for i, case in enumerate(matrix.cases):
        if not case.gate:
            continue
        for platform in matrix.required_platforms:
            expect = case.expect.get(platform)  # type: ignore[call-overload]
            if not isinstance(expect, Skip):
                continue
            for column in matrix.platform_columns(platform):
                cell = f"{column}-{case.model}-{case.id}"
                named = column_names.parse(column)
                arch = named.gpu_arch if named else None
                own = (by_arch(case, arch) if arch else None) or expect
                if cell in excused or not isinstance(own, Skip):
                    continue
                yield Refusal(
                    f"cases.{i}.expect.{platform}",
                    f"case {case.id!r} of {case.model} is gate: true and expects a skip on"
                    f" {platform}, and the release gate fails a skipped required cell that no"
                    f" allowance excuses ({cell})",
                    f"add an allowance for {cell} with excuses: [skip], or make the case"
                    " gate: false",
                )
                break


# --- allowances -------------------------------------------------------------------------


def _allowances(data: Any, matrix: Matrix) -> Iterator[Refusal]:
    """One allowance per cell, each for a cell the gate requires, excusing only what the
    cell can do."""
    first: dict[str, int] = {}
    for i, allowance in enumerate(matrix.allowances):
        if allowance.cell in first:
            j = first[allowance.cell]
            at = lines.line_of(data, ("allowances", j, "cell"))
            yield Refusal(
                f"allowances.{i}.cell",
                f"{allowance.cell} has an allowance already (allowances.{j}, line {at}), and"
                " the gate would read only one of them",
                "keep one allowance for the cell",
            )
        first.setdefault(allowance.cell, i)
        yield from _allowance_for_a_required_cell(matrix, i, allowance)


def _allowance_for_a_required_cell(
    matrix: Matrix, i: int, allowance: Allowance
) -> Iterator[Refusal]:
    column, model, case_id = allowance.cell.rsplit("-", 2)
    named = column_names.parse(column)
    case = next((c for c in matrix.cases if c.model == model and c.id == case_id), None)
    if named is None or case is None:
        return  # no cell of the matrix: refused with the schema
    if not case.gate or named.platform not in matrix.required_platforms:
        why = (
            f"case {case_id!r} of {model} is not gate: true"
            if not case.gate
            else f"the release gate reads no {named.platform} column (release.columns)"
        )
        yield Refusal(
            f"allowances.{i}.cell",
            f"{allowance.cell} is no cell the release gate requires ({why}), so the"
            " allowance would excuse nothing",
            "remove the allowance, or require the cell",
        )
        return
    yield from _impossible_excuses(matrix, i, allowance, case, named)


def _impossible_excuses(
    matrix: Matrix, i: int, allowance: Allowance, case: Case, named: column_names.Column
) -> Iterator[Refusal]:
    """An excuse written out must be one the cell can need: a skip where the cell can
    skip (its expectation there, or a module its model needs), a failure where it runs."""
    if "excuses" not in allowance.model_fields_set:
        return  # the default: whatever befalls the cell
    expects = _column_expectations(case, named)
    can = {
        "skip": bool(matrix.models[case.model].needs) or any(isinstance(e, Skip) for e in expects),
        "fail": any(not isinstance(e, Skip) for e in expects),
        "missing": True,
    }
    for what in allowance.excuses:
        if not can[what]:
            cannot = (
                "is never skipped (its case expects no skip there, and its model needs no module)"
                if what == "skip"
                else "is expected to skip there, and a skipped cell never fails"
            )
            yield Refusal(
                f"allowances.{i}.excuses",
                f"{allowance.cell} {cannot}, so excusing a {what} excuses nothing",
                "excuse only what the cell can do",
            )
            return


def _column_expectations(case: Case, named: column_names.Column) -> list[Expectation]:
    """What a cell of the case can be asked on a column: its class's or architecture's
    expectation, or on the host's own CPU column any class's."""
    plain = case.expect.get(named.platform)  # type: ignore[call-overload]
    if named.platform == "cpu" and named.isa:
        found = case.expect_by_isa.get(named.isa, plain)
        return [found] if found is not None else []
    if named.platform == "cpu":
        return [e for e in (plain, *case.expect_by_isa.values()) if e is not None]
    if named.gpu_arch:
        found = by_arch(case, named.gpu_arch) or plain
        return [found] if found is not None else []
    return [plain] if plain is not None else []
