"""kvrig's table of backend kernel block sizes, held against what vLLM itself answers.

The predictor and the verdicts restate each backend's get_supported_kernel_block_sizes();
a release that changes one (FLASH_ATTN's MultipleOf(16), say) would otherwise silently
change every GPU prediction. kvrig.run.backend_answers asks vLLM where it imports; this
module compares the answers with the table and says which backends could not be read.

Pure: vLLM's answers (as JSON-able values) in, a list of findings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvrig.rules import rocm, versions
from kvrig.rules.blocksize import RULES, Kernel
from kvrig.rules.predict import BACKENDS


def table(platform: str) -> dict[str, tuple[Kernel, ...]]:
    """Every backend kvrig restates for a platform, with its declared kernel sizes."""
    out = {name: b.kernels for name, b in BACKENDS.get(platform, {}).items()}
    rules = RULES.get(platform)
    if platform == "rocm":  # its MLA and indexer sizes are the same on every gfx target
        rules = rocm.platform_rules(rocm.DEFAULT_ARCH, versions.rules("rocm", versions.NEWEST))
    for extra in (rules.mla, rules.indexer) if rules else ():
        if extra is not None:
            out.setdefault(extra.name, extra.kernels)
    return out


def parse(answer: list[Any]) -> tuple[Kernel, ...]:
    """An answer as the script writes it: ints, and {"multiple_of": base} for MultipleOf."""
    kernels = []
    for item in answer:
        if isinstance(item, Mapping):
            kernels.append(Kernel(int(item["multiple_of"]), True))
        else:
            kernels.append(Kernel(int(item)))
    return tuple(kernels)


def shown(kernels: tuple[Kernel, ...]) -> str:
    return (
        "["
        + ", ".join(f"MultipleOf({k.size})" if k.multiple else str(k.size) for k in kernels)
        + "]"
    )


@dataclass(frozen=True)
class Finding:
    backend: str
    status: str  # "agrees", "differs", "unreadable", "not restated", "not asked"
    detail: str

    @property
    def line(self) -> str:
        return f"{self.status:<13} {self.backend}: {self.detail}"


def compare(platform: str, answers: Mapping[str, Any]) -> list[Finding]:
    """Each backend vLLM was asked about: whether kvrig's table agrees, or why vLLM could
    not answer (`{"error": "..."}`), and the ones kvrig has but vLLM does not list."""
    mine = table(platform)
    found: list[Finding] = []
    for name in sorted(answers):
        answer = answers[name]
        if isinstance(answer, Mapping) and "error" in answer:
            found.append(Finding(name, "unreadable", str(answer["error"])))
            continue
        theirs = parse(answer)
        if name not in mine:
            found.append(Finding(name, "not restated", f"vLLM declares {shown(theirs)}"))
        elif set(theirs) == set(mine[name]):
            found.append(Finding(name, "agrees", shown(theirs)))
        else:
            found.append(
                Finding(name, "differs", f"vLLM {shown(theirs)}, kvrig {shown(mine[name])}")
            )
    for name in sorted(set(mine) - set(answers)):
        # e.g. DEEPSEEK_V32_INDEXER: a layer's own cache backend, not selectable by name.
        found.append(Finding(name, "not asked", "not an AttentionBackendEnum member"))
    return found


_MULTIPLE = re.compile(r"^MultipleOf\((\d+)\)$")


def parse_declared(sizes: list[str]) -> tuple[Kernel, ...] | None:
    """Sizes as a record keeps them (str() of vLLM's answer: "64", "MultipleOf(16)"), or
    None when one reads as neither."""
    kernels = []
    for text in sizes:
        m = _MULTIPLE.match(text.strip())
        if m:
            kernels.append(Kernel(int(m.group(1)), True))
        elif text.strip().isdigit():
            kernels.append(Kernel(int(text)))
        else:
            return None
    return tuple(kernels)


def disagreements(platform: str, declared: Mapping[str, list[str]]) -> list[str]:
    """The backends an engine declared other kernel sizes for than kvrig's table holds,
    each naming both: a cell's record held to the table every prediction uses."""
    mine = table(platform)
    out = []
    for name, sizes in sorted(declared.items()):
        if name not in mine:
            continue  # a crafted backend, or one kvrig does not restate
        theirs = parse_declared(list(sizes))
        if theirs is None or set(theirs) != set(mine[name]):
            out.append(f"{name}: vLLM declares {sizes}, kvrig's table {shown(mine[name])}")
    return out


def failed(findings: list[Finding]) -> list[Finding]:
    """What fails the check: a backend whose declared sizes differ from kvrig's table. One
    that vLLM could not answer for here is said (with why), not failed: the table is then
    unchecked for it, which the printed findings show."""
    return [f for f in findings if f.status == "differs"]


def unchecked(findings: list[Finding], platform: str) -> list[Finding]:
    """The backends of kvrig's table that this run could not check."""
    mine = table(platform)
    return [f for f in findings if f.backend in mine and f.status in ("unreadable", "not asked")]
