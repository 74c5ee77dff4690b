"""vLLM's names as kvrig reaches for them: a name a release lacks is a fact, said once.

A release that removes or moves an internal kvrig imports would otherwise end every cell
with an AttributeError or ImportError that reads as vLLM's outcome. Reached for through
`need`, a missing name ends the cell with a `MissingVllmSymbol` naming it and the release,
which the verdict reads as "kvrig does not fit this release yet". `optional` is for a name
kvrig can do without. Nothing here imports vLLM until a name is asked for.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class MissingVllmSymbol(Exception):
    """A vLLM name kvrig reaches for that the installed release does not have.

    Deliberately not an ImportError or AttributeError: vLLM's own optional-import guards
    and `hasattr` would swallow those, and the missing name would surface later as
    something else."""

    def __init__(self, symbol: str, user: str, detail: str, release: str | None = None) -> None:
        self.symbol = symbol
        self.user = user
        self.detail = detail
        self.release = release if release is not None else vllm_release()
        super().__init__(
            f"{user} reaches for {symbol}, which vLLM {self.release} does not have: {detail}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # An engine process may hand it on pickled; the default would re-call __init__
        # with the message alone.
        return (type(self), (self.symbol, self.user, self.detail, self.release))


def vllm_release() -> str:
    """The imported vLLM's version (an overlay's, if one is in force), without importing
    vLLM if nothing has yet."""
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None) if module is not None else None
    if version:
        return str(version)
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _import(name: str) -> ModuleType | None:
    """The module, or None when that very module does not exist; a module that exists
    but fails inside (a missing dependency of vLLM's) raises as it is: that is not a name
    kvrig reached for."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            return None
        raise


def need(dotted: str, user: str) -> Any:
    """The object `dotted` names (`vllm.v1.worker.utils.prepare_kernel_block_sizes`):
    modules imported as far as they go, then attributes. Raises MissingVllmSymbol naming
    the full name, and the first part that is not there, when the release lacks it."""
    parts = dotted.split(".")
    obj: Any = _import(parts[0])
    if obj is None:
        raise MissingVllmSymbol(dotted, user, f"no module {parts[0]}")
    for i, part in enumerate(parts[1:], start=1):
        where = ".".join(parts[:i])
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        sub = _import(f"{where}.{part}") if isinstance(obj, ModuleType) else None
        if sub is None:
            raise MissingVllmSymbol(dotted, user, f"{_kind(obj)} {where} has no {part}")
        obj = sub
    return obj


def _kind(obj: Any) -> str:
    if isinstance(obj, ModuleType):
        return "module"
    return "class" if isinstance(obj, type) else type(obj).__name__


def need_attr(owner: Any, name: str, user: str) -> Any:
    """`owner.name` for an object kvrig already holds (a platform class, the config):
    missing, it is named by the owner's class path."""
    try:
        return getattr(owner, name)
    except AttributeError:
        cls = owner if isinstance(owner, type) else type(owner)
        where = f"{cls.__module__}.{cls.__qualname__}"
        detail = f"class {where} has no {name}"
        raise MissingVllmSymbol(f"{where}.{name}", user, detail) from None


def optional(dotted: str) -> Any | None:
    """The object `dotted` names, or None where the release does not have it: for what
    kvrig can do without (a layer class an older or newer layout lacks)."""
    try:
        return need(dotted, "kvrig")
    except MissingVllmSymbol:
        return None


def missing_in(exc: BaseException | None) -> MissingVllmSymbol | None:
    """The MissingVllmSymbol behind an exception, if vLLM re-raised one as its own (a
    `raise ... from`, or an error while handling it)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MissingVllmSymbol):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
