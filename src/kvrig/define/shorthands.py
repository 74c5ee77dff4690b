"""matrix.yaml's shorthands (docs/matrix.md), expanded into the form the schema validates.

A matrix that writes each thing once reads faster and cannot drift. The shorthands are
expanded before validation, on the parsed file itself, so an error in an expanded case
still points at the line it is written on, and every cell is exactly what the long form
would give. A group's mapping of its own (`knobs`, `expect`, ...) adds its keys to the
shared one instead of replacing it, which would drop a shared knob without a word. A
case's `measured:` and `cpu_next:` (kvrig.define.measured) are no part of a cell, so they
are checked and taken out here.

Pure: parsed data in, parsed data out (nothing read or written).
"""

from __future__ import annotations

import copy
import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from kvrig.define import measured

LINES = "__lines__"  # the loader's record of each key's line (kvrig.define.lines)
# kvrig.define.case_spec.Invariants' fields (a unit test holds the two equal): the keys a
# running cell's short expectation may list.
INVARIANTS = frozenset(
    (
        "block_size",
        "block_size_in",
        "engine_block_size",
        "stage_block_sizes",
        "kernel_block_sizes_include",
        "kernel_block_sizes",
        "backends_include",
        "rejected_by",
    )
)
_SHORT = TypeAdapter(Literal["runs"] | Annotated[StrictInt, Field(gt=0)])
_PER_MODEL = TypeAdapter(dict[str, dict[str, Any] | None])
# Under a platform of a `models:` entry: the model has no cell there. A word, not `~`: a
# model's `~` means "the case's own expectations", and both can sit on one line.
NO_CELL = "no_cell"


class ShorthandError(ValueError):
    """A shorthand that cannot be expanded; its message names the field, as the schema's do.

    `cases`, when set, is the case list the field's index counts in (the groups written
    out), where the loader finds its line; else the index is the parsed file's."""

    cases: list[Any] | None = None


class _Group(BaseModel):
    """A group of cases in `cases:`: the keys its cases share, and the cases."""

    model_config = ConfigDict(extra="forbid")

    shared: dict[str, Any] = Field(min_length=1)
    cases: list[dict[str, Any]] = Field(min_length=1)


# What a group cannot share: each case names itself, and groups do not nest.
_UNSHARED = ("id", "shared", "cases")


def expand(data: dict[str, Any]) -> dict[str, Any]:
    """The matrix with every shorthand written out (a new object; `data` is not changed),
    the cases' CPU facts taken out: the form the schema validates."""
    out = _expanded(data)
    for case in out.get("cases") or []:
        if isinstance(case, dict):
            for key in measured.KEYS:
                case.pop(key, None)
                case.get(LINES, {}).pop(key, None)
    return out


def cpu_facts(data: dict[str, Any]) -> dict[tuple[str, str], measured.CpuFacts]:
    """(model, case id) -> what the cell's CPU cells were seen to do, for each expanded
    case on CPU that says (kvrig.define.measured); checked as `expand` checks them."""
    out = {}
    for case in _expanded(data).get("cases") or []:
        if not isinstance(case, dict) or not any(k in case for k in measured.KEYS):
            continue
        written = case.get(LINES, {})
        out[(case.get("model"), case.get("id"))] = measured.CpuFacts(
            measured=case.get("measured"),
            cpu_next=case.get("cpu_next"),
            lines={k: written[k] for k in measured.KEYS if k in written},
        )
    return out


def _expanded(data: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in data.items() if k not in ("presets", "reviews")}
    if LINES in data:
        out[LINES] = {k: v for k, v in data[LINES].items() if k not in ("presets", "reviews")}
    reviews = data.get("reviews") or {}
    if not isinstance(reviews, dict):
        raise ShorthandError("reviews: must be a mapping of names to review statements")
    cases = data.get("cases")
    if isinstance(cases, list):
        flat = [one for i, case in enumerate(cases) for one in _ungrouped(i, case)]
        try:
            out["cases"] = [
                expanded for i, case in enumerate(flat) for expanded in _case(i, case, reviews)
            ]
        except ShorthandError as exc:
            exc.cases = flat
            raise
    return out


def _ungrouped(index: int, item: Any) -> list[Any]:
    """A group's cases, each with the keys the group shares (its own lines kept, the
    shared keys' at the group); any other item as it is."""
    if not isinstance(item, dict) or "shared" not in item:
        return [item]
    plain = {k: v for k, v in item.items() if k != LINES}
    if isinstance(plain["shared"], dict):
        plain["shared"] = dict(_items(plain["shared"]))
    try:
        group = _Group.model_validate(plain)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][:2])
        raise ShorthandError(
            f"cases.{index}.{field}: a group of cases is `shared:` (a mapping of the keys its"
            " cases share, one or more) and `cases:` (a list of cases, one or more), nothing"
            f" else ({first['msg'].lower()})"
        ) from None
    bad = [k for k in _UNSHARED if k in group.shared]
    nested = [j for j, case in enumerate(group.cases) if "shared" in case]
    if bad or nested:
        field = f"shared.{bad[0]}" if bad else f"cases.{nested[0]}"
        raise ShorthandError(
            f"cases.{index}.{field}: a group shares neither a case's `id` nor another group;"
            " give each case its own id, and write groups one after another"
        )
    return [
        _with_shared(f"cases.{index}.cases.{k}", group.shared, item["shared"], case)
        for k, case in enumerate(item["cases"])
    ]


def _with_shared(
    where: str, shared: dict[str, Any], written: dict[str, Any], case: dict[str, Any]
) -> dict[str, Any]:
    """One grouped case with the keys its group shares (`shared`, as `written` with its
    lines): its own lines kept, the shared keys' at the group."""
    one = {**copy.deepcopy(shared), **case}
    for key in _MERGED:
        if isinstance(shared.get(key), dict) and isinstance(case.get(key), dict):
            one[key] = _merged(f"{where}.{key}", key, shared[key], case[key], written)
    one.pop(LINES, None)
    if LINES in case:
        one[LINES] = {**written.get(LINES, {}), **case[LINES]}
    if not _names_cpu(one.get("expect")):  # the group's CPU facts are its CPU cases'
        for key in measured.KEYS:
            if key not in case:
                one.pop(key, None)
    return one


def _names_cpu(expect: Any) -> bool:
    """Whether an `expect:` as written (platforms not yet split) has a cell on cpu."""
    return any("cpu" in _platform_names(key) for key, _ in _items(expect))


# The mappings a grouped case adds to the group's: one key each, read as the union.
_MERGED = ("knobs", "crafted", "expect", "expect_by_isa", "expect_by_arch", "known_defect")
# The mappings keyed by platform, whose keys may name several ("cuda, xpu").
_BY_PLATFORM = ("expect",)


def _merged(
    where: str, key: str, shared: dict[str, Any], own: dict[str, Any], group: dict[str, Any]
) -> dict[str, Any]:
    """A grouped case's mapping added to the group's; a key both write with different
    values is refused at the case's key (naming the group's line): which one a reader of
    the group takes for every case, and which one this case runs with, would differ."""
    keys = {sub: sub for sub, _ in _items(own)}
    if key in _BY_PLATFORM:
        keys = {p: k for k, _ in _items(own) for p in _platform_names(k)}
        shared, own = _platforms(where, shared), _platforms(where, own)
    written = own.get(LINES, {})
    for sub, value in _items(own):
        if sub in shared and _plain(shared[sub]) != _plain(value):
            at = shared.get(LINES, {}).get(sub) or group.get(LINES, {}).get(key)
            shown = keys.get(sub, sub)
            raise ShorthandError(
                f"{where}.{shown}: the group shares {key}.{sub}"
                f"{f' (line {at})' if at else ''} and this case sets it otherwise; write it in"
                " one place, `shared:` for every case of the group or each case's own"
            )
    out = {**copy.deepcopy(shared), **own}
    if LINES in shared or LINES in own:
        out[LINES] = {**shared.get(LINES, {}), **written}
    return out


def _plain(value: Any) -> Any:
    """A parsed value without the loader's line records, to compare what two say."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != LINES}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _case(index: int, case: Any, reviews: dict[str, Any]) -> list[Any]:
    if not isinstance(case, dict):
        return [case]
    case = copy.deepcopy(case)  # aliased anchors are shared objects: never edit them
    _written_out(index, case, reviews)
    _checked_facts(f"cases.{index}", case)
    out = _per_model(index, case) if "models" in case else [case]
    _facts_on_cpu(f"cases.{index}", case, out)
    return out


def _checked_facts(where: str, written: dict[str, Any]) -> None:
    """A case's (or a model's) `measured:` and `cpu_next:` in their checked form, in place;
    a bad one refused at its line, where a unit test would only say the cell disagrees."""
    try:
        if "measured" in written:
            written["measured"] = measured.sizes(f"{where}.measured", written["measured"])
        if "cpu_next" in written:
            written["cpu_next"] = measured.next_release(f"{where}.cpu_next", written["cpu_next"])
    except ValueError as exc:
        raise ShorthandError(str(exc)) from None


def _has_cpu(case: dict[str, Any]) -> bool:
    expect = case.get("expect")
    return isinstance(expect, dict) and "cpu" in expect


def _facts_on_cpu(where: str, case: dict[str, Any], out: list[Any]) -> None:
    """The case's CPU facts kept only on its models with a CPU cell; a case with none
    refused: facts about no cell would never be compared with anything."""
    written = [k for k in measured.KEYS if k in case]
    if written and not any(_has_cpu(one) for one in out):
        raise ShorthandError(
            f"{where}.{written[0]}: the case has no cell on cpu for its CPU facts to be"
            " about; give it an `expect:` on cpu, or remove them"
        )
    for one in out:
        if not _has_cpu(one):
            for key in measured.KEYS:
                one.pop(key, None)


def _written_out(index: int, case: dict[str, Any], reviews: dict[str, Any]) -> None:
    """The case's review quoted, its platform keys split and its short expectations
    written out, in place (on its own copy)."""
    where = f"cases.{index}"
    if isinstance(case.get("review"), str):
        case["review"] = _review(where, case["review"], reviews)
    if isinstance(case.get("expect"), dict):
        case["expect"] = _each(f"{where}.expect", _platforms(f"{where}.expect", case["expect"]))
    defect = case.get("known_defect")
    if isinstance(defect, dict) and isinstance(defect.get("shows"), dict):
        shows = _platforms(f"{where}.known_defect.shows", defect["shows"])
        defect["shows"] = _each(f"{where}.known_defect.shows", shows)
    if isinstance(case.get("expect_by_isa"), dict):
        case["expect_by_isa"] = _each(f"{where}.expect_by_isa", case["expect_by_isa"])
    for key, entry in _items(case.get("expect_by_arch")):
        if isinstance(entry, dict) and "expect" in entry:
            entry["expect"] = expectation(f"{where}.expect_by_arch.{key}.expect", entry["expect"])


# A review written as one snake_case word is a key of `reviews:`, or the one statement
# written so; a statement proper is words or a quote.
_REVIEW_KEY = re.compile(r"^[a-z0-9_]+$")
CONTROL = "control"


def _review(where: str, review: str, reviews: dict[str, Any]) -> Any:
    """The statement a case's `review` stands for: its entry of `reviews:`, or itself; a
    key that names no entry would be taken for the statement, and the case would stand
    for a misspelt word."""
    if review in reviews:
        return reviews[review]
    if _REVIEW_KEY.match(review) and review != CONTROL:
        keys = [str(k) for k in reviews if k != LINES]
        close = difflib.get_close_matches(review, keys, n=3, cutoff=0.6)
        meant = f" (did you mean {' or '.join(close)}?)" if close else ""
        known = ", ".join(keys) or "none"
        raise ShorthandError(
            f"{where}.review: {review!r} names no entry of `reviews:`{meant}; name one"
            f" ({known}), or write the statement itself (a quote, or {CONTROL})"
        )
    return review


def _items(mapping: Any) -> list[tuple[Any, Any]]:
    """A parsed mapping's entries without the loader's line record (none of a non-mapping)."""
    return [(k, v) for k, v in mapping.items() if k != LINES] if isinstance(mapping, dict) else []


def _each(where: str, mapping: dict[str, Any]) -> dict[str, Any]:
    """Every value of a mapping of expectations written out (the mapping itself, changed)."""
    for key, value in _items(mapping):
        mapping[key] = expectation(f"{where}.{key}", value)
    return mapping


def expectation(where: str, value: Any) -> Any:
    """One expectation in its long form: `runs`, a block size, or a mapping of invariants
    only, as the running cell they stand for; any other mapping as it is written (the
    schema judges it)."""
    if isinstance(value, dict):
        return value if "outcome" in value else _runs_with(where, value)
    if value == NO_CELL:
        raise ShorthandError(
            f"{where}: `{NO_CELL}` takes a platform off one model of a `models:` entry; here"
            " leave the platform out, and the case has no cell there"
        )
    try:
        short = _SHORT.validate_python(value)
    except ValidationError:
        raise ShorthandError(
            f"{where}: {value!r} is no expectation; write `runs`, the block size a running"
            " cell must choose (a whole number of at least 1), a mapping of its invariants,"
            " or a mapping with an `outcome` (docs/matrix.md)"
        ) from None
    return {"outcome": "runs"} if short == "runs" else _runs_with(where, {"block_size": short})


def _runs_with(where: str, invariants: dict[str, Any]) -> dict[str, Any]:
    """`{outcome: runs, invariants: <invariants>}`, the invariants at the line they are on."""
    keys = [k for k, _ in _items(invariants)]
    unknown = sorted(str(k) for k in keys if k not in INVARIANTS)
    if unknown or not keys:
        what = f"{', '.join(unknown)} is none" if unknown else "it lists none"
        raise ShorthandError(
            f"{where}: an expectation without `outcome` stands for a running cell and lists"
            f" its invariants ({', '.join(sorted(INVARIANTS))}); {what}. Give it an"
            " `outcome` (early_error, late_error, unsupported, skip) or list invariants only"
        )
    out: dict[str, Any] = {"outcome": "runs", "invariants": invariants}
    if LINES in invariants:
        out[LINES] = {"invariants": min(invariants[LINES].values(), default=None)}
    return out


def _per_model(index: int, case: dict[str, Any]) -> list[dict[str, Any]]:
    """One case per model of `models:`, each pointing at the line its model is named on."""
    names = case.pop("models")
    if "model" in case:
        raise ShorthandError(f"cases.{index}.models: a case names `model` or `models`, not both")
    lines = case.get(LINES, {})
    if isinstance(names, dict):
        differs = _differences(index, names)
        where = names.get(LINES, {})
        names = list(differs)
    else:
        differs, where = {}, {}
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ShorthandError(f"cases.{index}.models: must be a list of model names, one or more")
    if len(set(names)) != len(names):
        raise ShorthandError(f"cases.{index}.models: a model is named twice: {names}")
    out = []
    for name in names:
        one = copy.deepcopy(case)
        one["model"] = name
        if LINES in one and (name in where or "models" in lines):
            one[LINES] = {**one[LINES], "model": where.get(name) or lines["models"]}
        own = differs.get(name) or {}
        facts = {k: own.pop(k) for k in measured.KEYS if k in own}  # they name no platform
        _differ(f"cases.{index}.models.{name}", one, own)
        _own_facts(f"cases.{index}.models.{name}", one, facts, own.get(LINES, {}))
        out.append(one)
    return out


def _own_facts(
    where: str, case: dict[str, Any], facts: dict[str, Any], written: dict[str, Any]
) -> None:
    """A model's own `measured:` and `cpu_next:` (from its `models:` entry) in place of
    the case's, at the entry's lines; refused on a model with no cell on cpu."""
    if not facts:
        return
    _checked_facts(where, facts)
    if not _has_cpu(case):
        raise ShorthandError(
            f"{where}.{next(iter(facts))}: this model has no cell on cpu, so its CPU facts"
            " are about no cell; remove them"
        )
    case.update(facts)
    if LINES in case:
        case[LINES] = {**case[LINES], **{k: written[k] for k in facts if k in written}}


def _differences(index: int, names: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """`models:` as a mapping: each model's expectations where it differs from the case's."""
    plain = {k: v for k, v in names.items() if k != LINES}
    try:
        differs = _PER_MODEL.validate_python(plain)
    except ValidationError as exc:
        bad = ".".join(str(p) for p in exc.errors()[0]["loc"][:1])
        raise ShorthandError(
            f"cases.{index}.models.{bad}: a model of `models:` written as a mapping takes the"
            " expectations where it differs from the case's, by platform ({cuda: 144, xpu:"
            f" {NO_CELL}}}), or `~` for none (the case's own)"
        ) from None
    if not differs:
        raise ShorthandError(f"cases.{index}.models: must name one model or more")
    return {name: copy.deepcopy(names[name]) for name in differs}


def _differ(where: str, case: dict[str, Any], differs: dict[str, Any]) -> None:
    """One model's differences put into its case's expectations: another expectation, or
    no cell on a platform (NO_CELL); only on platforms the case has a cell on."""
    if not _items(differs):
        return
    expect = case.get("expect")
    if not isinstance(expect, dict):
        raise ShorthandError(f"{where}: the case has no `expect:` for this model to differ from")
    _refuse_null_platforms(where, differs)
    split = _platforms(where, differs)
    for platform, value in _items(split):
        if platform not in expect:
            raise ShorthandError(
                f"{where}.{platform}: the case expects nothing on {platform!r} for this model"
                f" to differ from; add it to the case's `expect:` (and `{NO_CELL}` for the"
                " models without a cell there)"
            )
        if value == NO_CELL:
            del expect[platform]
            continue
        expect[platform] = expectation(f"{where}.{platform}", value)
        if LINES in expect and platform in split.get(LINES, {}):
            expect[LINES] = {**expect[LINES], platform: split[LINES][platform]}
    if not _items(expect):
        raise ShorthandError(f"{where}: leaves the model no expectation on any platform")


def _refuse_null_platforms(where: str, differs: dict[str, Any]) -> None:
    """`~` under a platform of a `models:` entry is refused at its line: beside a model it
    means "the case's own", so under a platform it read as either that or "no cell"."""
    for key, value in _items(differs):
        if value is None:
            names = " and ".join(str(p) for p in _platform_names(key))
            raise ShorthandError(
                f"{where}.{key}: `~` under a platform is read two ways (beside a model it"
                f" means the case's own expectations); write `{NO_CELL}` for no cell on"
                f" {names} for this model, or the expectation it has there"
            )


def _platforms(where: str, mapping: dict[str, Any]) -> dict[str, Any]:
    """`{"cuda, xpu": e}` as `{"cuda": e, "xpu": e}`, each platform once."""
    out: dict[str, Any] = {}
    lines = mapping.get(LINES, {})
    out_lines: dict[str, Any] = {}
    for key, value in mapping.items():
        if key == LINES:
            continue
        for name in _platform_names(key):
            if not name:
                raise ShorthandError(f"{where}.{key}: an empty platform name")
            if name in out:
                raise ShorthandError(f"{where}.{key}: platform {name!r} is given twice")
            out[name] = copy.deepcopy(value)
            if key in lines:
                out_lines[name] = lines[key]
    if LINES in mapping:
        out[LINES] = out_lines
    return out


def _platform_names(key: Any) -> list[Any]:
    """The platforms a key names: "cuda, xpu" both."""
    return [p.strip() for p in key.split(",")] if isinstance(key, str) else [key]
