"""matrix.yaml's shorthands, expanded into the plain form the schema validates.

A matrix that writes each thing once reads faster and cannot drift: a case that stands
for several models, one expectation for several platforms, a review statement quoted once.
They are expanded before validation, on the parsed file itself (every mapping keeps the
line each of its keys came from), so an error in an expanded case still points at the
line it is written on, and every cell is exactly what the long form would give:

- `models: [a, b]` in a case: one case per model, in that order (cell ids unchanged);
- an `expect:` (or `known_defect.shows:`) key naming several platforms, "cuda, xpu":
  the same expectation for each;
- `review: <key>` naming an entry of the top-level `reviews:` table: that statement;
- the top-level `presets:` holds YAML anchors only (crafted backends, knob sets,
  expectations the cases alias); it is dropped before validation.

Pure: parsed data in, parsed data out (nothing read or written).
"""

from __future__ import annotations

import copy
from typing import Any

LINES = "__lines__"  # the loader's record of each key's line (kvrig.define.matrix)


class ShorthandError(ValueError):
    """A shorthand that cannot be expanded; its message names the field, as the schema's do."""


def expand(data: dict[str, Any]) -> dict[str, Any]:
    """The matrix with every shorthand written out (a new object; `data` is not changed)."""
    out = {k: v for k, v in data.items() if k not in ("presets", "reviews")}
    if LINES in data:
        out[LINES] = {k: v for k, v in data[LINES].items() if k not in ("presets", "reviews")}
    reviews = data.get("reviews") or {}
    if not isinstance(reviews, dict):
        raise ShorthandError("reviews: must be a mapping of names to review statements")
    cases = data.get("cases")
    if isinstance(cases, list):
        out["cases"] = [
            expanded for i, case in enumerate(cases) for expanded in _case(i, case, reviews)
        ]
    return out


def _case(index: int, case: Any, reviews: dict[str, Any]) -> list[Any]:
    if not isinstance(case, dict):
        return [case]
    case = copy.deepcopy(case)  # aliased anchors are shared objects: never edit them
    _written_out(index, case, reviews)
    return _per_model(index, case) if "models" in case else [case]


def _written_out(index: int, case: dict[str, Any], reviews: dict[str, Any]) -> None:
    """The case's review quoted and its platform keys split, in place (on its own copy)."""
    if isinstance(case.get("review"), str) and case["review"] in reviews:
        case["review"] = reviews[case["review"]]
    if isinstance(case.get("expect"), dict):
        case["expect"] = _platforms(f"cases.{index}.expect", case["expect"])
    defect = case.get("known_defect")
    if isinstance(defect, dict) and isinstance(defect.get("shows"), dict):
        defect["shows"] = _platforms(f"cases.{index}.known_defect.shows", defect["shows"])


def _per_model(index: int, case: dict[str, Any]) -> list[dict[str, Any]]:
    """One case per model of `models:`, each pointing at the line the list is on."""
    names = case.pop("models")
    lines = case.get(LINES, {})
    if "model" in case:
        raise ShorthandError(f"cases.{index}.models: a case names `model` or `models`, not both")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ShorthandError(f"cases.{index}.models: must be a list of model names, one or more")
    if len(set(names)) != len(names):
        raise ShorthandError(f"cases.{index}.models: a model is named twice: {names}")
    out = []
    for name in names:
        one = copy.deepcopy(case)
        one["model"] = name
        if LINES in one and "models" in lines:
            one[LINES] = {**one[LINES], "model": lines["models"]}
        out.append(one)
    return out


def _platforms(where: str, mapping: dict[str, Any]) -> dict[str, Any]:
    """`{"cuda, xpu": e}` as `{"cuda": e, "xpu": e}`, each platform once."""
    out: dict[str, Any] = {}
    lines = mapping.get(LINES, {})
    out_lines: dict[str, Any] = {}
    for key, value in mapping.items():
        if key == LINES:
            continue
        names = [p.strip() for p in str(key).split(",")] if isinstance(key, str) else [key]
        for name in names:
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
