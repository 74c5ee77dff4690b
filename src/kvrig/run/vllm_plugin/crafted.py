"""Crafted attention backends: subclasses of a real backend that declare chosen sizes.

They keep the real kernels (so a `runs` cell really generates) and change only what the
block-size logic reads: `get_supported_kernel_block_sizes()`, and for exact-size ones
`supports_block_size()`, the method `_check_aligned_block_size` consults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvrig.run.vllm_plugin.symbols import need, optional

# Built classes, reachable as "kvrig.run.vllm_plugin.crafted.<NAME>" so vLLM can import them by
# path in any process (the spec travels in the environment, so every process rebuilds
# the same classes before it resolves a path).
_CLASSES: dict[str, type] = {}


@dataclass(frozen=True)
class BackendSpec:
    name: str
    sizes: tuple[int, ...]
    exact: bool
    base: str
    layers: str | None = None  # a layer-name prefix for siblings, None for a replacement


@dataclass(frozen=True)
class CraftSpec:
    """What one cell crafts; built from matrix.yaml by kvrig.run.cell, read here from env."""

    replace: BackendSpec | None = None
    siblings: tuple[BackendSpec, ...] = field(default_factory=tuple)
    route: str = "override"  # "override": re-register `replace.base`; "custom": use CUSTOM

    def to_json(self) -> str:
        def one(b: BackendSpec) -> dict[str, Any]:
            return {
                "name": b.name,
                "sizes": list(b.sizes),
                "exact": b.exact,
                "base": b.base,
                "layers": b.layers,
            }

        return json.dumps(
            {
                "replace": one(self.replace) if self.replace else None,
                "siblings": [one(s) for s in self.siblings],
                "route": self.route,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> CraftSpec:
        data = json.loads(text)

        def one(d: dict[str, Any]) -> BackendSpec:
            return BackendSpec(d["name"], tuple(d["sizes"]), d["exact"], d["base"], d["layers"])

        return cls(
            replace=one(data["replace"]) if data.get("replace") else None,
            siblings=tuple(one(s) for s in data.get("siblings", [])),
            route=data.get("route", "override"),
        )


USER = "kvrig's plugin (crafted backends)"
REGISTRY = "vllm.v1.attention.backends.registry"
# The class every attention backend derives from, whose block-size rule a plain crafted
# backend takes.
BACKEND_BASE = "vllm.v1.attention.backend.AttentionBackend"


def make_backend(base: type, spec: BackendSpec) -> type:
    """A subclass of `base` that names itself `spec.name` and declares `spec.sizes`."""
    sizes = list(spec.sizes)
    name = spec.name

    def get_name() -> str:
        return name

    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        return list(sizes)

    attrs: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"kvrig crafted backend {name}: sizes {sizes}, exact={spec.exact}",
        "get_name": staticmethod(get_name),
        "get_supported_kernel_block_sizes": staticmethod(get_supported_kernel_block_sizes),
    }
    if spec.exact:

        def supports_block_size(cls: type, block_size: int | None) -> bool:
            return block_size is None or block_size in sizes

        attrs["supports_block_size"] = classmethod(supports_block_size)
    else:
        attrs["supports_block_size"] = classmethod(_declared_sizes_rule())
    cls = type(name, (base,), attrs)
    _CLASSES[name] = cls
    return cls


def _declared_sizes_rule() -> Any:
    """vLLM's own reading of declared kernel sizes (AttentionBackend.supports_block_size:
    a size any declared one divides), for a plain crafted backend: its base may override
    the rule (TRITON_ATTN and ROCm's AITER unified attention accept any multiple of 16),
    which would make the crafted sizes say nothing. A release without the base rule is a
    missing symbol, named."""
    rule = need(f"{BACKEND_BASE}.supports_block_size", USER)
    return rule.__func__


def __getattr__(name: str) -> type:
    if name in _CLASSES:
        return _CLASSES[name]
    raise AttributeError(name)


def _backend(name: str) -> Any:
    """A member of vLLM's AttentionBackendEnum (a backend a crafted one builds on, or
    CUSTOM), named in full when the release has no such member."""
    return need(f"{REGISTRY}.AttentionBackendEnum.{name}", USER)


def install(craft: CraftSpec) -> None:
    backends = need(f"{REGISTRY}.AttentionBackendEnum", USER)
    register_backend = need(f"{REGISTRY}.register_backend", USER)

    def add_member(cls: type) -> None:
        # Attention.__init__ looks its backend up by get_name(), so the name must be a member.
        if cls.__name__ not in backends.__members__:
            register_backend(cls.__name__, f"{__name__}.{cls.__name__}")

    if craft.replace is not None:
        spec = craft.replace
        cls = make_backend(_backend(spec.base).get_class(), spec)
        add_member(cls)
        target = _backend("CUSTOM" if craft.route == "custom" else spec.base)
        register_backend(target, f"{__name__}.{cls.__name__}")

    if craft.siblings:
        siblings = []
        for spec in craft.siblings:
            cls = make_backend(_backend(spec.base).get_class(), spec)
            add_member(cls)
            siblings.append((spec.layers or "", cls))
        _route_layers(siblings)


def _route_layers(siblings: list[tuple[str, type]]) -> None:
    """Hands chosen layers their sibling backend through the layers' own attn_backend=."""
    layer_classes: list[type] = [
        need("vllm.model_executor.layers.attention.attention.Attention", USER)
    ]
    # MLA layers are their own class where the release has one.
    mla = optional("vllm.model_executor.layers.attention.mla_attention.MLAAttention")
    if mla is not None:
        layer_classes.append(mla)

    for layer_cls in layer_classes:
        layer_cls.__init__ = _with_siblings(layer_cls.__init__, siblings)  # type: ignore[method-assign]


def _with_siblings(original: Any, siblings: list[tuple[str, type]]) -> Any:
    """A layer the sibling's prefix names gets the sibling, where it would get what the
    selector picks (no attn_backend=) or the very backend the sibling is built over: some
    models name their layers' backend themselves (DeepSeek-V3.2's sparse MLA on ROCm is
    handed ROCM_AITER_MLA_SPARSE), and a sibling over it stands in for it there too."""

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        prefix = kwargs.get("prefix", "")
        given = kwargs.get("attn_backend")
        is_mla = any(c.__name__ == "MLAAttention" for c in type(self).__mro__)
        for layers, cls in siblings:
            over = given is None or issubclass(cls, given)
            if prefix.startswith(layers) and cls.is_mla() == is_mla and over:
                kwargs["attn_backend"] = cls
                break
        original(self, *args, **kwargs)

    return init
