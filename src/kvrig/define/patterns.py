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


def found(pattern: str, message: str) -> bool:
    """The pattern found in the message, its numbers matched whole (as the verdict does)."""
    return re.search(whole_numbers(pattern), message) is not None


def own_characters(pattern: str) -> int:
    """How many letters and digits the pattern asks for of its own."""
    return sum(1 for kind, _ in _tokens(pattern) if kind in ("digit", "alnum"))


# Fewer letters and digits of its own than this, and a pattern is found in messages of
# every kind ("e", "size", "for 1"): the words of vLLM's message are needed.
MIN_OWN_CHARACTERS = 8
# Messages of vLLM runs that are about nothing a cell expects: running out of memory, an
# engine or a worker dying, a module or a device missing, and the block-size errors at a
# size (4099, no backend's) and for a backend (KVRIG_OTHER) no cell is about. A pattern
# found in one of them passes a cell that failed for that reason. (A refusal a case may
# be about, of a --tp or a max_model_len, is not among them.)
UNRELATED = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
    " of which 1.12 GiB is free. Of the allocated memory 76.50 GiB is allocated by PyTorch.",
    "XPU out of memory. Tried to allocate 512.00 MiB (GPU 0; 24.00 GiB total capacity).",
    "CUDA error: an illegal memory access was encountered",
    "To serve at least one request with the models's max seq len (4096), (2.00 GiB KV cache"
    " is needed, which is larger than the available KV cache memory (1.00 GiB). Based on the"
    " available memory, the estimated maximum model length is 2048. Try increasing"
    " `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when"
    " initializing the engine.",
    "Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "Worker failed with error 'timed out', please check the stack trace above for the root cause",
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you"
    " must use the 'spawn' start method",
    "No module named 'torchvision'",
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0"
    " and cpu!",
    "No common block size for 4099 (FLASH_ATTN: [MultipleOf(16)]; KVRIG_OTHER: [4099]).",
    "Aligned KV cache block size 4099 is not supported by attention backend(s): KVRIG_OTHER.",
    "The attention backends share no supported KV cache block size (FLASH_ATTN:"
    " [MultipleOf(16)]; KVRIG_OTHER: [4099]).",
)


def unrelated_match(pattern: str) -> str | None:
    """The first unrelated message the pattern is found in, or None."""
    return next((m for m in UNRELATED if found(pattern, m)), None)


def numbers(pattern: str) -> list[int]:
    """The whole numbers the pattern writes out ("for 128": [128])."""
    runs, current = [], ""
    for kind, text in _tokens(pattern):
        if kind == "digit":
            current += text
            continue
        if current:
            runs.append(int(current))
        current = ""
    return runs + ([int(current)] if current else [])


def other_sizes(pattern: str) -> list[int]:
    """Sizes a message could name that the pattern does not mean: beside each number it
    writes, that number with a digit more, and one more; and 4096 (or what is not among
    them): a pattern that pins one size is found at none of them."""
    own = numbers(pattern)
    near = {n * 10 for n in own} | {n + 1 for n in own} | {n // 10 for n in own if n >= 10}
    far = next(n for n in (4096, 4097, 8192) if n not in own)
    return sorted((near | {far}) - set(own))
