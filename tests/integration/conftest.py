"""One pytest test per matrix cell of a platform, each a real vLLM engine in its own process.

The cell's process is owned by kvrig.runner (timeout, memory ceiling, no survivors) and
forked by a warm parent that each pytest(-xdist) worker keeps (kvrig.forkserver), unless
--kvrig-cold asks for a fresh interpreter per cell. This file chooses the cells, hands
each its results folder and parent, decides whether a run resumes an unfinished one,
shows progress, and prints the column's summary at the end.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrig import hardware, report
from kvrig import results as results_mod
from kvrig.forkserver import Pool, die_with_parent
from kvrig.matrix import DEFAULT_MATRIX, PLATFORMS, MatrixError, expand, load
from kvrig.pipeline import ShardError, shard_cells
from kvrig.progress import ProgressPlugin
from kvrig.runner import ResultsFolderError, check_results_folder

RUN_FILE = "run.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvrig")
    group.addoption("--kvrig-platform", choices=PLATFORMS, help="default: this host's platform")
    group.addoption("--kvrig-matrix", default=str(DEFAULT_MATRIX))
    group.addoption("--kvrig-results", default=None, help="default: results/<platform>")
    group.addoption(
        "--kvrig-cold",
        action="store_true",
        help="start each cell in a fresh interpreter instead of forking a warm vLLM parent",
    )
    group.addoption(
        "--kvrig-rerun",
        action="store_true",
        help="start a new run even if the last one did not finish (default: resume it)",
    )
    group.addoption(
        "--kvrig-shard", default=None, help="I/N: run only shard I of N (kvrig.pipeline)"
    )


def _platform(config: pytest.Config) -> str:
    return config.getoption("--kvrig-platform") or hardware.detect_platform()


def _results(config: pytest.Config) -> Path:
    given = config.getoption("--kvrig-results")
    return Path(given or Path("results") / _platform(config)).resolve()


def pytest_configure(config: pytest.Config) -> None:
    if config.option.help or config.option.collectonly:
        return
    platform = _platform(config)
    host = hardware.detect_platform()
    if platform != "cpu" and platform != host:
        needs = (
            "an NVIDIA GPU (nvidia-smi lists none here)"
            if platform == "cuda"
            else "an Intel XPU (no render node in /dev/dri answering xpu-smi or sycl-ls here)"
        )
        raise pytest.UsageError(
            f"The {platform} column needs {needs}, and this host offers only {host}."
            f" Run the {host} column here (nox -s local), or run nox -s {platform} on a host that"
            " has the hardware."
        )
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker goes when the run does (even a SIGKILLed one), and with it
        # its warm parent and that parent's cells; otherwise it would finish its queue.
        die_with_parent()
    else:
        results = _results(config)
        try:
            check_results_folder(results)
        except ResultsFolderError as exc:
            raise pytest.UsageError(str(exc)) from None
        _start_run(config, results)
        workers = int(getattr(config.option, "numprocesses", 0) or 0)
        config.pluginmanager.register(ProgressPlugin(config, max(1, workers)), "kvrig-progress")
    if importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError(
            "vLLM is not installed in this Python environment, so no engine can start. Run the"
            " column through nox (nox -s local or nox -s tests), which installs the platform's"
            " vLLM first."
        )


def _fingerprint(config: pytest.Config) -> str:
    """What must not change for a run to be resumed: the matrix, the selection, the mode."""
    matrix = Path(config.getoption("--kvrig-matrix"))
    h = hashlib.sha256(matrix.read_bytes() if matrix.is_file() else b"")
    selection = [config.getoption(o) for o in ("keyword", "markexpr", "--kvrig-shard")]
    h.update(json.dumps(selection).encode())
    h.update(str(config.getoption("--kvrig-cold")).encode())
    return h.hexdigest()[:16]


def _start_run(config: pytest.Config, results: Path) -> None:
    """Resumes the last run if it did not finish (killed, Ctrl-C) and nothing it depends
    on changed; otherwise starts a new results.jsonl, keeping the previous one beside it.

    A resumed run keeps results.jsonl, and test_cell reuses the record of every cell that
    already has a row there instead of starting its engine again.
    """
    state_file = results / RUN_FILE
    try:
        last = json.loads(state_file.read_text())
    except (OSError, ValueError):
        last = {}
    current = results / results_mod.RESULTS_FILE
    fingerprint = _fingerprint(config)
    resume = (
        not config.getoption("--kvrig-rerun")
        and last.get("state") == "running"
        and last.get("fingerprint") == fingerprint
        and current.exists()
    )
    if resume:
        done = len(results_mod.read(results))
        config.stash[_RESUME_KEY] = (
            f"kvrig: resuming the unfinished run started {last.get('started')}: {done}"
            " cells already done are not run again (kvrig column --rerun starts over)."
        )
    elif current.exists():
        current.replace(results / results_mod.PREVIOUS_FILE)
    started = last.get("started") if resume else time.strftime("%Y-%m-%d %H:%M:%S %Z")
    state = {"state": "running", "started": started, "fingerprint": fingerprint}
    state_file.write_text(json.dumps(state) + "\n")
    config.stash[_RUN_KEY] = state


_RUN_KEY = pytest.StashKey[dict]()
_RESUME_KEY = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str | None:
    return config.stash.get(_RESUME_KEY, None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that was not interrupted is finished: the next one starts over."""
    config = session.config
    state = config.stash.get(_RUN_KEY, None)
    if state is None or exitstatus == pytest.ExitCode.INTERRUPTED:
        return
    state_file = _results(config) / RUN_FILE
    state_file.write_text(json.dumps({**state, "state": "finished"}) + "\n")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    config = metafunc.config
    try:
        matrix = load(config.getoption("--kvrig-matrix"))
    except MatrixError as exc:
        raise pytest.UsageError(str(exc)) from None
    cells = expand(matrix, _platform(config))
    params = []
    for cell in cells:
        marks = [
            getattr(pytest.mark, cell.model.family),
            getattr(pytest.mark, f"expect_{cell.expect.outcome}"),
        ]
        if cell.case.gate:
            marks.append(pytest.mark.gate)
        params.append(pytest.param(cell, id=cell.id, marks=marks))
    metafunc.parametrize("cell", params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--kvrig-shard keeps one deterministic part of the column (same in every xdist worker)."""
    shard = config.getoption("--kvrig-shard")
    if not shard:
        return
    ids = [c.id for c in expand(load(config.getoption("--kvrig-matrix")), _platform(config))]
    try:
        mine = shard_cells(ids, shard)
    except ShardError as exc:
        raise pytest.UsageError(str(exc)) from None
    cell_of = {i: getattr(i, "callspec", None) for i in items}
    keep = [i for i in items if (c := cell_of[i]) is None or c.params["cell"].id in mine]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture(scope="session")
def results_dir(pytestconfig: pytest.Config) -> Path:
    path = _results(pytestconfig)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def cell_pool(pytestconfig: pytest.Config, results_dir: Path) -> Iterator[Pool]:
    """This worker's warm vLLM parent(s), started at its first cell; cold mode uses a
    parent that execs a fresh interpreter per cell, with the same supervision."""
    pool = Pool(warm=not pytestconfig.getoption("--kvrig-cold"), log_dir=results_dir / "logs")
    yield pool
    pool.close()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if config.option.collectonly or hasattr(config, "workerinput"):
        return
    results = _results(config)
    rows = results_mod.read(results)
    if not rows:
        return
    try:
        order = {c.id: i for i, c in enumerate(expand(load(config.getoption("--kvrig-matrix"))))}
    except MatrixError:
        order = {}
    rows.sort(key=lambda r: order.get(r["cell_id"], len(order)))
    md, page = report.write(results)
    tr = terminalreporter
    tr.section(f"kvrig {_platform(config)} column")
    tr.write_line(report.terminal(rows))
    tr.write_line(f"results: {results}/results.jsonl (records/, logs/, junit.xml)")
    tr.write_line(f"report:  {md}  {page}")
