"""One warm parent per emulated platform: its processes, with stand-in cells instead of vLLM.

The platform's parent and each architecture's parent are real processes here, forking
cells that obey the runner's test hook (KVRIG_TEST_FAULT) instead of starting vLLM; what
they import is kvrig's cell module alone. That vLLM's own answers stay each architecture's
is proved with vLLM, in tests/emulated.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from kvrig.define.cells import expand
from kvrig.define.matrix import Matrix
from kvrig.run import emulation
from kvrig.run.cell import FAULT_ENV, cell_env
from kvrig.run.emulation import chosen
from kvrig.run.forkserver import (
    OWNER_ENV,
    PARENTS_ENV,
    ForkServer,
    Pool,
    before_a_device,
    env_key,
    preload_for,
    unfit,
)
from kvrig.run.platform_parent import (
    Parents,
    Shared,
    SharedParent,
    platform_env,
    serving,
    shareable,
)
from kvrig.run.runner import run_cell

from ..builders import gpu_matrix

LIGHT = ("kvrig.run.cell",)  # what the parents import here: no vLLM
ROOT = ("json",)  # and the root parent


def cuda_cell(arch: str):
    matrix = Matrix.model_validate(gpu_matrix())
    return expand(matrix, "cuda", gpu_arch=arch, device_emulated=True)[0]


def alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids: list[int | None], seconds: float = 60.0) -> list[int | None]:
    """The pids still alive after `seconds`: a bound generous enough for a loaded 2-core
    host, where a parent's exit has been seen to take over 20 s."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --- the device a process emulates ------------------------------------------------------


def test_a_parent_of_every_architecture_names_its_platform_and_chooses_no_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda")
    assert emulation.target() is None
    assert emulation.emulated_platform() == "cuda"
    assert emulation.platform_plugin() == emulation.PLATFORM_CLASSES["cuda"]
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda:8.6")
    assert emulation.emulated_platform() == "cuda"
    assert chosen.device().capability == (8, 6)
    # Each process reads its own: a cell forked with another architecture answers that one.
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda:10.0")
    assert chosen.device().capability == (10, 0)


def test_asking_for_the_device_before_one_is_chosen_is_noted_and_cannot_be_swallowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(emulation.EMULATE_ENV, "cuda")
    monkeypatch.setattr(chosen, "_reads", [])

    def module_constant() -> bool:
        try:  # a fallback cached by vLLM would be one architecture's answer for all
            return chosen.device().capability >= (9, 0)
        except Exception:
            return False

    with pytest.raises(chosen.DeviceUnchosen, match="before a device was chosen"):
        module_constant()
    [read] = chosen.unchosen_reads()
    assert "test_platform_parent.py" in read and "module_constant" in read
    why = unfit({"ready": 1, "missing": [], "python_threads": [], "device_reads": [read]})
    assert why is not None and "reach every architecture's cells" in why


def test_a_platform_parent_imports_only_what_reads_no_device() -> None:
    full = preload_for("cuda", emulated=True)
    part = before_a_device(full)
    assert "vllm.v1.engine.core" in part and "kvrig.run.emulation.configure" in part
    assert "vllm.entrypoints.llm" not in full  # no emulated cell builds a vllm.LLM
    assert "?vllm.v1.attention.backends.flashinfer" in part
    for reads in ("vllm.model_executor.models.llama", "vllm.model_executor.model_loader"):
        assert reads in full and reads not in part
    assert not any("backends.flash_attn" in m or ".mla." in m for m in part)


def test_what_a_cell_imported_as_it_ran_is_imported_by_its_devices_parent() -> None:
    full = preload_for("cuda", emulated=True)
    lazy = "?vllm.model_executor.layers.quantization.online.base"
    assert lazy in full and lazy not in before_a_device(full)
    assert full[-1] == "?kvrig.run.registered"  # after every model class
    rocm = "?vllm.v1.attention.backends.rocm_attn"
    assert rocm in preload_for("rocm", emulated=True) and rocm not in full
    assert preload_for("rocm", emulated=True)[-1] == full[-1]


def test_the_platform_parents_environment_is_every_architectures() -> None:
    a = cell_env(cuda_cell("9.0"), Path("/w/a"), {"PATH": "/bin"})
    b = cell_env(cuda_cell("8.0"), Path("/w/b"), {"PATH": "/bin"})
    assert env_key(a) != env_key(b)
    assert platform_env(a) == platform_env(b)
    assert platform_env(a)[emulation.EMULATE_ENV] == "cuda"
    shared = Shared(Path("/tmp/p"), 1, "/py", None)
    assert shared.socket_for(a) == shared.socket_for(b)
    assert Shared(Path("/tmp/p"), 1, "/other-py", None).socket_for(a) != shared.socket_for(a)
    # The run's own variables are read by the pool, never by vLLM: not in any key.
    assert env_key({**a, PARENTS_ENV: "/x", OWNER_ENV: "1"}) == env_key(a)


def test_every_emulated_device_is_shared() -> None:
    assert shareable({emulation.EMULATE_ENV: "cuda:9.0"})
    assert shareable({emulation.EMULATE_ENV: "xpu:bmg"})
    # rocm.py reads the gfx target at import: the platform's parent imports none of vLLM.
    assert shareable({emulation.EMULATE_ENV: "rocm:gfx942"})
    assert not shareable({emulation.EMULATE_ENV: "cuda"})
    assert not shareable({})


def test_what_a_platform_parent_imports_of_vllm() -> None:
    """CUDA's and XPU's platform parents import vLLM's device-free part, ROCm's none of it,
    and none does for the shared parents' proof, whose references each import all of it
    after their device (forked from the root)."""
    full = preload_for("cuda", emulated=True)
    env = cell_env(cuda_cell("9.0"), Path("/w/a"), {"PATH": "/bin"})
    path = Path("/tmp/p/x.sock")
    request = Shared(Path("/tmp/p"), 1, "/py", None)._request(path, env)
    assert request["preload"] == list(before_a_device(full))
    assert request["arch_preload"] == list(full)
    later = Shared(Path("/tmp/p"), 1, "/py", None, vllm_before_a_device=False)
    assert later._request(path, env)["preload"] == []
    rocm = {**env, emulation.EMULATE_ENV: "rocm:gfx942"}
    assert Shared(Path("/tmp/p"), 1, "/py", None)._request(path, rocm)["preload"] == []


def test_a_lone_column_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENTS_ENV, raising=False)
    assert Shared.from_environment(sys.executable, None) is None
    monkeypatch.setenv(PARENTS_ENV, "/tmp/x")
    monkeypatch.setenv(OWNER_ENV, str(os.getpid()))
    assert Shared.from_environment(sys.executable, None) is not None


# --- the parents themselves --------------------------------------------------------------


@pytest.fixture
def sharing(tmp_path: Path):
    with Parents() as parents:
        folder = Path(parents.env("cuda")[PARENTS_ENV])
        logs = tmp_path / "logs"
        yield parents, Shared(folder, os.getpid(), sys.executable, logs, LIGHT, root_preload=ROOT)


def test_one_platform_parent_serves_every_architecture_each_from_a_parent_of_its_own(
    tmp_path: Path, sharing
) -> None:
    parents, shared = sharing
    seen: dict[str, tuple[int | None, int | None]] = {}
    with Pool(preload=LIGHT, log_dir=tmp_path / "logs", sharing=shared) as pool:
        for arch in ("9.0", "8.0", "9.0", "12.0"):
            rec = run_cell(cuda_cell(arch), tmp_path / arch, pool=pool, env_overrides=FAKE)
            assert (rec.exit_code, rec.signal) == (0, None), rec.note
            [server] = [s for s in pool.servers if s.matches(cell_env_of(arch, tmp_path))]
            assert isinstance(server, SharedParent)
            seen.setdefault(arch, (server.platform_pid, server.pid))
            assert seen[arch] == (server.platform_pid, server.pid)  # the same parent again
    platform = {p for p, _ in seen.values()}
    by_arch = {a for _, a in seen.values()}
    assert len(platform) == 1 and len(by_arch) == 3  # one import, a parent per device
    parents.stop("cuda")
    assert gone_within([*platform, *by_arch]) == []


FAKE = {FAULT_ENV: "fake:0"}


def cell_env_of(arch: str, tmp_path: Path) -> dict[str, str]:
    cell = cuda_cell(arch)
    return {**cell_env(cell, tmp_path / arch / "cells" / cell.id), **FAKE}


def test_a_column_that_goes_away_takes_its_running_cells_with_it(tmp_path: Path, sharing) -> None:
    _, shared = sharing
    env = {**cell_env_of("9.0", tmp_path), FAULT_ENV: "sleep:60"}
    parent = SharedParent(env, shared).start()
    (tmp_path / "w").mkdir()
    pid = parent.spawn(tmp_path / "w", env, tmp_path / "cell.log")
    assert alive(pid)
    parent.close()  # the column's channel closes: the architecture's parent ends the cell
    assert gone_within([pid]) == []
    # and, its last column gone, goes too; the platform's parent makes another when asked.
    assert gone_within([parent.pid]) == [] and alive(parent.platform_pid)
    again = SharedParent(env, shared).start()
    assert again.platform_pid == parent.platform_pid and again.pid != parent.pid
    again.close()


def test_the_parents_go_when_the_run_that_owns_them_does(tmp_path: Path) -> None:
    with Parents() as parents:
        folder = Path(parents.env("cuda")[PARENTS_ENV])
        owner = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        shared = Shared(folder, owner.pid, sys.executable, tmp_path / "logs", LIGHT)
        parent = SharedParent(cell_env_of("9.0", tmp_path), shared).start()
        assert alive(parent.platform_pid) and alive(parent.pid)
        owner.kill()
        owner.wait()
        assert gone_within([parent.platform_pid, parent.pid]) == []
        parent.close()


def test_a_platform_parent_that_asked_for_the_device_leaves_its_cells_a_parent_of_their_own(
    tmp_path: Path, sharing, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _ = sharing
    (tmp_path / "early.py").write_text(
        "from kvrig.run.emulation import chosen\n"
        "try:\n    SM90 = chosen.device().capability >= (9, 0)\n"
        "except Exception:\n    SM90 = False\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    folder = Path(sharing[0].env("cuda")[PARENTS_ENV])
    shared = Shared(folder, os.getpid(), sys.executable, tmp_path / "logs", ("early",))
    with Pool(preload=LIGHT, log_dir=tmp_path / "logs", sharing=shared) as pool:
        rec = run_cell(cuda_cell("9.0"), tmp_path / "r", pool=pool, env_overrides=FAKE)
        [server] = pool.servers
    assert (rec.exit_code, rec.signal) == (0, None)
    assert isinstance(server, ForkServer)  # the column's own, as a lone column has
    assert shared.refused == {shared.socket_for(cell_env_of("9.0", tmp_path))}
    log = "".join(p.read_text() for p in (tmp_path / "logs").glob("platform-parent-*.log"))
    assert "early.py" in log


def test_a_column_that_left_without_reading_costs_no_parent_its_life(
    tmp_path: Path, sharing
) -> None:
    _, shared = sharing
    env = cell_env_of("9.0", tmp_path)
    first = SharedParent(env, shared).start()
    # A column that only checked the parent answers, gone before reading what it was sent.
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(first.path))
        time.sleep(0.5)  # the parent's ready message arrives, unread
    time.sleep(0.5)
    again = SharedParent(env, shared).start()
    assert again.platform_pid == first.platform_pid and alive(first.platform_pid)
    (tmp_path / "w").mkdir()
    pid = again.spawn(tmp_path / "w", env, tmp_path / "cell.log")
    assert again.poll(pid, 20.0) == 0


def test_the_parent_registers_the_matrix_s_and_the_drafters_model_classes_it_can_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib
    import types
    from dataclasses import dataclass

    @dataclass
    class Lazy:
        module_name: str
        class_name: str

    registered: dict[str, object] = {}

    class Registry:
        models: ClassVar[dict[str, Lazy]] = {
            "GraniteMoeHybridForCausalLM": Lazy("fake_granite", "GraniteMoeHybridForCausalLM"),
            "LlamaForCausalLM": Lazy("fake_llama_not_importable", "LlamaForCausalLM"),
            "Qwen3NextMTP": Lazy("fake_mtp", "Qwen3NextMTP"),
            "Lfm2ForCausalLM": Lazy("fake_lfm2_on_path", "Lfm2ForCausalLM"),
        }

        @staticmethod
        def register_model(arch: str, cls: object) -> None:
            registered[arch] = cls

    granite = types.ModuleType("fake_granite")
    granite.GraniteMoeHybridForCausalLM = type("GraniteMoeHybridForCausalLM", (), {})  # type: ignore[attr-defined]
    registry = types.ModuleType("vllm.model_executor.models.registry")
    registry.ModelRegistry = Registry  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.registry", registry)
    monkeypatch.setitem(sys.modules, "fake_granite", granite)
    mtp = types.ModuleType("fake_mtp")
    mtp.Qwen3NextMTP = type("Qwen3NextMTP", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_mtp", mtp)
    (tmp_path / "fake_lfm2_on_path.py").write_text("class Lfm2ForCausalLM:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_lfm2_on_path", raising=False)
    # A CPU parent (no emulated device): only what its preload imported.
    monkeypatch.delenv("KVRIG_EMULATE", raising=False)
    monkeypatch.delitem(sys.modules, "kvrig.run.registered", raising=False)
    module = importlib.import_module("kvrig.run.registered")
    assert "LlamaForCausalLM" in module.architectures()  # the miniatures name it
    # llama's module does not import: left to vLLM; a drafter vLLM makes is registered too.
    assert module.REGISTERED == ["GraniteMoeHybridForCausalLM", "Qwen3NextMTP"]
    assert "fake_lfm2_on_path" not in sys.modules
    # An emulated device's parent imports the modules it registers.
    monkeypatch.setenv("KVRIG_EMULATE", "cuda:9.0")
    monkeypatch.delitem(sys.modules, "kvrig.run.registered")
    module = importlib.import_module("kvrig.run.registered")
    assert module.REGISTERED == ["GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "Qwen3NextMTP"]
    assert registered == {
        "GraniteMoeHybridForCausalLM": granite.GraniteMoeHybridForCausalLM,
        "Lfm2ForCausalLM": sys.modules["fake_lfm2_on_path"].Lfm2ForCausalLM,
        "Qwen3NextMTP": mtp.Qwen3NextMTP,
    }
    monkeypatch.delitem(sys.modules, "fake_lfm2_on_path")
    assert "?kvrig.run.registered" not in before_a_device(preload_for("cuda", emulated=True))


def test_every_platform_parent_of_a_run_is_forked_from_one_root(tmp_path: Path, sharing) -> None:
    _, shared = sharing
    plain = cell_env_of("9.0", tmp_path)
    invariant = {**plain, "VLLM_BATCH_INVARIANT": "1"}  # read by vLLM at import: its own
    parents = [SharedParent(env, shared).start() for env in (plain, invariant)]
    assert parents[0].platform_pid != parents[1].platform_pid
    roots = {p.forked_from for p in parents}
    assert len(roots) == 1 and alive(next(iter(roots)))
    for parent, env in zip(parents, (plain, invariant), strict=True):
        (tmp_path / "w").mkdir(exist_ok=True)
        pid = parent.spawn(tmp_path / "w", env, tmp_path / "cell.log")
        assert parent.poll(pid, 20.0) == 0
        parent.close()


def test_a_root_that_saw_a_variable_of_vllm_s_read_leaves_each_platform_an_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reads_vllm.py").write_text("import os\nX = os.environ.get('VLLM_X')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with Parents() as parents:
        folder = Path(parents.env("cuda")[PARENTS_ENV])
        logs = tmp_path / "logs"
        shared = Shared(
            folder, os.getpid(), sys.executable, logs, LIGHT, root_preload=("reads_vllm",)
        )
        parent = SharedParent(cell_env_of("9.0", tmp_path), shared).start()
        assert parent.forked_from is None and alive(parent.platform_pid)
        (tmp_path / "w").mkdir()
        env = cell_env_of("9.0", tmp_path)
        assert parent.poll(parent.spawn(tmp_path / "w", env, tmp_path / "c.log"), 20.0) == 0
        parent.close()
    log = "".join(p.read_text() for p in logs.glob("*.log"))
    assert "reads_vllm.py:2 in <module>: looked up VLLM_X in the environment" in log
    assert "starts afresh" in log


def test_the_root_goes_with_its_run(tmp_path: Path) -> None:
    with Parents() as parents:
        folder = Path(parents.env("cuda")[PARENTS_ENV])
        shared = Shared(folder, os.getpid(), sys.executable, tmp_path / "logs", LIGHT,
                        root_preload=ROOT)  # fmt: skip
        parent = SharedParent(cell_env_of("9.0", tmp_path), shared).start()
        root = parent.forked_from
        assert alive(root)
        parent.close()
    assert gone_within([root, parent.platform_pid]) == []


def test_the_benchmark_finds_the_root_and_the_platform_parents_forked_from_it(
    tmp_path: Path, sharing
) -> None:
    _, shared = sharing
    parent = SharedParent(cell_env_of("9.0", tmp_path), shared).start()
    found = serving(os.getpid())
    assert parent.forked_from in found and parent.platform_pid in found
    parent.close()
