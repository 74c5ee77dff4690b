"""What a matrix asks of its models' config files, refused at load at the line it is on.

Every model's config must be one kvrig can read and its family's rules apply to; every
sibling must reach an attention layer of its model the way kvrig's plugin routes it; and
every backend an expectation names must be one its cell's layers can have. Each mistake
would otherwise show only once engines ran, as a red cell, or never. They need the
configs read, so they run after the schema, in kvrig.define.loader; a matrix built in
code (a unit test's) is not held to them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvrig.define import lines, models, vllm_models
from kvrig.define.case_spec import Case, EarlyError, Runs, expectations
from kvrig.define.schema import Matrix, MatrixError
from kvrig.define.vllm_names import (
    FAMILY_BACKENDS,
    KNOWN_BACKENDS,
    LAYER_BACKENDS,
    PLATFORM_BACKENDS,
)


def stock_backends(matrix: Matrix, case: Case, platform: str, mla: bool | None = None) -> set[str]:
    """The stock backends a cell's layers can have: the platform's default, the case's
    knob, what the platform's selector can pick, and the family's own; of the attention
    backends only MLA ones on MLA layers and no MLA one elsewhere (`mla`, when known):
    vLLM's selector keeps the two apart."""
    spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
    model = matrix.models.get(case.model)
    names = {case.knobs.attention_backend, spec.default_backend if spec else None}
    attention = {n for n in names if n} | PLATFORM_BACKENDS.get(platform, frozenset())
    if mla is not None:
        attention = {n for n in attention if ("MLA" in n) == mla}
    return attention | FAMILY_BACKENDS.get(model.family if model else "", frozenset())


def check_expected_backends(
    path: Path, data: Any, matrix: Matrix, configs: dict[str, dict[str, Any]] | None = None
) -> None:
    """The backends an expectation names must be ones its cell can have: a misspelt or a
    foreign name (another case's crafted backend, a CUDA backend on CPU) otherwise shows
    only after the engines ran, or never, in a rejection list. At load, not in the schema,
    so a matrix built in code may name what it likes."""
    for i, case in enumerate(matrix.cases):
        config = (configs or {}).get(case.model)
        mla = None if config is None else vllm_models.mla(config)
        crafted = {s.name for s in case.crafted.siblings}
        if case.crafted.replace is not None:
            crafted.add(case.crafted.replace.name)
        for where, platform, expect in expectations(i, case):
            stock = stock_backends(matrix, case, platform, mla)
            checks: list[tuple[str, list[str] | None, set[str] | None]]
            if isinstance(expect, EarlyError):
                checks = [("backends", expect.backends, stock)]
            elif isinstance(expect, Runs):
                inv = expect.invariants
                checks = [
                    ("invariants.rejected_by", inv.rejected_by, stock),
                    ("invariants.backends_include", inv.backends_include, None),
                ]
            else:
                continue
            for field, names, of_platform in checks:
                known = KNOWN_BACKENDS | LAYER_BACKENDS if of_platform is None else of_platform
                for name in names or []:
                    if name in crafted or name in known:
                        continue
                    others = (
                        "vLLM's backend names (KNOWN_BACKENDS, LAYER_BACKENDS in"
                        " kvrig.define.vllm_names)"
                        if of_platform is None
                        else f"the backends the {platform} platform gives its layers"
                        f" ({', '.join(sorted(of_platform))})"
                    )
                    loc = f"{where}.{field}"
                    parts = lines.split_field(data, loc)
                    mine = ", ".join(sorted(crafted)) or "it has none"
                    raise MatrixError(
                        f"{lines.where(path, data, parts)}: the matrix is invalid at {loc}:"
                        f" {name!r} is no backend a {platform} cell of case {case.id!r} can"
                        f" have. Nothing was run; name one of its crafted backends ({mine})"
                        f" or of {others}, and start again."
                    )


def check_model_configs(path: Path, data: Any, matrix: Matrix) -> dict[str, dict[str, Any]]:
    """Every model's config file exists and is one kvrig can read and its family's rules
    apply to; else no cell of it could start, or its verdicts would follow another family.
    Returns the rendered configs."""
    configs = {}
    for name, spec in matrix.models.items():
        if not models.findable(spec.config, path.parent):
            where = lines.where(path, data, ("models", name, "config"))
            raise MatrixError(
                f"{where}: the matrix is invalid at models.{name}.config: no config file"
                f" {spec.config!r}, neither beside the matrix ({path.parent / spec.config})"
                f" nor shipped with kvrig ({', '.join(models.shipped_names())}). Nothing was"
                " run; fix the name or add the file and start again."
            )
        try:
            configs[name] = models.check(spec, path.parent)
        except models.ModelConfigError as exc:
            loc = ("models", name, *exc.field.split("."))
            where = lines.where(path, data, loc, ("models", name, "config"))
            raise MatrixError(
                f"{where}: the matrix is invalid at models.{name}.{exc.field}: {exc} (config"
                f" {spec.config!r}). Nothing was run; fix the config, its overrides or the"
                " family, and start again."
            ) from None
    return configs


def check_sibling_layers(
    path: Path, data: Any, matrix: Matrix, configs: dict[str, dict[str, Any]]
) -> None:
    """Every sibling reaches an attention module of its model the way kvrig's plugin
    routes siblings (its `layers` a prefix of the module's name, an MLA backend on MLA
    layers); else the cell would run without the sibling it exists to test, and could
    pass."""
    for i, case in enumerate(matrix.cases):
        if not case.crafted.siblings:
            continue
        spec = matrix.models[case.model]
        config = configs[case.model]
        layers = vllm_models.attention_layers(config, spec.family)
        unrouted = vllm_models.SIBLINGS_UNROUTED.get(vllm_models.architecture(config) or "")
        if unrouted is not None:
            loc = ("cases", i, "crafted", "siblings", 0)
            where = lines.where(path, data, (*loc, "layers"), loc)
            raise MatrixError(
                f"{where}: the matrix is invalid at cases.{i}.crafted.siblings: {unrouted}, so"
                f" no layer of {case.model} would run it. Nothing was run; replace the backend"
                " instead (crafted.replace) and start again."
            )
        for j, sib in enumerate(case.crafted.siblings):
            loc = ("cases", i, "crafted", "siblings", j)
            if not any(models.prefix_matches(sib.layers, k, config) for k in layers):
                where = lines.where(path, data, (*loc, "layers"), loc)
                names = ", ".join(vllm_models.layer_prefix(k) for k in layers) or "none"
                modules = [vllm_models.attention_prefix(k, config) for k in layers]
                named = ", ".join(m for m in modules if m)
                routed = f" (the plugin matches it against their attention modules, {named})"
                raise MatrixError(
                    f"{where}: the matrix is invalid at cases.{i}.crafted.siblings.{j}.layers:"
                    f" {sib.layers!r} matches no attention layer of {case.model} (its attention"
                    f" layers: {names}){routed if named else ''}. Nothing was run; name one of"
                    " them, or a prefix of its attention module, and start again."
                )
            if not vllm_models.mla(config):
                continue
            for platform, expect in case.expect.items():
                if expect.outcome == "skip" or platform not in matrix.platforms:
                    continue
                # Named by neither, it is built on what the selector gives MLA layers.
                base = sib.base or case.knobs.attention_backend
                if base is None or "MLA" in base:
                    continue
                where = lines.where(path, data, (*loc, "base" if sib.base else "name"))
                raise MatrixError(
                    f"{where}: the matrix is invalid at cases.{i}.crafted.siblings.{j}.base:"
                    f" {case.model}'s attention layers are MLA layers, and kvrig's plugin"
                    " hands them only a sibling built on an MLA backend; on"
                    f" {platform} this one is built on {base}. Nothing was run; give it an"
                    " MLA base (one of"
                    f" {', '.join(sorted(n for n in KNOWN_BACKENDS if 'MLA' in n))}) and"
                    " start again."
                )
