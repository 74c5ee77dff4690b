"""Faults done for real: cells that crash, hang or leak a child, a runner killed with
SIGKILL and a column stopped with Ctrl-C. Each asserts that no record is lost or corrupt
and that no process is left behind.

Most cells here misbehave through kvrig.run.cell's test hook (KVRIG_TEST_FAULT) instead of
starting an engine, so the faults are real (a real SIGILL, a real orphan, a real kill)
and quick; the last tests fork real vLLM engines from a warm parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrig.define.cells import Cell, expand
from kvrig.define.matrix import load
from kvrig.publish import results as results_mod
from kvrig.run import procs
from kvrig.run.cell import FAULT_ENV, ORPHAN_PID_FILE
from kvrig.run.forkserver import Pool
from kvrig.run.record import Record
from kvrig.run.runner import Paths, run_cell

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"

ROOT = Path(__file__).resolve().parents[2]
LIGHT = ("kvrig.run.cell",)
TOKEN_ENV = "KVRIG_FAULT_TEST_TOKEN"  # a warm parent without vLLM: forks exactly like the real one


def cells() -> dict[str, Cell]:
    return {c.id: c for c in expand(load(DEFAULT_MATRIX), "cpu")}


def a_cell(n: int = 0) -> Cell:
    runnable = [c for c in cells().values() if c.expect.outcome != "skip"]
    return runnable[n]


def with_token(token: str) -> list[int]:
    """Live processes whose environment carries the run's token (everything it started)."""
    return procs.with_env(TOKEN_ENV, token)


def wait_for(condition, seconds: float) -> bool:
    """True once the condition holds, False if it still does not after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def gone_within(pids_of, seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := pids_of()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    p = Pool(warm=True, preload=LIGHT, log_dir=tmp_path / "server-logs")
    yield p
    p.close()


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch):
    def set_fault(value: str) -> None:
        monkeypatch.setenv(FAULT_ENV, value)

    return set_fault


def test_sigill_is_a_crash_with_signal_and_log_tail(tmp_path: Path, pool: Pool, fault) -> None:
    fault("sigill")
    rec = run_cell(a_cell(), tmp_path, pool=pool)
    assert rec.outcome == "crashed"
    assert rec.signal == "SIGILL"
    assert "kvrig test fault: sigill" in Path(rec.log or "").read_text()
    assert Record.load(Paths(tmp_path, rec.cell_id).record).outcome == "crashed"


def test_a_crash_leaves_the_cell_beside_it_alone(tmp_path: Path) -> None:
    # Two cells side by side, as two workers run them; one dies of SIGILL mid-way. Each
    # cell's fault is its own environment's, so neither depends on when the other starts.
    crash, calm = a_cell(0), a_cell(1)
    out: dict[str, Record] = {}

    def run(cell: Cell, results: Path, fault: str) -> None:
        with Pool(warm=True, preload=LIGHT) as p:
            out[cell.id] = run_cell(cell, results, pool=p, env_overrides={FAULT_ENV: fault})

    t = threading.Thread(target=run, args=(calm, tmp_path / "calm", "fake:3"))
    t.start()
    calm_log = Paths(tmp_path / "calm", calm.id).log
    started = wait_for(lambda: calm_log.is_file() and "fake:3" in calm_log.read_text(), 60)
    assert started, "the calm cell never started"
    run(crash, tmp_path / "crash", "sigill")
    t.join()
    assert out[crash.id].outcome == "crashed"
    assert out[calm.id].outcome == "ran"
    assert out[calm.id].signal is None


def test_the_parent_survives_a_crash_and_is_replaced_if_it_dies(
    tmp_path: Path, pool: Pool, fault
) -> None:
    fault("sigill")
    assert run_cell(a_cell(), tmp_path, pool=pool).outcome == "crashed"
    fault("fake:0")
    first = pool.get(dict(os.environ))
    assert run_cell(a_cell(), tmp_path, pool=pool).outcome == "ran"
    os.kill(first.pid or 0, signal.SIGKILL)
    time.sleep(0.3)
    assert run_cell(a_cell(), tmp_path, pool=pool).outcome == "ran"


def test_one_warm_parent_serves_every_cell_of_a_worker(
    tmp_path: Path, pool: Pool, fault, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault("fake:0")
    for n in range(3):  # pytest sets PYTEST_CURRENT_TEST anew for every test
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"test_cell[{n}] (call)")
        assert run_cell(a_cell(n), tmp_path, pool=pool).outcome == "ran"
    assert len(pool.servers) == 1


def test_timeout_kills_the_whole_process_group(tmp_path: Path, pool: Pool, fault) -> None:
    fault("orphan:300")  # a leaked child and a cell that never ends
    started = time.monotonic()
    rec = run_cell(a_cell(), tmp_path, pool=pool, timeout_s=3)
    assert rec.outcome == "timeout"
    assert "killed after" in (rec.note or "")
    assert time.monotonic() - started < 30
    orphan = int((Paths(tmp_path, rec.cell_id).workdir / ORPHAN_PID_FILE).read_text())
    assert not procs.alive(orphan)
    assert procs.session_pids(orphan) == []


def test_a_child_that_would_outlive_its_cell_is_killed(tmp_path: Path, pool: Pool, fault) -> None:
    fault("orphan:0")
    rec = run_cell(a_cell(), tmp_path, pool=pool)
    assert rec.outcome == "ran"
    orphan = int((Paths(tmp_path, rec.cell_id).workdir / ORPHAN_PID_FILE).read_text())
    assert gone_within(lambda: [orphan] if procs.alive(orphan) else [], 5) == []


def test_cold_mode_has_the_same_supervision(tmp_path: Path, fault) -> None:
    fault("orphan:300")
    with Pool(warm=False) as p:
        rec = run_cell(a_cell(), tmp_path, pool=p, timeout_s=3)
    assert rec.outcome == "timeout"
    orphan = int((Paths(tmp_path, rec.cell_id).workdir / ORPHAN_PID_FILE).read_text())
    assert not procs.alive(orphan)


# --- whole columns, killed and interrupted --------------------------------------------------

SELECT = "granite_hybrid"


def column(results: Path, token: str, fault_spec: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, FAULT_ENV: fault_spec, TOKEN_ENV: token}
    env.pop("PYTEST_XDIST_WORKER", None)
    args = [sys.executable, "-m", "kvrig", "column", "--platform", "cpu", "--cold"]
    args += ["--results", str(results), "--", "-k", SELECT, "-p", "no:cacheprovider", *extra]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, like a job in a terminal
        # and Ctrl-C's default meaning, even if this test runs as a background job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_records(results: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while len(list((results / "records").glob("*.json"))) < n:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "no record within two minutes"
        time.sleep(0.1)


def assert_intact(results: Path) -> list[dict]:
    """Every results row has a record that reads back, and no record file is torn."""
    rows = []
    for line in (results / results_mod.RESULTS_FILE).read_text().splitlines():
        rows.append(json.loads(line))  # a torn line would raise here
    for path in (results / "records").glob("*.json"):
        Record.load(path)
    for row in rows:
        assert (results / "records" / f"{row['cell_id']}.json").exists()
    assert not list((results / "records").glob("*.tmp"))
    return rows


@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigkill_of_the_runner_leaves_nothing_and_the_rerun_resumes(
    tmp_path: Path, workers: str
) -> None:
    results, token = tmp_path / "res", uuid.uuid4().hex
    proc = column(results, token, "orphan:1.5", "-n", workers)
    wait_for_records(results, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone_within(lambda: with_token(token)) == []
    first = {r["cell_id"] for r in assert_intact(results)}
    assert first, "no cell finished before the kill"

    again = column(results, token, "fake:0", "-n", workers)
    output = again.communicate(timeout=300)[0].decode()
    assert "resuming the unfinished run" in output
    rows = assert_intact(results)
    ids = [r["cell_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a cell was recorded twice"
    assert set(ids) == {c for c in cells() if SELECT in c}
    for cid in first:  # finished before the kill: kept, not run again
        assert "orphan:1.5" in (results / "logs" / f"{cid}.log").read_text()
    assert any("fake:0" in (results / "logs" / f"{c}.log").read_text() for c in set(ids) - first)
    assert gone_within(lambda: with_token(token)) == []


def test_ctrl_c_stops_cleanly_and_keeps_finished_records(tmp_path: Path) -> None:
    results, token = tmp_path / "res", uuid.uuid4().hex
    proc = column(results, token, "orphan:2", "-n", "2")
    wait_for_records(results, 1, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the foreground job
    proc.communicate(timeout=90)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED
    assert gone_within(lambda: with_token(token)) == []
    rows = assert_intact(results)
    assert rows
    assert len(rows) < len({c for c in cells() if SELECT in c})
    assert json.loads((results / "run.json").read_text())["state"] == "running"


def test_an_unwritable_results_folder_stops_before_any_cell(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = subprocess.run(
        [sys.executable, "-m", "kvrig", "column", "--results", str(blocker / "res")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "cannot be written" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# --- through the real warm vLLM parent -------------------------------------------------------


def test_warm_cells_are_isolated_from_each_other(tmp_path: Path) -> None:
    """A crafted cell, a crash and a plain cell forked in turn from one warm vLLM parent:
    the plain cell's record shows the stock backend and size, none of the crafted one."""
    all_cells = cells()
    crafted = all_cells["cpu-granite_hybrid-sibling_rejects"]
    plain = all_cells["cpu-granite_hybrid-default"]
    with Pool(warm=True, log_dir=tmp_path / "logs") as p:
        rec = run_cell(crafted, tmp_path, pool=p)
        assert rec.outcome == "error"
        assert "KVRIG_SIBLING" in (rec.error.message if rec.error else "")
        os.environ[FAULT_ENV] = "sigill"
        try:
            assert run_cell(plain, tmp_path / "crash", pool=p).outcome == "crashed"
        finally:
            del os.environ[FAULT_ENV]
        rec = run_cell(plain, tmp_path, pool=p)
        server = p.servers[0]
    assert server.import_s is not None
    assert rec.outcome == "ran"
    assert rec.error is None
    assert rec.tokens_generated > 0
    assert rec.timings["import_s"] < 1.0, "the cell imported vLLM itself: not warm"
    assert "KVRIG_SIBLING" not in json.dumps(rec.layer_backends)
    # The probe (KVRIG_PROBE_FILE, set per cell) reached the engine forked for this cell.
    assert rec.worker_block_size is not None
    assert rec.worker_block_size == rec.engine_block_size


def test_a_warm_parent_that_cannot_preload_or_holds_a_thread_fails_fast(tmp_path: Path) -> None:
    from kvrig.run.forkserver import ServerError

    (tmp_path / "kvrig_thread_at_import.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True, name='held').start()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for preload, said in (
        (("kvrig.run.cell", "kvrig_no_such_module"), "could not import kvrig_no_such_module"),
        (("kvrig.run.cell", "kvrig_thread_at_import"), "holds Python threads after its imports"),
    ):
        with Pool(warm=True, preload=preload, log_dir=tmp_path / "logs") as p:
            with pytest.raises(ServerError) as err:
                p.get(env)
            assert said in str(err.value)
            assert "--cold" in str(err.value)
            assert p.servers == []  # nothing half-started is kept
