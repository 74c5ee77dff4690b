"""Reading matrix.yaml: YAML that keeps each key's line, validated, checked against the
model configs it names, and refused in one paragraph that names the line.

A file that does not validate must stop the run before any engine starts, and the person
who wrote it must see where: so it is parsed keeping each mapping's keys' lines, a key
written twice refused (kvrig.define.lines.parse), and pydantic's errors are rewritten to
the file's own words. Parsed once per process and file version.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvrig.define import checks, config_checks, lines, shorthands
from kvrig.define.schema import ALLOWANCE_DAYS, Matrix, MatrixError, allowance_too_long


def default_matrix() -> Path:
    """KVRIG_MATRIX, else ./matrix.yaml, else the one of the checkout kvrig runs from (an
    editable install); an installed wheel ships none, so outside a checkout the file
    must be in the working folder or named."""
    env = os.environ.get("KVRIG_MATRIX")
    if env:
        return Path(env)
    here = Path.cwd() / "matrix.yaml"
    checkout = Path(__file__).resolve().parents[3] / "matrix.yaml"
    return here if here.is_file() or not checkout.is_file() else checkout


def _strip_lines(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _strip_lines(v) for k, v in data.items() if k != lines.LINES}
    if isinstance(data, list):
        return [_strip_lines(v) for v in data]
    return data


_TAGS = {"runs", "early_error", "late_error", "unsupported", "skip"}


# pydantic's names of a union's members ("constrained-int", "literal['aligned']"): a part
# of its error paths that is no key of the file.
_UNION_MEMBER = re.compile(r"^(constrained-\w+|literal\[.*\]|function-\w+\[.*\]|int|str|bool)$")


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drops pydantic's union-tag parts so the path reads like the YAML."""
    return tuple(
        p
        for p in loc
        if not isinstance(p, str) or not (_UNION_MEMBER.match(p) or (p in _TAGS and p != loc[-1]))
    )


# A cross-reference check names the field it is about at the start of its message; a key
# in it may hold dots and commas (an `expect_by_arch` key, "8.0, 8.9").
_NAMED_FIELD = re.compile(
    r"^((?:version|platforms|models|cases|allowances|release)(?:\.[^:]*?)?): "
)


def _named_field(
    data: Any, loc: tuple[Any, ...], field: str, msg: str, line: int | None
) -> tuple[str, str, int | None]:
    """(field, message, line) when the message names its own field (a cross-reference
    check's, at the top level; a check of a mapping's, about one of its keys): that
    field's line, and the field for the path when it is deeper than pydantic's."""
    named = _NAMED_FIELD.match(msg)
    if named is None:
        return field, msg, line
    own = named.group(1)
    deeper = not loc or own.startswith(f"{field}.")
    if line is None or deeper:
        line = lines.line_of(data, lines.split_field(data, own)) or line
    if deeper:
        field, msg = own, msg[named.end() :]
    return field, msg, line


def _explain(path: Path, data: Any, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = _clean_loc(tuple(first["loc"]))
    field = ".".join(str(p) for p in loc) or "(top level)"
    line = lines.line_of(data, loc)
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = f"unknown key {loc[-1]!r}; check its spelling against the format in docs/matrix.md"
    elif first["type"] == "missing":
        msg = f"required field {loc[-1]!r} is missing"
    elif first["type"] == "union_tag_invalid":
        msg = f"outcome must be one of {', '.join(sorted(_TAGS))}"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    field, msg, line = _named_field(data, loc, field, msg, line)
    # A top-level field has no line of its own when it is missing: the file's first line.
    where = f"{path}:{line or 1}"
    # One mistake a union reports once per member (a size: neither a number above 0 nor
    # `aligned`) is one problem.
    more = len({_clean_loc(tuple(e["loc"])) for e in err.errors()}) - 1
    extra = f" ({more} more problem{'s' if more > 1 else ''} after this one.)" if more else ""
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return (
        f"{where}: the matrix is invalid at {field}: {msg}{shown}. Nothing was run; fix the"
        f" file and start again.{extra}"
    )


def load(path: Path | str | None = None, today: dt.date | None = None) -> Matrix:
    """Reads and validates a matrix file, raising MatrixError with one readable paragraph.

    Parsed once per process and file version: a column run's CLI, pytest plugin and
    reports all ask for it, and the validated matrix is immutable. The allowances' expiry
    dates are checked against `today` (default: the date now) apart from that parse, so
    the cached matrix does not depend on the day it was first read."""
    path = Path(path) if path is not None else default_matrix()
    try:
        st = path.stat()
    except OSError as exc:
        raise MatrixError(
            f"{path}: cannot read the matrix file ({exc.strerror}). Pass an existing file"
            " with --matrix, or run from the kvrig checkout that holds matrix.yaml."
        ) from None
    matrix = _load(path, str(path.resolve()), st.st_mtime_ns, st.st_size)
    _check_allowance_life(path, matrix, today or dt.date.today())
    return matrix


def _check_allowance_life(path: Path, matrix: Matrix, today: dt.date) -> None:
    for i, allowance in enumerate(matrix.allowances):
        latest = allowance_too_long(allowance, today)
        if latest is None:
            continue
        line = matrix._allowance_lines.get(i)
        where = f"{path}:{line}" if line else str(path)
        raise MatrixError(
            f"{where}: the matrix is invalid at allowances.{i}.expires: the allowance for"
            f" {allowance.cell} runs until {allowance.expires}, and an allowance may run at"
            f" most {ALLOWANCE_DAYS} days ahead (until {latest}, from today, {today}), so"
            " that someone looks at the cell again to renew it. Nothing was run; set an"
            f" expiry on or before {latest} and start again."
        )


@functools.lru_cache(maxsize=16)
def _load(path: Path, resolved: str, mtime_ns: int, size: int) -> Matrix:
    parsed = _parsed(path, _text(path))
    data = _expanded(path, parsed)
    try:
        matrix = Matrix.model_validate(_strip_lines(data))
    except ValidationError as exc:
        raise MatrixError(_explain(path, data, exc)) from None
    configs = config_checks.check_model_configs(path, data, matrix)
    config_checks.check_sibling_layers(path, data, matrix, configs)
    config_checks.check_expected_backends(path, data, matrix, configs)
    checks.check(path, data, matrix, configs, shorthands.cpu_facts(parsed))
    matrix._path = path
    for i, case in enumerate(data.get("cases") or []):
        key_lines = case.get(lines.LINES, {}) if isinstance(case, dict) else {}
        if key_lines:  # its id's: a group's shared keys are written above it
            matrix._case_lines[i] = key_lines.get("id") or min(key_lines.values())
    for i, entry in enumerate(data.get("allowances") or []):
        key_lines = entry.get(lines.LINES, {}) if isinstance(entry, dict) else {}
        if key_lines:
            matrix._allowance_lines[i] = key_lines.get("expires") or min(key_lines.values())
    return matrix


def _text(path: Path) -> str:
    """The file as UTF-8 text, or one paragraph saying why it is not."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MatrixError(
            f"{path}: cannot read the matrix file ({exc.strerror}). Pass an existing file"
            " with --matrix, or run from the kvrig checkout that holds matrix.yaml."
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise MatrixError(
            f"{path}:{line}: the matrix is not UTF-8 text (byte {raw[exc.start]:#x}). Nothing"
            " was run; save the file as UTF-8 and start again."
        ) from None
    return text


def _parsed(path: Path, text: str) -> dict[str, Any]:
    """The YAML, every mapping keeping its keys' lines; one paragraph for what is not a
    matrix-shaped YAML mapping (a repeated key named at both its lines)."""
    try:
        data = lines.parse(text)
    except lines.RepeatedKey as exc:
        raise MatrixError(
            f"{path}:{exc.second}: the matrix repeats the key {exc.key!r} in one mapping (first"
            f" at line {exc.first}, again at line {exc.second}); YAML would keep only the"
            " second and drop the first without a word. Nothing was run; remove or rename"
            " one of them and start again."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        position = getattr(exc, "position", None)  # a character the reader refuses
        line = mark.line + 1 if mark is not None else text[: position or 0].count("\n") + 1
        where = f"{path}:{line}"
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc)
        raise MatrixError(
            f"{where}: the matrix is not valid YAML ({problem}). Nothing was run; fix the"
            " syntax and start again."
        ) from None
    if not isinstance(data, dict):
        raise MatrixError(
            f"{path}:1: the matrix must be a mapping with version, platforms, models and"
            " cases. Nothing was run."
        )
    return data


def _expanded(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The shorthands written out (kvrig.define.shorthands), a bad one at its line."""
    try:
        data = shorthands.expand(data)
    except shorthands.ShorthandError as exc:
        field = str(exc).split(": ", 1)[0]
        within = data if exc.cases is None else {"cases": exc.cases}
        line = lines.line_of(within, lines.split_field(within, field))
        where = f"{path}:{line}" if line else str(path)
        raise MatrixError(
            f"{where}: the matrix is invalid at {exc}. Nothing was run; fix the file and"
            " start again."
        ) from None
    return data
