"""The coverage a reach run starts in a cell's process: nothing unless KVRIG_REACH is set,
then the cell, a child that ends in os._exit and a spawned process all measured, since a
branch may be taken in any of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kvrig.publish.reach import measured
from kvrig.run import reach

CELL = "cuda-sm90-emulated-granite_hybrid-default"
MODULE = """\
def parent():
    return 1


def child():
    return 2


def spawned():
    return 3
"""
SCRIPT = textwrap.dedent(
    """\
    import os, subprocess, sys
    from pathlib import Path
    from kvrig.run import reach
    with reach.measured(Path(sys.argv[1])):
        from vllm.platforms import interface
        interface.parent()
        pid = os.fork()
        if pid == 0:  # as an emulated tensor-parallel rank ends
            interface.child()
            os._exit(0)
        os.waitpid(pid, 0)
        # An engine core that outlives the cell's work until asked to end (vLLM's turn
        # SIGTERM into SystemExit).
        spawn = (
            "import signal, sys, time\\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\\n"
            "from vllm.platforms import interface\\n"
            "interface.spawned()\\n"
            "print('ready', flush=True)\\n"
            "time.sleep(60)\\n"
        )
        core = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE)
        core.stdout.readline()
    os._exit(0)  # as a cell ends, after writing its summary
    """
)


def stand_in(tmp_path: Path) -> tuple[Path, Path]:
    """A vllm package holding platforms/interface.py, and a cell's definition file laid
    out as a column's results folder holds it."""
    package = tmp_path / "site" / "vllm"
    (package / "platforms").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "platforms" / "__init__.py").write_text("")
    (package / "platforms" / "interface.py").write_text(MODULE)
    cell_file = tmp_path / "results" / "cells" / CELL / "cell.json"
    cell_file.parent.mkdir(parents=True)
    cell_file.write_text(json.dumps({"platform": "cuda"}))
    return package, cell_file


def run_cell(tmp_path: Path, reach_env: dict[str, str]) -> Path:
    package, cell_file = stand_in(tmp_path)
    path = os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")])
    inherited = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START", reach.REACH_ENV)
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env.update({"PYTHONPATH": path, **reach_env})
    subprocess.run([sys.executable, "-c", SCRIPT, str(cell_file)], env=env, check=True)
    return tmp_path / "results"


def test_nothing_is_measured_unless_the_reach_run_asks(tmp_path: Path) -> None:
    results = run_cell(tmp_path, {})
    assert not reach.data_folder(results).exists()


def test_the_cell_its_forked_child_and_its_spawned_process_are_each_saved(tmp_path: Path) -> None:
    rc = reach.write_rc(tmp_path / "reach")
    assert "*/vllm/platforms/interface.py" in rc.read_text()
    results = run_cell(tmp_path, {reach.REACH_ENV: str(rc)})
    column = measured.read_column(results)
    (cell,) = column.cells
    assert cell.id == CELL and cell.platform == "cuda" and not column.unmeasured
    # The cell, its forked child, the process it spawned; the child may also save the
    # cell's own data from before the fork, once more, under its own pid.
    assert cell.processes >= 3
    lines = {b for _, b in cell.arcs["platforms/interface.py"] if b > 0}
    assert {2, 6, 10} <= lines  # parent(), child() and spawned() ran, each measured
    assert cell.vllm_root == str(tmp_path / "site" / "vllm")


def test_the_settings_measure_the_tables_files_with_raw_arcs() -> None:
    text = reach.rc_text(["platforms/interface.py", "v1/worker/utils.py"])
    assert "branch = true" in text and "core = ctrace" in text and "parallel = true" in text
    assert "*/vllm/v1/worker/utils.py" in text
    for patch in ("_exit", "fork", "subprocess"):
        assert f"    {patch}\n" in text
