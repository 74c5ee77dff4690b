"""Running columns: `kvrig column` (one), `kvrig cpu-classes` (the CPU column under every
class this host has), `kvrig emulated` (every emulated GPU's column).

A column is pytest on the matrix with kvrig's plugin; this side picks the column
(kvrig.define.column_choice, as the plugin does), refuses what cannot run before pytest
starts, puts an overlay in force, and hands its options on under pytest's names.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from kvrig.cli import in_turn
from kvrig.cli.usage import UsageError
from kvrig.define import column_choice, column_options, gpus
from kvrig.define.matrix import VllmSource, default_matrix, load
from kvrig.define.paths import column_name, results_folder
from kvrig.host import hardware, isa
from kvrig.provision import overlay
from kvrig.publish import pipeline
from kvrig.run.runner import ResultsFolderError, check_results_folder

# An emulated device runs no engine on a device: two cells side by side, one per core.
EMULATED_PARALLEL = 2


def column_args(values: dict[str, Any], matrix: Path, extra: list[str], column: str) -> list[str]:
    """The pytest command line that runs one column (pure): the column's options under
    pytest's names, then kvrig's fixed choices, then the user's pytest arguments."""
    results = Path(values["results"])
    return [
        str(matrix),  # collected by kvrig's pytest plugin (the `pytest11` entry point)
        *column_options.command_line(values, column_options.PYTEST),
        f"--junitxml={results / 'junit.xml'}",
        f"--override-ini=junit_suite_name=kvrig-{column}",  # merged JUnit keeps columns apart
        "--override-ini=console_output_style=classic",  # kvrig prints a line per cell
        "-v",  # a line per cell as it ends: progress on a long column
        "-p",
        "no:cacheprovider",
        # kvrig is imported before pytest starts, so pytest cannot rewrite its asserts.
        "-W",
        "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning",
        *extra,
    ]


def with_workers(extra: list[str], workers: int) -> list[str]:
    """Adds pytest-xdist's -n unless the user chose (or one worker is asked for)."""
    if workers <= 1 or any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in extra):
        return extra
    return ["-n", str(workers), *extra]


def cmd_column(ns: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    matrix_path = Path(ns.matrix) if ns.matrix else default_matrix()
    matrix = load(matrix_path)  # refuse a bad matrix before pytest starts
    requested, extra = isa.take_arg(ns.isa, extra)
    choice = column_choice.choose(ns.platform, requested, ns.emulate, gpu_arch=ns.gpu_arch)
    spec = matrix.platforms.get(choice.platform)  # type: ignore[call-overload]
    manifest = use_overlay(ns, choice.platform, spec.vllm, matrix_path) if spec else None
    asked = manifest is not None and bool(ns.vllm_source or ns.vllm_patch)
    folder = results_folder(choice.column)
    if asked:
        # Beside the release's results, not over them: `kvrig compare` reads both.
        folder = results_folder(f"{choice.column}-overlay-{manifest.digest[:8]}")
    results = Path(ns.results or folder).resolve()
    try:
        check_results_folder(results)
    except ResultsFolderError as exc:
        raise UsageError(str(exc)) from None
    parallel = EMULATED_PARALLEL if choice.device else (spec.parallel if spec else 1)
    workers = parallel if importlib.util.find_spec("xdist") else 1
    values = {
        **vars(ns),
        "platform": choice.platform,
        # As asked, not as resolved: the plugin resolves `native` to the host's own class,
        # where a class named to it would be emulated.
        "isa": requested,
        "results": str(results),
        "shard": pipeline.parse_shard(ns.shard) if ns.shard else None,
    }
    args = column_args(values, matrix_path.resolve(), with_workers(extra, workers), choice.column)
    code = int(pytest.main(args))
    if asked:
        release = results_folder(choice.column).resolve()
        print(f"kvrig: compare with the release: kvrig compare {release} {results}")
    return code


def use_overlay(
    ns: argparse.Namespace, platform: str, declared: VllmSource, matrix_path: Path
) -> overlay.Manifest | None:
    """Builds the overlay a column runs on, if any, and puts it in force for every process
    the column starts (before pytest or any engine starts)."""
    try:
        wanted = overlay.requested(platform, declared, ns.vllm_source, ns.vllm_patch, on_host=True)
        if wanted.kind != "overlay":
            return None
        # Command-line paths are the user's; matrix.yaml's are the matrix file's.
        here = Path.cwd() if (ns.vllm_source or ns.vllm_patch) else matrix_path.parent
        manifest = overlay.prepare(wanted, relative_to=here)
    except overlay.OverlayError as exc:
        raise UsageError(str(exc)) from None
    os.environ.update(overlay.environment(manifest, overlay.run_file(manifest), os.environ))
    sys.path.insert(0, manifest.path)
    print(f"kvrig: vLLM {manifest.describe()}", file=sys.stderr)
    if manifest.ignored_line():
        print(f"kvrig: {manifest.ignored_line()}", file=sys.stderr)
    if not manifest.compiled_check.startswith("checked"):
        print(f"kvrig: compiled-code check {manifest.compiled_check}", file=sys.stderr)
    return manifest


def cpu_class_columns(
    classes: list[str], matrix: str | None, rerun: bool, extra: list[str]
) -> list[tuple[str, list[str]]]:
    """(column, its `kvrig column` command) for each CPU class, in the order given (pure)."""
    again = ["--rerun"] if rerun else []
    return [
        (
            column_name("cpu", None if cls == isa.NATIVE else cls),
            in_turn.kvrig_command(
                matrix, "column", "--platform", "cpu", "--isa", cls, *again, *extra
            ),
        )
        for cls in classes
    ]


def cmd_cpu_classes(ns: argparse.Namespace, extra: list[str]) -> int:
    """The CPU column natively, then under each lesser class this host can emulate."""
    lesser = isa.lesser(hardware.cpu_flags(), hardware.cpu_info()["arch"])
    columns = cpu_class_columns([isa.NATIVE, *lesser], ns.matrix, ns.rerun, extra)
    return in_turn.run_columns(columns, "the CPU column under every class this host runs")


def emulated_columns(
    only: list[str] | None, matrix: str | None, rerun: bool, extra: list[str]
) -> list[tuple[str, list[str]]]:
    """(column, its `kvrig column` command) for each emulated device `only` names (a
    device, cuda:9.0, or a platform, cuda), all of them without it."""
    known = [f"{p}:{a}" for p, a in gpus.EMULATED]
    unknown = [o for o in only or [] if o not in known and o not in gpus.GPUS]
    if unknown:
        raise UsageError(
            f"--only {', '.join(unknown)}: not an emulated device; give one of"
            f" {', '.join(known)} (or a platform: cuda, xpu)."
        )
    again = ["--rerun"] if rerun else []
    return [
        (
            gpus.emulated_column(p, a),
            in_turn.kvrig_command(
                matrix, "column", "--platform", p, "--emulate", a, *again, *extra
            ),
        )
        for p, a in gpus.EMULATED
        if not only or f"{p}:{a}" in only or p in only
    ]


def cmd_emulated(ns: argparse.Namespace, extra: list[str]) -> int:
    columns = emulated_columns(ns.only, ns.matrix, ns.rerun, extra)
    return in_turn.run_columns(
        columns, "emulated GPU columns (vLLM's own platform code on this host; not hardware)"
    )


def register(sub: Any) -> None:
    # Not abbreviated: pytest's --co must reach pytest, not be read as --cold.
    c = sub.add_parser(
        "column", help="run one platform's cells (extra args go to pytest)", allow_abbrev=False
    )
    column_options.declare(c.add_argument, column_options.CLI)
    c.set_defaults(run=cmd_column, pytest_args=True)
    cc = sub.add_parser(
        "cpu-classes",
        help="the CPU column natively, then under each lesser CPU class this host can"
        " emulate, each its own run (extra args go to each column's pytest)",
        allow_abbrev=False,
    )
    cc.add_argument("--rerun", action="store_true", help="run every cell again (default: resume)")
    cc.set_defaults(run=cmd_cpu_classes, pytest_args=True)
    em = sub.add_parser(
        "emulated",
        help="every emulated GPU column in turn: each CUDA architecture, and XPU (extra"
        " args go to each column's pytest)",
        allow_abbrev=False,
    )
    em.add_argument(
        "--only",
        action="append",
        metavar="DEVICE",
        help="only this device (cuda:9.0, xpu:bmg) or platform (cuda); repeatable",
    )
    em.add_argument("--rerun", action="store_true", help="run every cell again (default: resume)")
    em.set_defaults(run=cmd_emulated, pytest_args=True)
