"""One mistake a matrix makes that loading refuses: where it is, what is wrong, what to do.

Shared by the load-time checks (kvrig.define.checks, kvrig.define.knob_checks), so every
refusal reads the same way at its line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """One mistake: the field it is at (a dotted path, as every refusal names it), what
    is wrong and what to do."""

    field: str
    what: str
    fix: str
    # Where the field is not in the parsed data (a case's `measured:`, taken out
    # before validation): its line as written.
    line: int | None = None
