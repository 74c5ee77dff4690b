"""The root parent's watch: what a library might read as it loads that would differ between
two parents forked after it, each noticed (no vLLM here: stand-in modules)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kvrig.run import neutral
from kvrig.run.emulation.chosen import DeviceUnchosen


@pytest.fixture
def watch() -> Iterator[neutral.Watch]:
    w = neutral.Watch()
    w.start()
    try:
        yield w
    finally:
        w.stop()


def test_the_root_s_environment_holds_none_of_a_platform_parent_s_own_variables() -> None:
    env = {
        "PATH": "/bin", "LD_LIBRARY_PATH": "/stub", "CUDA_VISIBLE_DEVICES": "",
        "KVRIG_EMULATE": "rocm", "VLLM_ROCM_USE_AITER": "1", "KVRIG_ROCM_AITER": "1",
        "HIP_VISIBLE_DEVICES": "",
    }  # fmt: skip
    assert neutral.root_env(env) == {
        "PATH": "/bin", "LD_LIBRARY_PATH": "/stub", "CUDA_VISIBLE_DEVICES": ""
    }  # fmt: skip


def test_a_lookup_of_a_variable_of_vllm_s_is_noted_and_others_are_not(
    watch: neutral.Watch,
) -> None:
    os.environ.get("PATH")
    assert watch.seen == []
    os.environ.get("VLLM_BATCH_INVARIANT")
    "KVRIG_EMULATE" in os.environ  # noqa: B015 - a membership test is a lookup too
    assert [s.split(": ", 1)[1] for s in watch.seen] == [
        "looked up VLLM_BATCH_INVARIANT in the environment",
        "looked up KVRIG_EMULATE in the environment",
    ]
    assert "test_neutral.py" in watch.seen[0]  # where it was asked


def test_the_environment_gets_its_own_class_back() -> None:
    before = type(os.environ)
    w = neutral.Watch()
    w.start()
    assert type(os.environ) is not before
    w.stop()
    assert type(os.environ) is before
    os.environ.get("VLLM_X")
    assert w.seen == []


def test_an_attempt_to_import_a_package_kvrig_stands_in_for_is_noted(
    watch: neutral.Watch,
) -> None:
    with pytest.raises(ImportError):
        import aiter  # noqa: F401
    assert any("tried to import aiter" in s for s in watch.seen)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    torch, cuda = ModuleType("torch"), ModuleType("torch.cuda")
    cuda.get_device_capability = lambda device=None: (9, 0)  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    return torch


def test_a_device_query_is_noted_refused_and_given_back(
    watch: neutral.Watch, fake_torch: ModuleType
) -> None:
    original = fake_torch.cuda.get_device_capability
    watch.guard_torch()
    with pytest.raises(DeviceUnchosen):
        fake_torch.cuda.get_device_capability()
    assert any("asked torch.cuda.get_device_capability()" in s for s in watch.seen)
    watch.stop()
    assert fake_torch.cuda.get_device_capability is original


def test_a_module_that_kept_a_device_query_as_its_own_name_is_named(
    watch: neutral.Watch, fake_torch: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch.guard_torch()
    keeper = ModuleType("keeper")
    keeper.cap = fake_torch.cuda.get_device_capability  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "keeper", keeper)
    assert "kept keeper.cap as its own name" in watch.findings()


def test_a_module_of_vllm_loaded_is_named(watch: neutral.Watch) -> None:
    modules = {"torch": ModuleType("torch"), "vllm.envs": ModuleType("vllm.envs")}
    assert watch.findings(modules) == ["vLLM's vllm.envs loaded"]


def test_what_the_root_imports_is_every_platform_s_and_torch_first() -> None:
    assert neutral.NEUTRAL[0] == f"{neutral.OPTIONAL}torch"
    assert not [m for m in neutral.NEUTRAL if m.lstrip(neutral.OPTIONAL).startswith("vllm")]
    # FlashInfer is CUDA's and ROCm's: XPU's import of vLLM loads none.
    assert not any("flashinfer" in m for m in neutral.NEUTRAL)
    assert neutral.PLATFORM_NEUTRAL["xpu"] == ()


def test_a_frame_in_a_checkout_folder_named_kvrig_is_outside_kvrig() -> None:
    import traceback

    from kvrig.run.emulation.chosen import asked_from

    own = str(Path(neutral.__file__))
    stack = traceback.StackSummary.from_list(
        [("/home/u/kvrig/tests/test_x.py", 7, "test_x", None), (own, 1, "note", None)]
    )
    assert asked_from(stack) == "/home/u/kvrig/tests/test_x.py:7 in test_x"
