"""One pytest test per matrix cell of a platform, each a real vLLM engine in its own process.

The cell's process is owned by kvrig.runner (timeout, memory ceiling, no survivors); this
file only chooses the cells, hands each its results folder, and prints the column's
summary at the end.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvrig import hardware, report
from kvrig import results as results_mod
from kvrig.matrix import DEFAULT_MATRIX, PLATFORMS, MatrixError, expand, load
from kvrig.pipeline import ShardError, shard_cells


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvrig")
    group.addoption("--kvrig-platform", choices=PLATFORMS, help="default: this host's platform")
    group.addoption("--kvrig-matrix", default=str(DEFAULT_MATRIX))
    group.addoption("--kvrig-results", default=None, help="default: results/<platform>")
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
    if not hasattr(config, "workerinput"):
        _start_results(_results(config))
    if importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError(
            "vLLM is not installed in this Python environment, so no engine can start. Run the"
            " column through nox (nox -s local or nox -s tests), which installs the platform's"
            " vLLM first."
        )


def _start_results(results: Path) -> None:
    """A new run starts a new results.jsonl; the previous one is kept beside it."""
    current = results / results_mod.RESULTS_FILE
    if current.exists():
        current.replace(results / ("previous-" + results_mod.RESULTS_FILE))


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
