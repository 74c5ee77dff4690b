"""kvrig's pytest plugin (entry point `pytest11: kvrig`): a column of matrix.yaml as tests.

    pytest -p kvrig matrix.yaml [--kvrig-platform cpu] [--kvrig-isa avx2] [-n 2] [-k ...]
    kvrig column [--platform cpu] [--isa avx2] [pytest args...]      # the same, set up

Inert unless the command line names a matrix file, so installed beside other tests it
changes nothing. The hooks alone: the run they share with the items is
kvrig.column.column_run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from kvrig.column import column_run, progress, resume, run_order
from kvrig.column.column_run import COLUMN_KEY, column_facts
from kvrig.column.items import CellItem, MatrixFile
from kvrig.define import column_choice, column_options
from kvrig.define.matrix import MatrixError
from kvrig.define.vllm_models import Family
from kvrig.host import device
from kvrig.provision import libcuda_stub
from kvrig.publish import pipeline, report
from kvrig.publish import results as results_mod
from kvrig.run.emulation.wheel import EmulationError
from kvrig.run.fork_loop import die_with_parent
from kvrig.run.runner import ResultsFolderError, check_results_folder

MARKERS = {
    Family.HYBRID_MAMBA: "cells of hybrid Mamba2 models (GraniteMoeHybrid, NemotronH, FalconH1)",
    Family.GDN: "cells of gated-delta-net models (Qwen3-Next, Qwen3.5)",
    Family.DSA: "cells of DeepSeek sparse attention models (DeepSeek-V3.2)",
    Family.DENSE: "cells of non-hybrid control models",
    Family.MLA: "cells of dense multi-head latent attention models (DeepSeek-V3)",
    Family.SHORT_CONV: "cells of short-convolution hybrids (LFM2)",
    Family.HYBRID_MLA: "cells of MLA beside Kimi delta attention (Kimi-Linear)",
    Family.MAMBA: "cells of attention-free Mamba2 models",
    "gate": "cells that gate a release",
    "expect_runs": "cells expected to run and generate",
    "expect_early_error": "cells expected to fail early in _check_aligned_block_size",
    "expect_late_error": "cells expected to fail after KV-cache sizing",
    "expect_unsupported": "cells expected to hit a platform's not-supported error",
    "expect_skip": "cells the matrix skips, with a reason",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvrig", "kvrig: a column of matrix.yaml on real vLLM engines")
    column_options.declare(group.addoption, column_options.PYTEST)
    group.addoption(
        "--kvrig-cell",
        action="append",
        default=[],
        help="run exactly this cell (an id, repeatable); -k also matches ids it is part of",
    )


def _matrix_args(args: list[str]) -> list[Path]:
    found = []
    for arg in args:
        path = Path(arg.split("::", 1)[0])
        if path.suffix in (".yaml", ".yml") and path.is_file():
            found.append(path)
    return found


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    matrices = _matrix_args(list(config.args))
    if not matrices or config.option.help:
        return
    if len(matrices) > 1:
        raise pytest.UsageError(
            f"A column run takes one matrix file; got {', '.join(map(str, matrices))}."
        )
    try:
        run = column_run.from_config(config, matrices[0])
    except (
        MatrixError,
        column_choice.ChoiceError,
        EmulationError,
        libcuda_stub.StubError,
    ) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[COLUMN_KEY] = run
    if config.option.collectonly:
        return
    if importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError(
            "vLLM is not installed in this Python environment, so no engine can start. Run the"
            " column through nox (nox -s local or nox -s tests), which installs the platform's"
            " vLLM first."
        )
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker goes when the run does (even a SIGKILLed one), and with it
        # its warm parent and that parent's cells; otherwise it would finish its queue.
        die_with_parent()
        run.resumed = bool(config.workerinput.get("kvrig_resumed"))
        run.prestart()
        return
    try:
        check_results_folder(run.results)
    except ResultsFolderError as exc:
        raise pytest.UsageError(str(exc)) from None
    parts = resume.fingerprint(
        matrices[0],
        {
            "keyword": config.getoption("keyword"),
            "markexpr": config.getoption("markexpr"),
            "shard": config.getoption("--kvrig-shard"),
            "cells": sorted(config.getoption("--kvrig-cell")),
            "cold": run.cold,
            # The release run, not how it was asked for: `--vllm 0.34.0` where 0.34.0 is
            # the pin resumes the plain column (the release check's pinned side does).
            "vllm": run.named.describe() if run.named else None,
        },
        column_facts(run),
        resume.environment_parts(),
    )
    began = resume.start(
        run.results,
        parts,
        config.getoption("--kvrig-rerun"),
        keep_finished=config.getoption("--kvrig-keep-finished"),
    )
    run.resumed, run.state = began.resumed, began.state
    config.stash[_MESSAGE_KEY] = began.message or ""
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    config.pluginmanager.register(
        progress.ProgressPlugin(config, max(1, workers)), "kvrig-progress"
    )
    if not workers:
        run.one_process = True
        run.prestart()


_MESSAGE_KEY = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: workers learn whether the controller resumed (they reuse finished records)."""
    run = node.config.stash.get(COLUMN_KEY, None)
    if run is not None:
        node.workerinput["kvrig_resumed"] = run.resumed


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(COLUMN_KEY, None)
    if run is None:
        return None
    where = "emulated" if run.emulated else "this host's own"
    lines = [f"kvrig: the {run.column} column, {len(run.cells)} cells, into {run.results}"]
    if run.device:
        lines.append(
            f"kvrig: an EMULATED {run.platform} device ({run.device}): vLLM's own platform"
            " code decides each cell's configuration on this host; no kernel runs, nothing"
            " generates, and no result here counts as hardware"
        )
    if run.isa:
        lines.append(f"kvrig: CPU class {run.isa} ({where})")
    message = config.stash.get(_MESSAGE_KEY, "")
    return [*lines, message] if message else lines


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> MatrixFile | None:
    run = parent.config.stash.get(COLUMN_KEY, None)
    if run is not None and run.matrix.path is not None and file_path == run.matrix.path.resolve():
        return MatrixFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--kvrig-shard keeps one deterministic part of the column (the same in every xdist
    worker), --kvrig-cell exactly the cells named."""
    run = config.stash.get(COLUMN_KEY, None)
    if run is None:
        return
    keep = list(items)
    shard = config.getoption("--kvrig-shard")
    if shard:
        try:
            mine = pipeline.shard_cells([c.id for c in run.cells], shard)
        except pipeline.ShardError as exc:
            raise pytest.UsageError(str(exc)) from None
        keep = [i for i in keep if not isinstance(i, CellItem) or i.cell.id in mine]
    wanted = set(config.getoption("--kvrig-cell"))
    if wanted:
        unknown = sorted(wanted - {c.id for c in run.cells})
        if unknown:
            raise pytest.UsageError(
                f"--kvrig-cell {', '.join(unknown)}: not a cell of the {run.column} column"
                " (kvrig cells --platform lists them)."
            )
        keep = [i for i in keep if not isinstance(i, CellItem) or i.cell.id in wanted]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    # Read off the matrix alone, so every xdist worker collects the same order.
    items[:] = run_order.run_order(
        keep,
        lambda i: i.cell if isinstance(i, CellItem) else None,
        run.parent_key if run.one_process else None,
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A real GPU's column ends at the first cell a missing device would fail, rather than
    recording every remaining cell as vLLM's failure; the run stays unfinished, to resume."""
    run = item.config.stash.get(COLUMN_KEY, None)
    if run is None or not isinstance(item, CellItem) or run.device is not None:
        return
    if item.cell.expect.outcome == "skip":
        return
    reason = device.missing(run.platform)
    if reason is not None:
        pytest.exit(
            f"kvrig: the {run.column} column stops before {item.cell.id}: {reason}. The cells"
            " before it are kept; check the device on the host (`kvrig check host"
            f" {run.platform}`), then run the same command again to resume here.",
            returncode=pytest.ExitCode.INTERRUPTED,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash.get(COLUMN_KEY, None)
    if run is None:
        return
    run.close()
    if run.state and exitstatus != pytest.ExitCode.INTERRUPTED:
        resume.finish(run.results, run.state)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(COLUMN_KEY, None)
    if run is None or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        filters = [
            f"{name} {value!r}"
            for name, value in (
                ("-k", config.getoption("keyword")),
                ("-m", config.getoption("markexpr")),
                ("--kvrig-cell", ", ".join(config.getoption("--kvrig-cell"))),
                ("--kvrig-shard", config.getoption("--kvrig-shard")),
            )
            if value
        ]
        tr.write_line(
            f"kvrig: {' and '.join(filters) or 'the selection'} matched no cell of the"
            f" {run.column} column ({len(run.cells)} cells; kvrig cells lists them)."
        )
        return
    if config.option.collectonly:
        return
    rows = results_mod.read(run.results)
    if not rows:
        return
    order = {c.id: i for i, c in enumerate(run.cells)}
    rows.sort(key=lambda r: order.get(r["cell_id"], len(order)))
    md, page = report.write(run.results)
    tr.section(f"kvrig {run.column} column")
    tr.write_line(report.terminal(rows))
    tr.write_line(f"results: {run.results}/results.jsonl (records/, logs/, junit.xml)")
    tr.write_line(f"report:  {md}  {page}")
