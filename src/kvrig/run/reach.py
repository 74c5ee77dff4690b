"""Coverage of vLLM's block-size code in a cell's processes, when `kvrig check reach` asks.

Off unless KVRIG_REACH names coverage.py's settings file; then coverage.py measures only
the branch table's vLLM files (kvrig.define.reach_table) with raw arcs, in the cell's
process and in every process it forks or vLLM spawns, each asked to exit normally so that
it saves. The data go to the column's results folder (`coverage/`), named by cell id, so
the report can name a cell that took an arm.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kvrig.define import reach_table

REACH_ENV = "KVRIG_REACH"
RC_FILE = "coveragerc"
DATA_FOLDER = "coverage"  # in a column's results folder
DATA_SUFFIX = ".cov"  # <cell id>.cov.<host>.pid<pid>.X<random>x, one per process
META_SUFFIX = ".json"  # <cell id>.json: the cell's vLLM, its platform, or what failed


def rc_text(files: Sequence[str]) -> str:
    """coverage.py's settings (pure): raw arcs with the C tracer, whose arcs keep the lines
    inside a statement; vLLM's given files only, wherever vLLM is installed."""
    include = "".join(f"\n    */vllm/{f}" for f in files)
    return (
        "[run]\n"
        "branch = true\n"
        "parallel = true\n"
        "core = ctrace\n"
        "patch =\n    _exit\n    fork\n    subprocess\n"
        f"include ={include}\n"
        "disable_warnings =\n    no-data-collected\n    module-not-measured\n"
        "    module-not-imported\n    no-ctracer\n"
    )


def write_rc(folder: Path) -> Path:
    """The settings file every cell of a reach run starts coverage.py from (KVRIG_REACH)."""
    folder.mkdir(parents=True, exist_ok=True)
    rc = folder / RC_FILE
    rc.write_text(rc_text(reach_table.load().files))
    return rc


def data_name(cell_id: str) -> str:
    return cell_id + DATA_SUFFIX


def data_folder(results: Path) -> Path:
    return results / DATA_FOLDER


@contextlib.contextmanager
def measured(cell_file: Path) -> Iterator[None]:
    """Coverage of the body, saved before it returns, when KVRIG_REACH is set; the cell is
    the one whose definition `cell_file` is, in <results>/cells/<cell id>/ (as
    kvrig.run.runner lays a column out)."""
    rc = os.environ.get(REACH_ENV)
    if not rc:
        yield
        return
    cell_id = cell_file.parent.name
    folder = data_folder(cell_file.parent.parent.parent)
    folder.mkdir(parents=True, exist_ok=True)
    platform = json.loads(cell_file.read_text()).get("platform")
    meta: dict[str, Any] = {"cell": cell_id, "platform": platform, "pid": os.getpid()}
    cov = _start(Path(rc), folder / data_name(cell_id), meta)
    try:
        yield
    finally:
        _end_children()
        if cov is not None:
            cov.stop()
            cov.save()
        meta.update(_vllm_of_process())
        (folder / (cell_id + META_SUFFIX)).write_text(json.dumps(meta))


def _end_children(timeout_s: float = 20.0) -> None:
    """The processes the cell started (a multiprocess engine's core and workers) asked to
    end, so that each exits normally and saves its coverage; any still there after
    `timeout_s` is left to the runner, which kills the cell's session."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    psutil.wait_procs(children, timeout=timeout_s)


def _start(rc: Path, data_file: Path, meta: dict[str, Any]) -> Any:
    """coverage.py started for the cell, or None with what kept it off in `meta` (the
    report then says that cell was not measured, and why)."""
    try:
        import coverage
    except ImportError as exc:
        meta["error"] = f"coverage.py is not installed in {sys.prefix} ({exc})"
        return None
    cov = coverage.Coverage(data_file=str(data_file), config_file=str(rc))
    cov.start()
    meta["coverage"] = coverage.__version__
    return cov


def _vllm_of_process() -> dict[str, Any]:
    """The vLLM this process ran: the report finds each arm in that vLLM's own source."""
    vllm = sys.modules.get("vllm")
    if vllm is None or not getattr(vllm, "__file__", None):
        return {"vllm": None, "vllm_root": None}
    return {
        "vllm": getattr(vllm, "__version__", None),
        "vllm_root": str(Path(vllm.__file__).parent),
    }
