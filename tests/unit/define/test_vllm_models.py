"""How kvrig reads a config the way vLLM does, in the one place both the loader and the
predictor ask."""

from __future__ import annotations

import json

import pytest

from kvrig.define.vllm_models import Family, architecture, text_config


def test_a_family_reads_and_writes_as_the_name_matrix_yaml_gives_it() -> None:
    # Records, results rows and the cell snapshot hold the family as this text.
    assert json.dumps({"family": Family.HYBRID_MAMBA}) == '{"family": "hybrid_mamba"}'
    assert f"a {Family.GDN} model" == "a gdn model"
    assert Family("dsa") is Family.DSA
    assert Family.DENSE == "dense"


def test_a_multimodal_config_s_text_config_names_the_class_vllm_loads() -> None:
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {"architectures": ["Qwen3_5TextModel"], "num_hidden_layers": 4},
    }
    text = text_config(config)
    assert text["num_hidden_layers"] == 4
    assert architecture(text) == "Qwen3_5ForConditionalGeneration"
    assert config["text_config"]["architectures"] == ["Qwen3_5TextModel"]  # left as it was
    plain = {"architectures": ["LlamaForCausalLM"]}
    assert text_config(plain) is plain


@pytest.mark.parametrize(
    "listed",
    [None, [], "LlamaForCausalLM", ["LlamaForCausalLM", 3], [None]],
    ids=["missing", "empty", "a string", "a number among the names", "no name"],
)
def test_a_config_that_lists_anything_but_class_names_names_no_architecture(listed) -> None:
    config = {} if listed is None else {"architectures": listed}
    assert architecture(config) is None


def test_the_first_listed_class_is_the_architecture() -> None:
    assert architecture({"architectures": ["NemotronHForCausalLM", "Other"]}) == (
        "NemotronHForCausalLM"
    )
