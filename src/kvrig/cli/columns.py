"""Running columns: `kvrig column`, `kvrig cpu-classes`, `kvrig emulated`.

A column is pytest on the matrix with kvrig's plugin; this side refuses what cannot run
before pytest starts, so a refusal is one paragraph rather than a red column.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvrig.cli import in_turn
from kvrig.cli.usage import UsageError
from kvrig.define import column_choice, column_options, gpus, named_release
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import Matrix, load
from kvrig.define.paths import column_name, results_folder
from kvrig.define.platform_spec import VllmSource
from kvrig.host import hardware, isa
from kvrig.provision import overlay, release_env
from kvrig.publish import pipeline
from kvrig.run import holds as holds_mod
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
    if workers <= 1 or columns_choose_workers(extra):
        return extra
    return ["-n", str(workers), *extra]


def cmd_column(ns: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    matrix_path = Path(ns.matrix) if ns.matrix else default_matrix()
    requested, extra = isa.take_arg(ns.isa, extra)
    choice = column_choice.choose(ns.platform, requested, ns.emulate, gpu_arch=ns.gpu_arch)
    # Refuse a bad matrix (or a release kvrig's rules cannot know) before pytest starts.
    matrix, named = named_release.for_column(
        load(matrix_path), choice.platform, bool(choice.device), ns.vllm
    )
    if named is not None:
        # A side run's folder is refused before the release's environment is made.
        refuse_folder(ns, run_holds(ns, choice.column, named))
        elsewhere = in_release_env(ns, matrix, choice, named)
        if elsewhere is not None:
            return elsewhere
    spec = matrix.platforms.get(choice.platform)  # type: ignore[call-overload]
    manifest = use_overlay(ns, choice.platform, spec.vllm, matrix_path) if spec else None
    asked = manifest is not None and bool(ns.vllm_source or ns.vllm_patch)
    holds = run_holds(ns, choice.column, named, manifest, spec.vllm if spec else None)
    results = results_of(ns, named_release.folder_name(choice.column, named), holds, manifest)
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


def run_holds(
    ns: argparse.Namespace,
    column: str,
    named: named_release.NamedRelease | None,
    manifest: overlay.Manifest | None = None,
    declared: VllmSource | None = None,
) -> holds_mod.Holds:
    """What the run's folder will hold (kvrig.run.holds): the overlay or release the command
    line or image puts in force, else the vLLM matrix.yaml declares."""
    built_in = _in_force() if declared is None or declared.kind != "overlay" else None
    if ns.vllm_source or ns.vllm_patch or built_in:
        if manifest is None and built_in:
            manifest = overlay.Manifest.of_summary(built_in)
        what = (
            manifest.describe() if manifest else f"the Python of {ns.vllm_patch or ns.vllm_source}"
        )
        return holds_mod.Holds(holds_mod.OVERLAY, what, column)
    if named is not None:
        return holds_mod.Holds(holds_mod.NAMED, f"vLLM {named.describe()}", column)
    return holds_mod.Holds(
        holds_mod.RELEASE, declared.describe() if declared else "matrix.yaml's vLLM", column
    )


def _in_force() -> dict[str, object] | None:
    """The overlay this environment puts in force (an overlay image's), if any."""
    try:
        return overlay.named(os.environ)
    except (OSError, ValueError, TypeError):
        return None


def refuse_folder(ns: argparse.Namespace, holds: holds_mod.Holds) -> None:
    """The folder --results names, refused in one paragraph if it cannot take this run."""
    if not ns.results:
        return
    try:
        holds_mod.check(Path(ns.results).resolve(), holds)
    except holds_mod.HoldsError as exc:
        raise UsageError(str(exc)) from None


def results_of(
    ns: argparse.Namespace, column: str, holds: holds_mod.Holds, manifest: overlay.Manifest | None
) -> Path:
    """The run's results folder, checked and marked with what it holds; an overlay asked for
    on the command line gets a folder beside the release's, so `kvrig compare` reads both."""
    folder = results_folder(column)
    if holds.kind == holds_mod.OVERLAY and manifest is not None:
        folder = results_folder(f"{column}-overlay-{manifest.digest[:8]}")
    results = Path(ns.results or folder).resolve()
    try:
        check_results_folder(results, holds=holds)
    except ResultsFolderError as exc:
        raise UsageError(str(exc)) from None
    return results


def release_package(matrix: Matrix, choice: column_choice.Choice) -> tuple[str, str]:
    """(the environment kind, the distribution that holds the column's vLLM): an emulated
    device runs the CUDA platform's wheel, any other column its own platform's."""
    platform = "cuda" if choice.device else choice.platform
    source = matrix.platforms[platform].vllm  # type: ignore[index]
    wheels = source.wheels or source.installed
    return ("emulated" if choice.device else choice.platform), wheels.package


def in_release_env(
    ns: argparse.Namespace,
    matrix: Matrix,
    choice: column_choice.Choice,
    named: named_release.NamedRelease,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> int | None:
    """The column's exit status when it had to run in the named release's own environment
    (this one holds another vLLM), else None: it runs here."""
    kind, package = release_package(matrix, choice)
    installed = release_env.installed_version(package)
    if release_env.is_installed(named, installed):
        return None
    if os.environ.get(release_env.IN_RELEASE_ENV):
        raise UsageError(
            f"The environment made for vLLM {named.describe()}"
            f" ({os.environ[release_env.IN_RELEASE_ENV]}) holds {package} {installed}: its"
            " setup did not install the release. Remove that folder and start again."
        )
    matrix_file = str(Path(ns.matrix).resolve()) if ns.matrix else None
    try:
        folder = release_env.ensure(release_env.Wanted(kind, named, matrix=matrix_file))
    except release_env.ReleaseEnvError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"kvrig: this environment has {package} {installed or '(none)'}; the column for vLLM"
        f" {named.describe()} runs in {folder}",
        file=sys.stderr,
        flush=True,
    )
    env = {**os.environ, release_env.IN_RELEASE_ENV: str(folder)}
    argv = [release_env.python_of(folder), "-m", "kvrig", *ns.argv]
    return run(argv, env=env, check=False).returncode


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
    only: list[str] | None,
    matrix: str | None,
    rerun: bool,
    extra: list[str],
    vllm: str | None = None,
) -> list[tuple[str, list[str]]]:
    """(results folder, `kvrig column` command) for each emulated device `only` names
    (cuda:9.0, or a platform, cuda), all of them without it."""
    try:
        chosen = gpus.chosen_devices(only)
    except gpus.GpuError as exc:
        raise UsageError(str(exc)) from None
    again = ["--rerun"] if rerun else []
    release = ["--vllm", vllm] if vllm else []
    named = named_release.parse(vllm) if vllm else None
    # Side by side, one worker each, unless the user chose the workers.
    one = in_turn.ONE_WORKER if side_by_side(len(chosen), extra) > 1 else []
    return [
        (
            named_release.folder_name(gpus.emulated_column(p, a), named),
            in_turn.kvrig_command(
                matrix,
                "column",
                "--platform",
                p,
                "--emulate",
                a,
                *release,
                *again,
                *one,
                *extra,
            ),
        )
        for p, a in chosen
    ]


def columns_choose_workers(extra: list[str]) -> bool:
    """Whether pytest arguments given to every column name the workers (-n)."""
    return any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in extra)


def cmd_emulated(ns: argparse.Namespace, extra: list[str]) -> int:
    columns = emulated_columns(ns.only, ns.matrix, ns.rerun, extra, ns.vllm)
    return in_turn.run_columns(
        columns,
        "emulated GPU columns (vLLM's own platform code on this host; not hardware)",
        at_once=side_by_side(len(columns), extra),
        groups=[platform for platform, _ in gpus.chosen_devices(ns.only)],
    )


def side_by_side(count: int, extra: list[str]) -> int:
    """How many emulated columns run at a time: two, each with one worker
    (emulated_columns), unless there is one or the user chose the workers."""
    return 1 if count < 2 or columns_choose_workers(extra) else in_turn.SIDE_BY_SIDE


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
    in_turn.declare_emulated(em)
    em.add_argument(
        "--vllm",
        metavar="RELEASE",
        help="the vLLM release to run instead of matrix.yaml's (a version, or a wheel file),"
        " in an environment kvrig makes for it; results/<column>-vllm-<version>",
    )
    em.set_defaults(run=cmd_emulated, pytest_args=True)
