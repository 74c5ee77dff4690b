"""The runner's process handling, with stand-in cell processes instead of vLLM."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from kvrig.column.one_cell import finished_record
from kvrig.run.cell import FAULT_ENV
from kvrig.run.forkserver import Pool, env_key, server_env
from kvrig.run.procs import kill_session, session_pids
from kvrig.run.runner import ResultsFolderError, check_results_folder, run_cell

from ..builders import cell_with

CELL = cell_with({"outcome": "runs"})


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for `python -m kvrig.run.cell WORKDIR` ($3 is WORKDIR)."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/bash\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_timeout_kills_the_whole_session(tmp_path: Path) -> None:
    # The cell forks a grandchild into the background, as vLLM's engine core does.
    py = fake_python(tmp_path, 'sleep 300 &\necho $! > "$3/child.pid"\nsleep 300')
    rec = run_cell(CELL, tmp_path / "res", timeout_s=1.5, python=py)
    assert rec.outcome == "timeout"
    assert "killed after" in rec.note
    child = int((tmp_path / "res/cells" / CELL.id / "child.pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    saved = json.loads((tmp_path / "res/records" / f"{CELL.id}.json").read_text())
    assert saved["outcome"] == "timeout"


def test_a_signal_death_is_a_crash(tmp_path: Path) -> None:
    py = fake_python(tmp_path, "echo dying; kill -ILL $$")
    rec = run_cell(CELL, tmp_path / "res", timeout_s=30, python=py)
    assert rec.outcome == "crashed"
    assert rec.signal == "SIGILL"
    assert "dying" in Path(rec.log).read_text()


def test_a_finished_cell_that_lingers_is_ended(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("kvrig.run.runner.EXIT_GRACE_S", 0.5)
    body = (
        'echo \'{"pid": 1, "tokens_generated": 2, "engine_block_size": 384}\''
        ' > "$3/frontend.json"\nsleep 300'
    )
    started = time.monotonic()
    rec = run_cell(CELL, tmp_path / "res", timeout_s=60, python=fake_python(tmp_path, body))
    assert time.monotonic() - started < 30
    assert rec.signal is None
    assert rec.tokens_generated == 2
    assert rec.outcome == "ran"  # the summary was written; the kill was only cleanup


def test_memory_ceiling(tmp_path: Path) -> None:
    py = fake_python(
        tmp_path, "exec python3 -c 'x = bytearray(300 * 2**20); import time; time.sleep(60)'"
    )
    rec = run_cell(CELL, tmp_path / "res", timeout_s=60, memory_limit_gb=0.1, python=py)
    assert rec.outcome == "memory"
    assert rec.peak_rss_mb > 100


def test_skip_cells_do_not_start_a_process(tmp_path: Path) -> None:
    cell = cell_with({"outcome": "skip", "reason": "needs AMX"})
    rec = run_cell(cell, tmp_path, python="/nonexistent")
    assert rec.outcome == "skipped"
    assert rec.skip_reason == "needs AMX"


def test_a_warm_parent_forks_each_cell_and_reports_how_it_ended(tmp_path: Path) -> None:
    # The cell's own test hook stands in for vLLM; the parent preloads only the cell module.
    with Pool(preload=("kvrig.run.cell",), log_dir=tmp_path / "server-logs") as pool:
        ran = run_cell(CELL, tmp_path / "calm", pool=pool, env_overrides={FAULT_ENV: "fake:0"})
        crashed = run_cell(CELL, tmp_path / "ill", pool=pool, env_overrides={FAULT_ENV: "sigill"})
        (server,) = pool.servers  # the hook is read after the fork: one parent for both
        pid = server.pid
    assert (ran.outcome, ran.signal, ran.exit_code) == ("ran", None, 0)
    assert (crashed.outcome, crashed.signal) == ("crashed", "SIGILL")
    assert "kvrig test fault: sigill" in Path(crashed.log).read_text()
    assert pid is not None
    assert not Path(f"/proc/{pid}").exists()  # closing the pool ended (and reaped) it


@pytest.mark.parametrize("max_servers", [1, 2])
def test_a_pool_of_one_parent_ends_the_one_it_left_when_another_is_asked_for(
    tmp_path: Path, max_servers: int
) -> None:
    fake = {FAULT_ENV: "fake:0"}
    with Pool(preload=("kvrig.run.cell",), max_servers=max_servers) as pool:
        run_cell(CELL, tmp_path / "a", pool=pool, env_overrides=fake)
        (first,) = pool.servers
        # A variable read at import: a parent of its own.
        other = {**fake, "KVRIG_ORDER_TEST": "1"}
        assert run_cell(CELL, tmp_path / "b", pool=pool, env_overrides=other).outcome == "ran"
        assert len(pool.servers) == max_servers
        assert first.alive() == (max_servers == 2)


def test_kill_session_of_nothing_returns() -> None:
    assert session_pids(2**22 + 12345) == []
    kill_session(2**22 + 12345)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc (Linux)")
def test_session_pids_finds_this_session() -> None:
    assert os.getpid() in session_pids(os.getsid(0))


def test_results_folder_that_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ResultsFolderError, match="cannot be written"):
        check_results_folder(blocker / "results")


def test_results_folder_on_a_full_disk(tmp_path: Path) -> None:
    with pytest.raises(ResultsFolderError, match="MB free"):
        check_results_folder(tmp_path, min_free_mb=2**40)
    check_results_folder(tmp_path, min_free_mb=0)
    assert (tmp_path / "records").is_dir()
    assert not list(tmp_path.glob(".kvrig*"))


def test_finished_record_needs_a_row_and_a_readable_record(tmp_path: Path) -> None:
    rec = run_cell(cell_with({"outcome": "skip", "reason": "r"}), tmp_path, python="/x")
    assert finished_record(tmp_path, rec.cell_id) is None  # no results row yet
    (tmp_path / "results.jsonl").write_text(json.dumps({"cell_id": rec.cell_id}) + "\n")
    assert finished_record(tmp_path, rec.cell_id) == rec
    (tmp_path / "records" / f"{rec.cell_id}.json").write_text("{torn")
    assert finished_record(tmp_path, rec.cell_id) is None


def test_env_key_ignores_only_what_is_read_after_the_fork() -> None:
    a = {"VLLM_TARGET_DEVICE": "cpu", "KVRIG_CRAFT": "x", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    b = {**a, "KVRIG_CRAFT": "y", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert env_key(a) == env_key(b)
    assert env_key(a) != env_key({**a, "VLLM_CPU_KVCACHE_SPACE": "2"})
    assert env_key(a) == env_key({**a, "VLLM_KV_CACHE_LAYOUT": "BLHNC"})  # read as planned
    assert env_key(a) != env_key({**a, "VLLM_BATCH_INVARIANT": "1"})  # read at import
    assert server_env(a) == {"VLLM_TARGET_DEVICE": "cpu"}


def test_a_warm_parent_missing_a_preload_or_holding_python_threads_is_unfit() -> None:
    from kvrig.run.forkserver import preload_for, unfit

    assert unfit({"ready": 1, "missing": [], "python_threads": []}) is None
    missing = unfit({"missing": ["vllm.v1.worker.cpu_worker (ImportError: nope)"]})
    assert missing == "could not import vllm.v1.worker.cpu_worker (ImportError: nope)"
    threads = unfit({"missing": [], "python_threads": ["Thread-1 (logger)"]})
    assert threads == "holds Python threads after its imports (Thread-1 (logger))"
    # The CPU worker's modules are preloaded for the CPU column only.
    assert "vllm.v1.worker.cpu_worker" in preload_for("cpu")
    assert "vllm.v1.worker.cpu_worker" not in preload_for("cuda")


def test_a_cell_over_both_limits_is_ended_for_its_memory() -> None:
    from kvrig.run.runner import _Limits, _over_limit

    limits = _Limits(timeout_s=10, memory_mb=100)
    assert _over_limit(50, 5, limits) is None
    assert _over_limit(100, 10, limits) is None  # at a limit is still within it
    assert _over_limit(101, 5, limits) == "memory"
    assert _over_limit(50, 11, limits) == "timeout"
    assert _over_limit(101, 11, limits) == "memory"


def test_only_the_cleanup_kill_of_a_finished_cell_is_not_its_signal() -> None:
    from kvrig.run.runner import _signal_name

    assert _signal_name(-9, finished=True, ended_by=None) is None
    assert _signal_name(-9, finished=False, ended_by=None) == "SIGKILL"
    assert _signal_name(-9, finished=True, ended_by="timeout") == "SIGKILL"
    assert _signal_name(-4, finished=True, ended_by=None) == "SIGILL"
    assert _signal_name(1, finished=False, ended_by=None) is None
    assert _signal_name(None, finished=False, ended_by=None) is None


def test_the_note_says_why_the_runner_ended_a_cell() -> None:
    from kvrig.run.runner import _Ending, _ending_note, _Limits

    limits = _Limits(timeout_s=30, memory_mb=2048)
    timed_out = _Ending(code=-9, ended_by="timeout", peak_mb=10, elapsed_s=31)
    assert _ending_note(timed_out, limits, "timeout", "SIGKILL") == "killed after 30 s"
    too_big = _Ending(code=-9, ended_by="memory", peak_mb=3000.4, elapsed_s=3)
    assert _ending_note(too_big, limits, "memory", "SIGKILL") == (
        "killed at 3000 MB (limit 2048 MB)"
    )
    died = _Ending(code=3, ended_by=None, peak_mb=10, elapsed_s=3)
    assert _ending_note(died, limits, "crashed", None) == (
        "process ended with exit code 3 before writing its summary"
    )
    assert "with SIGILL before" in (_ending_note(died, limits, "crashed", "SIGILL") or "")
    assert _ending_note(died, limits, "error", None) is None


def test_the_warm_parent_s_log_names_the_preloads_its_vllm_does_not_have(capsys) -> None:
    import io

    from kvrig.run.forkserver import _announce, ready_message

    ready = {**ready_message(1.0, []), "absent": ["vllm.v1.worker.cpu_model_runner"]}
    _announce(io.StringIO(), ready)
    line = capsys.readouterr().err
    assert (
        "preloads this vLLM does not have (not preloaded): vllm.v1.worker.cpu_model_runner" in line
    )
    _announce(io.StringIO(), ready_message(1.0, []))
    assert "does not have (not preloaded): none" in capsys.readouterr().err


def test_a_vllm_module_the_release_dropped_is_no_reason_to_refuse_every_cell() -> None:
    from kvrig.run.forkserver import gone_from_vllm, import_preload

    dropped = ModuleNotFoundError("No module named 'vllm.v1.worker.gpu'", name="vllm.v1.worker.gpu")
    assert gone_from_vllm("vllm.v1.worker.gpu.attn_utils", dropped)
    assert gone_from_vllm("vllm.v1.worker.gpu", dropped)
    # A module that is there but fails inside (a missing dependency) still stops the column.
    inside = ModuleNotFoundError("No module named 'flashinfer'", name="flashinfer")
    assert not gone_from_vllm("vllm.v1.attention.backends.flashinfer", inside)
    assert not gone_from_vllm("kvrig.x", ModuleNotFoundError("x", name="kvrig.x"))
    assert not gone_from_vllm("vllm.a", ImportError("cannot import name 'b'"))
    assert import_preload(("json", "kvrig_no_such_module_here")) == [
        "kvrig_no_such_module_here (ModuleNotFoundError: No module named"
        " 'kvrig_no_such_module_here')"
    ]
