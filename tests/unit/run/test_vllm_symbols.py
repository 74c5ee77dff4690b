"""kvrig reaching for vLLM's internals on a release that moved one: the missing name is
said once, in the record and the verdict, never a traceback in every cell."""

from __future__ import annotations

import importlib
import json
import pickle
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from kvrig.define.cells import expand
from kvrig.define.matrix import Matrix
from kvrig.judge.verdict import Status, judge
from kvrig.provision import overlay
from kvrig.run import emulation
from kvrig.run.collect import assemble
from kvrig.run.emulation import answers, configure
from kvrig.run.vllm_plugin import crafted, probe
from kvrig.run.vllm_plugin.symbols import MissingVllmSymbol, missing_in, need, need_attr, optional

from ..builders import gpu_matrix

RELEASE = "9.9.9"
FakeVllm = Callable[[dict[str, str]], None]


def _is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVllm]:
    """Writes a `vllm` package of the given modules (each a package, `vllm` at RELEASE)
    first on sys.path; any vLLM imported before is put back afterwards."""
    saved = {k: v for k, v in sys.modules.items() if _is_vllm(k)}
    for name in saved:
        del sys.modules[name]
    root = tmp_path / "site"

    def write(modules: dict[str, str]) -> None:
        for name, text in {"vllm": f"__version__ = {RELEASE!r}\n", **modules}.items():
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                folder = root.joinpath(*parts[:i])
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "__init__.py").touch()
            (root.joinpath(*parts) / "__init__.py").write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()

    yield write
    for name in [k for k in sys.modules if _is_vllm(k)]:
        del sys.modules[name]
    sys.modules.update(saved)


# --- reaching for a name ------------------------------------------------------------------


def test_a_name_the_release_has_is_reached_through_modules_and_attributes(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm({"vllm.v1.worker.utils": "def prepare_kernel_block_sizes(): return [16]\n"})
    assert need("vllm.v1.worker.utils.prepare_kernel_block_sizes", "kvrig's probe")() == [16]
    assert need("vllm.v1.worker", "kvrig's probe").__name__ == "vllm.v1.worker"


@pytest.mark.parametrize(
    ("dotted", "detail"),
    [
        (
            "vllm.v1.worker.gpu.attn_utils.prepare_kernel_block_sizes",
            "module vllm.v1.worker.gpu.attn_utils has no prepare_kernel_block_sizes",
        ),
        ("vllm.v1.worker.cpu.attn_utils.init_attn_backend", "module vllm.v1.worker has no cpu"),
        ("vllm.v1.worker.gpu.attn_utils.Spec.kind", "class vllm.v1.worker.gpu.attn_utils.Spec"),
    ],
)
def test_a_name_the_release_lacks_is_named_in_full_with_the_release(
    fake_vllm: FakeVllm, dotted: str, detail: str
) -> None:
    fake_vllm({"vllm.v1.worker.gpu.attn_utils": "class Spec: pass\ndef init_attn_backend(): pass"})
    with pytest.raises(MissingVllmSymbol) as raised:
        need(dotted, "kvrig's emulation")
    exc = raised.value
    assert exc.symbol == dotted and exc.release == RELEASE
    assert str(exc).startswith(
        f"kvrig's emulation reaches for {dotted}, which vLLM {RELEASE} does not have: {detail}"
    )
    # Never a kind vLLM's optional-import guards or hasattr would swallow.
    assert not isinstance(exc, ImportError | AttributeError)


def test_a_module_failing_on_its_own_missing_dependency_is_not_a_missing_name(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm({"vllm.v1.attention.backends.flashinfer": "import kvrig_no_such_dependency\n"})
    with pytest.raises(ModuleNotFoundError, match="kvrig_no_such_dependency"):
        need("vllm.v1.attention.backends.flashinfer.FlashInferBackend", "kvrig")


def test_an_attribute_of_an_object_in_hand_is_named_by_its_class(fake_vllm: FakeVllm) -> None:
    fake_vllm({"vllm.config.vllm": "class VllmConfig: pass\n"})
    config = need("vllm.config.vllm.VllmConfig", "kvrig")()
    with pytest.raises(MissingVllmSymbol, match=r"class vllm\.config\.vllm\.VllmConfig has no"):
        need_attr(config, "adjust_dcp_kv_cache_interleave_size", "kvrig's emulation")


def test_an_optional_name_is_none_where_the_release_lacks_it(fake_vllm: FakeVllm) -> None:
    fake_vllm({"vllm.model_executor.layers.attention.attention": "class Attention: pass\n"})
    assert optional("vllm.model_executor.layers.attention.mla_attention.MLAAttention") is None
    assert optional("vllm.model_executor.layers.attention.attention.Attention") is not None


def test_the_missing_name_is_found_behind_an_error_vllm_raised_for_it() -> None:
    missing = MissingVllmSymbol("vllm.x.Y", "kvrig's emulation", "module vllm.x has no Y", "1.0")
    try:
        try:
            raise missing
        except MissingVllmSymbol as exc:
            raise ValueError("vLLM could not resolve a class") from exc
    except ValueError as outer:
        assert missing_in(outer) is missing
        info = probe.error_info(outer)
    assert info["type"] == "MissingVllmSymbol"
    assert info["missing_vllm_symbol"] == "vllm.x.Y"
    assert "error_info" not in info["message"]
    assert missing_in(ValueError("plain")) is None
    assert "missing_vllm_symbol" not in probe.error_info(ValueError("plain"))
    copy = pickle.loads(pickle.dumps(missing))  # an engine process may hand it on pickled
    assert (copy.symbol, copy.release, str(copy)) == ("vllm.x.Y", "1.0", str(missing))


# --- the probe --------------------------------------------------------------------------

PLATFORM = """
class FakePlatform:
    @classmethod
    def update_block_size_for_backend(cls, vllm_config):
        vllm_config.cache_config.block_size = 64

    @classmethod
    def _find_non_ssm_backends(cls, vllm_config):
        return []

current_platform = FakePlatform()
"""
CONFIG = "import contextlib\ndef set_current_vllm_config(c): return contextlib.nullcontext()\n"


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "_path", None)
    monkeypatch.setattr(probe, "missing", {})


@pytest.mark.usefixtures("fresh_probe")
def test_a_probe_hook_whose_vllm_name_is_gone_is_left_out_and_named(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    # A release that renamed the worker's kernel-size step: the other hook still goes in.
    fake_vllm(
        {
            "vllm.platforms": PLATFORM,
            "vllm.config.vllm": CONFIG,
            "vllm.v1.worker.utils": "def choose_kernel_block_sizes(): pass\n",
        }
    )
    path = tmp_path / "probe.jsonl"
    probe.install(str(path))
    [event] = _events(path)
    assert event["hooks"] == ["FakePlatform.update_block_size_for_backend"]
    symbol = "vllm.v1.worker.utils.prepare_kernel_block_sizes"
    message = (
        f"kvrig's probe reaches for {symbol}, which vLLM {RELEASE} does not have:"
        f" module vllm.v1.worker.utils has no prepare_kernel_block_sizes"
    )
    assert event["missing"] == {"prepare_kernel_block_sizes": message}
    assert probe.missing == event["missing"]


@pytest.mark.usefixtures("fresh_probe")
def test_a_probe_with_every_name_reports_no_missing_hook(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    fake_vllm(
        {
            "vllm.platforms": PLATFORM,
            "vllm.config.vllm": CONFIG,
            "vllm.v1.worker.utils": "def prepare_kernel_block_sizes(c, g): return [64]\n",
        }
    )
    path = tmp_path / "probe.jsonl"
    probe.install(str(path))
    [event] = _events(path)
    assert event["hooks"] == [
        "FakePlatform.update_block_size_for_backend",
        "vllm.v1.worker.utils.prepare_kernel_block_sizes",
    ]
    assert "missing" not in event and probe.missing == {}


# --- the crafted backends ----------------------------------------------------------------

REGISTRY = """
import enum

class AttentionBackendEnum(enum.Enum):
    TRITON_ATTN = "triton"
    CUSTOM = ""

    def get_class(self):
        return type("Base", (), {"is_mla": staticmethod(lambda: False)})

registered = []

def register_backend(backend, class_path=None, is_mamba=False):
    registered.append((getattr(backend, "name", backend), class_path))
"""
LAYERS = {
    "vllm.v1.attention.backends.registry": REGISTRY,
    "vllm.model_executor.layers.attention.attention": "class Attention:\n"
    "    def __init__(self, *a, **kw): self.kw = kw\n",
}


def test_a_crafted_backend_over_a_backend_the_release_lacks_names_it(fake_vllm: FakeVllm) -> None:
    fake_vllm(LAYERS)
    spec = crafted.CraftSpec(replace=crafted.BackendSpec("KVRIG_X", (16,), False, "FLASH_ATTN"))
    symbol = "vllm.v1.attention.backends.registry.AttentionBackendEnum.FLASH_ATTN"
    with pytest.raises(MissingVllmSymbol) as raised:
        crafted.install(spec)
    assert str(raised.value).startswith(
        f"kvrig's plugin (crafted backends) reaches for {symbol}, which vLLM {RELEASE} does not"
        " have: class vllm.v1.attention.backends.registry.AttentionBackendEnum has no FLASH_ATTN"
    )


def test_crafted_siblings_route_the_layer_classes_the_release_has(fake_vllm: FakeVllm) -> None:
    # No MLA layer class in this layout: the plain Attention layers are routed, no error.
    fake_vllm(LAYERS)
    sibling = crafted.BackendSpec("KVRIG_SIB", (32,), True, "TRITON_ATTN", "model.layers.3.")
    crafted.install(crafted.CraftSpec(siblings=(sibling,)))
    registry = sys.modules["vllm.v1.attention.backends.registry"]
    assert registry.registered == [("KVRIG_SIB", "kvrig.run.vllm_plugin.crafted.KVRIG_SIB")]
    attention = need("vllm.model_executor.layers.attention.attention.Attention", "kvrig")
    layer = attention(prefix="model.layers.3.self_attn.attn")
    assert layer.kw["attn_backend"].get_name() == "KVRIG_SIB"


def test_the_emulated_communicator_is_looked_up_where_the_release_keeps_it(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm({"vllm.distributed": ""})
    with pytest.raises(MissingVllmSymbol, match="kvrig's emulated platform reaches for"):
        answers.DeviceAnswers.get_device_communicator_cls()


# --- an emulated cell -------------------------------------------------------------------


def test_a_removed_switch_is_recorded_as_a_fact_of_the_release() -> None:
    assert configure.model_runner(SimpleNamespace()) == (
        "v2 (VllmConfig has no use_v2_model_runner: Model Runner V1 removed in this release)"
    )
    assert configure.model_runner(SimpleNamespace(use_v2_model_runner=True)) == "v2"
    assert configure.model_runner(SimpleNamespace(use_v2_model_runner=False)) == "v1"


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch as far as an emulated cell's summary reads it (the unit tests run without it)."""
    torch = ModuleType("torch")
    torch.__version__ = "0.0+fake"  # type: ignore[attr-defined]
    torch.version = SimpleNamespace(cuda="13.0")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)


@pytest.mark.usefixtures("fake_torch", "fresh_probe")
def test_an_emulated_cell_on_a_release_without_a_step_is_undecided_naming_it(
    fake_vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A release without vllm.engine.arg_utils: the first step kvrig calls is not there.
    fake_vllm({"vllm.config.vllm": CONFIG})
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda:9.0")
    monkeypatch.delenv(overlay.OVERLAY_ENV, raising=False)
    probe.missing["prepare_kernel_block_sizes"] = "kvrig's probe reaches for vllm.v1.x.y, ..."
    out = configure.run(tmp_path, {"model": "m"})
    symbol = "vllm.engine.arg_utils.EngineArgs"
    assert out["frontend_error"]["type"] == "MissingVllmSymbol"
    assert out["frontend_error"]["missing_vllm_symbol"] == symbol
    assert out["emulation"]["probe_missing"] == dict(probe.missing)
    [cell] = expand(
        Matrix.model_validate(gpu_matrix()), "cuda", gpu_arch="9.0", device_emulated=True
    )
    rec = assemble(
        cell, frontend=out, events=[], exit_code=0, signal_name=None, ended_by=None, log_text=""
    )
    assert rec.outcome == "error" and rec.error is not None
    assert rec.error.missing_vllm_symbol == symbol
    v = judge(cell, rec)
    assert v.status is Status.UNDECIDED, v.reason
    assert v.reason.startswith(
        f"kvrig's emulation reaches for {symbol}, which vLLM {RELEASE} does not have:"
        " module vllm has no engine"
    )
