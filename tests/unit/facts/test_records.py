"""kvrig's records of vLLM agree with vLLM's names and with every table read from them."""

from __future__ import annotations

import typing
from collections import Counter

import pytest

from kvrig.define import gpus, vllm_models, vllm_names
from kvrig.facts import architectures, backends, platforms
from kvrig.facts.gpus import ROCM_GPUS, gfx_capability, parse_capability
from kvrig.rules import blocksize, cuda, predict, rocm, versions
from kvrig.run import forkserver

from ..matrix_files import dumped, refusal, refused_at, repo_data


def test_each_backend_is_recorded_once_per_platform() -> None:
    pairs = Counter((r.key, p) for r in backends.RECORDS for p in r.platforms)
    assert [pair for pair, n in pairs.items() if n > 1] == []


@pytest.mark.parametrize("record", backends.RECORDS, ids=lambda r: f"{r.key}@{r.platforms}")
def test_each_backend_record_is_a_name_vllm_has_on_its_platforms(record) -> None:
    assert record.key in vllm_names.KNOWN_BACKENDS | vllm_names.LAYER_BACKENDS
    for platform in record.platforms:
        listed = (
            vllm_names.PLATFORM_BACKENDS.get(platform, frozenset())
            | vllm_names.LAYER_BACKENDS
            | vllm_names.FAMILY_BACKENDS[vllm_models.Family.DSA]
        )
        assert record.key in listed, f"{record.key} is not a {platform} backend vLLM lists"


def test_the_rules_read_the_records() -> None:
    assert cuda.FLASH_ATTN is backends.backend("cuda", "FLASH_ATTN")
    assert blocksize.RULES["xpu"].default is backends.backend("xpu", "FLASH_ATTN")
    assert blocksize.RULES["xpu"].default.preferred_floor == 64
    assert set(predict.BACKENDS["cuda"]) == {
        "FLASH_ATTN",
        "FLASHINFER",
        "TRITON_ATTN",
        "FLEX_ATTENTION",
    }
    assert set(rocm.ATTENTION) == {
        "ROCM_ATTN",
        "ROCM_AITER_UNIFIED_ATTN",
        "ROCM_AITER_FA",
        "TRITON_ATTN",
    }
    # ROCM_AITER_FA is the enum's name; get_name() says FLASH_ATTN, as vLLM's messages do.
    assert backends.backend("rocm", "ROCM_AITER_FA").name == "FLASH_ATTN"


def test_a_rocm_release_switch_moves_the_recorded_preference_only() -> None:
    old = rocm.backends(versions.rules("rocm", (0, 33, 0)))["ROCM_ATTN"]
    new = rocm.backends(versions.rules("rocm", (0, 34, 0)))["ROCM_ATTN"]
    assert (old.preferred_fixed, new.preferred_fixed) == (None, 16)
    assert old.kernels == new.kernels == backends.backend("rocm", "ROCM_ATTN").kernels


def test_a_user_may_name_only_the_nameable_backends() -> None:
    assert "TURBOQUANT" not in backends.nameable("cuda")
    assert "TURBOQUANT" in backends.on("cuda")
    with pytest.raises(backends.UnknownBackend):
        backends.backend("cpu", "FLASH_ATTN")


def test_the_stock_default_of_each_platform_is_a_backend_it_has() -> None:
    for p in platforms.PLATFORMS.values():
        assert p.default_backend in backends.nameable(p.name, "attention"), p.name
    assert predict.DEFAULT == {"cpu": "CPU_ATTN", "cuda": "FLASH_ATTN", "xpu": "FLASH_ATTN"}


def test_the_schema_s_platform_type_is_the_records_platforms() -> None:
    assert typing.get_args(vllm_names.Platform) == platforms.NAMES == vllm_names.PLATFORMS


def test_a_default_backend_other_than_the_selector_s_is_refused_at_its_line(tmp_path) -> None:
    data = repo_data()
    data["platforms"]["cuda"]["default_backend"] = "TRITON_ATTN"
    msg = refused_at(tmp_path, data, ("platforms", "cuda", "default_backend"))
    assert "it picks FLASH_ATTN" in msg


def test_the_repo_matrix_s_defaults_are_the_records(tmp_path) -> None:
    data = repo_data()
    assert {p: s["default_backend"] for p, s in data["platforms"].items()} == {
        p.name: p.default_backend for p in platforms.PLATFORMS.values()
    }
    data["platforms"]["rocm"]["default_backend"] = "TRITON_ATTN"
    assert "platforms.rocm.default_backend" in refusal(dumped(tmp_path, data))


@pytest.mark.parametrize(
    ("text", "capability"),
    [("9.0", (9, 0)), ("sm90", (9, 0)), ("sm_100", (10, 0)), ("12.1", (12, 1)), ("9", (9, 0))],
)
def test_one_reading_of_a_compute_capability(text, capability) -> None:
    assert parse_capability(text) == capability
    assert gpus.normalize("cuda", text) == f"{capability[0]}.{capability[1]}"


def test_the_rocm_rules_read_the_gpu_records() -> None:
    rules = versions.rules("rocm", (0, 34, 0))
    aiter = rocm.Aiter(found=True, enabled=True)
    for arch, gpu in ROCM_GPUS.items():
        order = rocm.priorities(arch, rules, aiter=aiter)
        assert ("ROCM_AITER_UNIFIED_ATTN" in order) == (gpu.cdna > 2 or gpu.rdna4), arch
        assert (order[0] == "ROCM_AITER_UNIFIED_ATTN") == gpu.rdna4, arch
        assert gpu.gcn_arch_name.split(":")[0] == arch
        assert gpu.capability == gfx_capability(arch)


def test_torch_s_answers_are_read_off_the_one_record() -> None:
    h100 = gpus.gpu("cuda", "9.0").torch_properties()
    assert (h100["major"], h100["minor"], h100["warp_size"]) == (9, 0, 32)
    assert h100["max_threads_per_multi_processor"] == 2048
    assert gpus.gpu("cuda", "8.6").torch_properties()["max_threads_per_multi_processor"] == 1536
    mi300 = gpus.gpu("rocm", "gfx942").torch_properties()
    assert (mi300["major"], mi300["minor"], mi300["warp_size"]) == (9, 4, 64)
    assert mi300["gcnArchName"] == "gfx942:sramecc+:xnack-"
    assert gpus.gpu("rocm", "gfx1201").torch_properties()["warp_size"] == 32


def test_the_architecture_tables_are_the_records() -> None:
    assert {a.name: a.family for a in architectures.ARCHITECTURES.values()} == vllm_models.FAMILY_OF
    assert set(vllm_models.MLA_ARCHITECTURES) == {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiLinearForCausalLM",
    }
    attention_free = {a for a, f in vllm_models.FAMILY_OF.items() if f == vllm_models.Family.MAMBA}
    assert set(vllm_models.ATTENTION_MODULE) == set(vllm_models.FAMILY_OF) - attention_free
    mixers = {a.name for a in architectures.ARCHITECTURES.values() if a.mamba2}
    assert mixers == {a for a, f in vllm_models.FAMILY_OF.items() if f.value.endswith("mamba")}


def test_an_emulated_parent_preloads_its_own_platform_s_backends_and_models() -> None:
    rocm_preload = forkserver.preload_for("rocm", emulated=True)
    cuda_preload = forkserver.preload_for("cuda", emulated=True)
    assert "?vllm.v1.attention.backends.rocm_attn" in rocm_preload
    assert "?vllm.v1.attention.backends.rocm_attn" not in cuda_preload
    # Each platform's own backends only: CUDA's FlashInfer is seconds of an XPU import.
    assert "?vllm.v1.attention.backends.flashinfer" in cuda_preload
    assert "?vllm.v1.attention.backends.flashinfer" not in forkserver.preload_for(
        "xpu", emulated=True
    )
    assert "?vllm.v1.attention.backends.mla.xpu_mla_sparse" not in cuda_preload
    assert rocm_preload[-1] == cuda_preload[-1] == "?kvrig.run.registered"
    for module in architectures.preloaded("every", "emulated"):
        assert module in cuda_preload
    cpu = forkserver.preload_for("cpu")
    assert "vllm.model_executor.models.nemotron_h" in cpu
    assert "vllm.model_executor.models.mamba2" in cpu  # the CPU column's models, too
    # Qwen3.5's module needs torchvision, which a CPU environment lacks.
    assert "vllm.model_executor.models.qwen3_5" not in cpu
    assert cpu[-1] == "?kvrig.run.registered"  # after every model class it imports
