"""The `match:` patterns of error expectations, read the way a maintainer means them.

A pattern names the sizes in vLLM's message ("No common block size for 128"), and a size
written in it means that number, not any number it is part of: with plain `re.search`,
"for 28" is found in "for 128" and "28 is" in "1280 is", so a cell whose engine failed at
another size would pass. And a pattern with nothing to find ('', '.*') passes every
message. So the literal digits of a pattern are matched as whole numbers, and a pattern
that asks for no letter or digit of its own is refused when the matrix loads.

Pure: a pattern in, a pattern (or a fact about it) out.
"""

from __future__ import annotations

import re

# Escapes after which a digit may follow in the message: a digit of the pattern's own
# next to one of these is not a number of its own ("\d28": any digit, then 28).
_DIGIT_ESCAPES = frozenset("dwS")
_QUANTIFIER = re.compile(r"\{\d*,?\d*\}|[*+?]")
_BEFORE = "(?<![0-9])"
_AFTER = "(?![0-9])"


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """The pattern cut into (kind, text): "digit" and "alnum" for literal characters,
    "digits?" for what may match a digit (a class, \\d, a backreference), "quant" for a
    quantifier, "paren" for a group's parentheses, and "other" for the rest, each text
    verbatim."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        kind, text = _token_at(pattern, i)
        out.append((kind, text))
        i += len(text)
    return out


def _token_at(pattern: str, i: int) -> tuple[str, str]:
    """The token that starts at `i` (its text is never empty, so the cutting moves on)."""
    c = pattern[i]
    if c == "\\" and i + 1 < len(pattern):
        return _escape_at(pattern, i)
    if c == "[":
        return "digits?", _class_at(pattern, i)
    if c == "(" and pattern.startswith("(?", i):
        return _group_opening_at(pattern, i)
    if c in "()":
        return "paren", c
    quant = _QUANTIFIER.match(pattern, i)
    if quant and quant.group() != "{}":
        return "quant", quant.group()
    return ("digit" if c.isdigit() else "alnum" if c.isalnum() else "other"), c


def _escape_at(pattern: str, i: int) -> tuple[str, str]:
    """A backslash and what it escapes: a backreference or an octal escape takes up to
    three digits, a character code its hex digits or its {name}."""
    n, nxt = len(pattern), pattern[i + 1]
    if nxt.isdigit():  # a backreference or an octal escape
        end = i + 2
        while end < n and end < i + 4 and pattern[end].isdigit():
            end += 1
        return "digits?", pattern[i:end]
    width = {"x": 2, "u": 4, "U": 8}.get(nxt, 0)
    if nxt == "N" and i + 2 < n and pattern[i + 2] == "{":
        width = pattern.find("}", i + 2) - i - 1
    text = pattern[i : i + 2 + max(width, 0)]
    return ("digits?" if nxt in _DIGIT_ESCAPES else "other"), text


def _class_at(pattern: str, i: int) -> str:
    """A character class, to its closing bracket: a `]` right after `[` or `[^` is one of
    its characters, and an escaped one does not close it."""
    n, end = len(pattern), i + 1
    if end < n and pattern[end] == "^":
        end += 1
    if end < n and pattern[end] == "]":
        end += 1
    while end < n and pattern[end] != "]":
        end += 2 if pattern[end] == "\\" else 1
    return pattern[i : end + 1]


def _group_opening_at(pattern: str, i: int) -> tuple[str, str]:
    """A `(?...` construct's opening: a named backreference may match a digit, a group's
    opening is a parenthesis, and the rest matches nothing of its own."""
    text = pattern[i : _group_start_end(pattern, i)]
    if text.startswith("(?P="):
        return "digits?", text
    if text.endswith((":", ">")) and not text.startswith(("(?<", "(?>")):
        return "paren", text  # a group's opening: (?:, (?P<name>, (?i:
    return "other", text  # a lookaround, a comment, a condition, global flags


def _group_start_end(pattern: str, i: int) -> int:
    """Where the opening of a `(?...` construct ends: a name or a condition is part of
    it, and a comment or a named backreference runs to its closing parenthesis."""
    for opening, closer in (("(?P<", ">"), ("(?P=", ")"), ("(?#", ")"), ("(?(", ")")):
        if pattern.startswith(opening, i):
            end = pattern.find(closer, i + len(opening))
            return len(pattern) if end < 0 else end + 1
    if pattern.startswith(("(?<=", "(?<!"), i):
        return i + 4
    flags = re.compile(r"\(\?[aiLmsux-]*[:)]").match(pattern, i)
    if flags and len(flags.group()) > 3:
        return flags.end()
    return i + 3


def whole_numbers(pattern: str) -> str:
    """The pattern with each run of literal digits matched as a whole number: neither
    preceded nor followed by another digit, unless the pattern itself puts something
    that matches a digit there."""
    tokens = _tokens(pattern)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind != "digit":
            out.append(text)
            i += 1
            continue
        end = i
        while end < len(tokens) and tokens[end][0] == "digit":
            end += 1
        while end < len(tokens) and tokens[end][0] == "quant":
            end += 1
        run = "".join(t for _, t in tokens[i:end])
        before = _next_to_digits(tokens, i - 1, -1)
        after = _next_to_digits(tokens, end, 1)
        out.append(("" if before else _BEFORE) + run + ("" if after else _AFTER))
        i = end
    return "".join(out)


def _next_to_digits(tokens: list[tuple[str, str]], at: int, step: int) -> bool:
    """Whether what the pattern puts next to a run of digits, past quantifiers and group
    parentheses, may match a digit itself: "\\d+28" asks for digits before the 28, and
    "(?:12)8" is the number 128."""
    while 0 <= at < len(tokens) and tokens[at][0] in ("quant", "paren"):
        at += step
    return 0 <= at < len(tokens) and tokens[at][0] in ("digit", "digits?")


def names_something(pattern: str) -> bool:
    """Whether the pattern asks for a letter or a digit of its own: one that does not
    ('', '.*', '\\w+') matches the message of any error."""
    return any(kind in ("digit", "alnum") for kind, _ in _tokens(pattern))
