"""The engine arguments a case sets are refused at their line when vLLM has no such name or
value, when no part of the model or the platform reads them, or when what they name is
not there (each variant a change of the project's own matrix.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from kvrig.define.matrix import load

from ..matrix_files import Loc, dumped, refused_at, repo_data


def _case(data: dict[str, Any], model: str, case_id: str) -> tuple[dict[str, Any], Loc]:
    i = next(i for i, c in enumerate(data["cases"]) if c["model"] == model and c["id"] == case_id)
    return data["cases"][i], ("cases", i)


def _knob(model: str, case_id: str, *path: Any, value: Any, at: Loc | None = None):
    """A mutation setting one knob (a path under `knobs`), refused at that knob's key or at
    `at` under the case."""

    def mutate(data: dict[str, Any]) -> Loc:
        case, where = _case(data, model, case_id)
        node = case.setdefault("knobs", {})
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        return (*where, *(at if at is not None else ("knobs", *path)))

    return mutate


def _long_prompt(data: dict[str, Any]) -> Loc:
    case, where = _case(data, "granite_hybrid", "max_model_len_below_block")
    case["knobs"]["max_model_len"] = 16
    case["max_tokens"] = 9  # 8 prompt tokens and 9 to generate: past 16
    return (*where, "max_tokens")


REFUSED = {
    "a speculative method vLLM has not": _knob(
        "llama", "spec_ngram", "speculative_config", "method", value="ngrams"
    ),
    "a drafter that is no model of the matrix": _knob(
        "llama", "spec_eagle3_other_kv_heads", "speculative_config", "model", value="llama_eagel3"
    ),
    "eagle3 without its drafter": _knob(
        "llama",
        "spec_eagle3_other_kv_heads",
        "speculative_config",
        "model",
        value=None,
        at=("knobs", "speculative_config"),
    ),
    "ngram with a drafter it never loads": _knob(
        "llama",
        "spec_ngram",
        "speculative_config",
        "model",
        value="llama_eagle3",
        at=("knobs", "speculative_config"),
    ),
    "MTP on a model with no next-token layers": _knob(
        "granite_hybrid",
        "spec_ngram",
        "speculative_config",
        "method",
        value="mtp",
    ),
    **{
        f"a drafter's context of {value}": _knob(
            "granite_hybrid",
            "spec_draft_shorter_context",
            "speculative_config",
            "max_model_len",
            value=value,
        )
        for value in (512, 0, "128")  # past the target's; none; not a number
    },
    "a drafter's context for a method with no drafter": _knob(
        "llama", "spec_ngram", "speculative_config", "max_model_len", value=128
    ),
    "no draft tokens": _knob(
        "llama", "spec_ngram", "speculative_config", "num_speculative_tokens", value=0
    ),
    "more pipeline stages than layers": _knob(
        "granite_hybrid", "pp_every_stage_has_attention", "pipeline_parallel_size", value=5
    ),
    "more ranks than one engine starts": _knob(
        "granite_hybrid", "tp_and_pp", "pipeline_parallel_size", value=8
    ),
    "pipeline_parallel_size: 0": _knob(
        "granite_hybrid", "pp_every_stage_has_attention", "pipeline_parallel_size", value=0
    ),
    "max_model_len past the positions": _knob(
        "granite_hybrid", "max_model_len_below_block", "max_model_len", value=4096
    ),
    "max_model_len: '128'": _knob(
        "granite_hybrid", "max_model_len_below_block", "max_model_len", value="128"
    ),
    "a prompt and its tokens past the case's max_model_len": _long_prompt,
    "mamba_block_size: -96": _knob(
        "granite_hybrid", "mamba_block_size_replaced", "mamba_block_size", value=-96
    ),
    "a state knob on a model without state": _knob(
        "llama", "spec_ngram", "mamba_block_size", value=96
    ),
    "mamba_cache_dtype vLLM has not": _knob(
        "granite_hybrid", "conv_state_float32", "mamba_cache_dtype", value="fp8"
    ),
    "decode context parallelism expected on CPU": _knob(
        "llama", "hybrid_kv_cache_manager_off", "decode_context_parallel_size", value=2
    ),
    "an NVFP4 cache expected off CUDA": _knob(
        "granite_hybrid", "kv_turboquant", "kv_cache_dtype", value="nvfp4"
    ),
    "disable_hybrid_kv_cache_manager: 'yes'": _knob(
        "llama", "hybrid_kv_cache_manager_off", "disable_hybrid_kv_cache_manager", value="yes"
    ),
}


@pytest.mark.parametrize("mutate", REFUSED.values(), ids=list(REFUSED))
def test_a_knob_vllm_would_refuse_or_never_read_is_refused_at_its_line(tmp_path, mutate) -> None:
    data = repo_data()
    refused_at(tmp_path, data, mutate(data))


def test_the_knobs_the_matrix_sets_load_and_reach_the_cells() -> None:
    from ..builders import ROOT

    matrix = load(ROOT / "matrix.yaml")
    knobs = {
        name
        for case in matrix.cases
        for name, value in case.knobs.model_dump().items()
        if value is not None
    }
    assert {
        "max_model_len",
        "mamba_block_size",
        "pipeline_parallel_size",
        "speculative_config",
        "decode_context_parallel_size",
        "disable_hybrid_kv_cache_manager",
        "enable_chunked_prefill",
        "mamba_cache_dtype",
    } <= knobs


def test_a_knob_where_it_means_something_loads(tmp_path) -> None:
    data = repo_data()
    case, _ = _case(data, "llama", "decode_context_parallel")
    case["expect"].pop("rocm")  # still CUDA's and XPU's
    assert load(dumped(tmp_path, data)).cases
