"""The `kvrig` command: run a column, list cells, validate the matrix, report, gate, pipeline,
predict a checkpoint's block size.

Every failure a user can cause (a bad matrix, an unknown platform, a missing results
folder) ends with one paragraph on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import sys
from pathlib import Path

from kvrig.define import gpus
from kvrig.define.cells import columns, expand, hardware_columns
from kvrig.define.matrix import PLATFORMS, MatrixError, VllmSource, default_matrix, load
from kvrig.define.paths import RESULTS_ROOT, column_folders, column_name, results_folder
from kvrig.host import hardware, isa
from kvrig.provision import overlay
from kvrig.publish import compare, pipeline, report, repro
from kvrig.publish import gate as gate_mod
from kvrig.publish import results as results_mod
from kvrig.rules import explain as explain_mod
from kvrig.rules import predict as predict_mod
from kvrig.rules import shapes, versions
from kvrig.run.runner import ResultsFolderError, check_results_folder


class UsageError(Exception):
    """A one-paragraph message for the user; the command exits 2."""


def column_args(
    platform: str, cls: str, results: Path, matrix: Path, extra: list[str], column: str
) -> list[str]:
    """The pytest command line that runs one column (pure)."""
    return [
        str(matrix),  # collected by kvrig's pytest plugin (the `pytest11` entry point)
        f"--kvrig-platform={platform}",
        f"--kvrig-isa={cls}",
        f"--kvrig-results={results}",
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


def resolve_column(platform: str, requested: str) -> tuple[str, str]:
    """(column, the class pytest is told) for a platform and an --isa value, refusing an
    unknown class or one above the host's before anything runs."""
    if platform != "cpu":
        if requested != isa.NATIVE:
            raise UsageError(
                f"--isa {requested} names a CPU class, and the {platform} column has none;"
                " leave it out."
            )
        return platform, isa.NATIVE
    try:
        cls, emulated = isa.resolve(requested, hardware.cpu_flags(), hardware.cpu_info()["arch"])
    except isa.IsaError as exc:
        raise UsageError(str(exc)) from None
    return column_name("cpu", cls if emulated else None), requested


EMULATED_PARALLEL = 2


def emulated_column(platform: str, arch: str, requested_isa: str) -> str:
    """The column of an emulated device, refusing what cannot be emulated before anything
    runs: a CPU platform, an unknown architecture, a CPU class beside it."""
    if platform == "cpu":
        raise UsageError(
            "--emulate fakes a GPU, and the cpu column runs on this host's own CPU (--isa"
            " emulates a lesser CPU class). Give --platform cuda or --platform xpu."
        )
    if requested_isa != isa.NATIVE:
        raise UsageError(f"--isa names a CPU class, and an emulated {platform} device has none.")
    try:
        return gpus.emulated_column(platform, arch)
    except gpus.GpuError as exc:
        raise UsageError(str(exc)) from None


def cmd_column(ns: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    platform = ns.platform or hardware.detect_platform()
    if platform not in PLATFORMS:
        raise UsageError(f"Unknown platform {platform!r}; kvrig knows {', '.join(PLATFORMS)}.")
    matrix_path = Path(ns.matrix) if ns.matrix else default_matrix()
    matrix = load(matrix_path)  # refuse a bad matrix before pytest starts
    requested, extra = isa.take_arg(ns.isa, extra)
    if ns.emulate:
        column, cls = emulated_column(platform, ns.emulate, requested), isa.NATIVE
        extra = [f"--kvrig-emulate={ns.emulate}", *extra]
    else:
        column, cls = resolve_column(platform, requested)
    spec = matrix.platforms.get(platform)  # type: ignore[call-overload]
    manifest = use_overlay(ns, platform, spec.vllm, matrix_path) if spec else None
    asked = manifest is not None and bool(ns.vllm_source or ns.vllm_patch)
    folder = results_folder(column)
    if asked:
        # Beside the release's results, not over them: `kvrig compare` reads both.
        folder = results_folder(f"{column}-overlay-{manifest.digest[:8]}")
    results = Path(ns.results or folder).resolve()
    try:
        check_results_folder(results)
    except ResultsFolderError as exc:
        raise UsageError(str(exc)) from None
    if ns.cold:
        extra = ["--kvrig-cold", *extra]
    if ns.rerun:
        extra = ["--kvrig-rerun", *extra]
    # An emulated device runs no engine on a device: two cells side by side, one per core.
    parallel = EMULATED_PARALLEL if ns.emulate else (spec.parallel if spec else 1)
    workers = parallel if importlib.util.find_spec("xdist") else 1
    if ns.shard:
        extra = [*extra, f"--kvrig-shard={pipeline.parse_shard(ns.shard)}"]
    args = column_args(
        platform, cls, results, matrix_path.resolve(), with_workers(extra, workers), column
    )
    code = int(pytest.main(args))
    if asked:
        release = results_folder(column).resolve()
        print(f"kvrig: compare with the release: kvrig compare {release} {results}")
    return code


def cmd_emulated(ns: argparse.Namespace, extra: list[str]) -> int:
    """Every emulated device's column in turn (each its own `kvrig column` process, so one
    that breaks costs only itself), then one line per column; red if any column is."""
    import subprocess

    wanted = [
        (p, a) for p, a in gpus.EMULATED if not ns.only or f"{p}:{a}" in ns.only or p in ns.only
    ]
    known = [f"{p}:{a}" for p, a in gpus.EMULATED]
    unknown = [o for o in ns.only or [] if o not in known and o not in gpus.GPUS]
    if unknown:
        raise UsageError(
            f"--only {', '.join(unknown)}: not an emulated device; give one of"
            f" {', '.join(known)} (or a platform: cuda, xpu)."
        )
    matrix = ["--matrix", ns.matrix] if ns.matrix else []
    outcome = []
    for platform, arch in wanted:
        column = gpus.emulated_column(platform, arch)
        print(f"kvrig: the {column} column", file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "kvrig", *matrix, "column", "--platform", platform]
        command += ["--emulate", arch, *(["--rerun"] if ns.rerun else []), *extra]
        code = subprocess.run(command, check=False).returncode
        outcome.append((column, code))
    print("\nkvrig: emulated GPU columns (vLLM's own platform code on this host; not hardware)")
    for column, code in outcome:
        word = {0: "passed", 2: "refused"}.get(code, "FAILED")
        print(f"  {word:<7} {column}  (results/{column})")
    return 1 if any(code for _, code in outcome) else 0


def use_overlay(
    ns: argparse.Namespace, platform: str, declared: VllmSource, matrix_path: Path
) -> overlay.Manifest | None:
    """Builds the overlay a column runs on, if any, and puts it in force for every process
    the column starts (before pytest or any engine starts)."""
    try:
        wanted = overlay.requested(platform, declared, ns.vllm_source, ns.vllm_patch)
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


def cmd_isa(ns: argparse.Namespace) -> int:
    """The host's CPU class, its flags and the classes a column can emulate here."""
    info = hardware.cpu_info()
    flags = hardware.cpu_flags()
    own = isa.host_class(flags, info["arch"])
    have = [f for f in hardware.ISA_FLAGS if f in flags]
    can = isa.emulatable(flags, info["arch"])
    if ns.lesser:  # for scripts: the classes below the host's own, space-separated
        print(" ".join(c for c in can if c != own))
    elif ns.markdown:
        print(f"**CPU class:** {own or 'below avx2'} ({info['cpu_model']}, {info['arch']})  ")
        print(f"**flags:** {' '.join(have) or 'none'}  ")
        print(f"**can emulate:** {', '.join(can) or 'none'}")
    else:
        print(f"class:        {own or 'below avx2'}")
        print(f"cpu:          {info['cpu_model']} ({info['arch']}, {info['cores']} cores)")
        print(f"flags:        {' '.join(have) or 'none'}")
        print(f"can emulate:  {', '.join(can) or 'none'}")
    return 0


def cmd_cells(ns: argparse.Namespace) -> int:
    m = load(ns.matrix)
    cls, emulated = None, False
    if ns.isa != isa.NATIVE:
        try:
            isa.check_known(ns.isa)
        except isa.IsaError as exc:
            raise UsageError(str(exc)) from None
        cls, emulated = ns.isa, True
    arch = None
    if ns.emulate:
        emulated_column(ns.platform or "cpu", ns.emulate, ns.isa)
        arch = ns.emulate
    cells = expand(
        m, ns.platform, isa=cls, emulated=emulated, gpu_arch=arch, device_emulated=bool(arch)
    )
    if ns.explain:
        cell = next((c for c in cells if c.id == ns.explain), None)
        if cell is None:
            raise UsageError(
                f"--explain {ns.explain}: not a cell here; `kvrig cells` lists them (with"
                " --platform, --isa or --emulate for another column)."
            )
        if cell.platform == "cpu" and cell.isa is None:
            host = hardware.cpu_info().get("isa_class")
            cell = cell.model_copy(update={"isa": host})
        print("\n".join(explain_mod.explain(cell)))
        return 0
    for cell in cells:
        gate = " [gate]" if cell.case.gate else ""
        print(f"{cell.id:<45} {cell.expect.outcome:<12}{gate}")
    return 0


def cmd_validate(ns: argparse.Namespace) -> int:
    m = load(ns.matrix)
    n = sum(len(expand(m, p)) for p in m.platforms)
    print(f"{m.path}: valid ({len(m.models)} models, {len(m.cases)} cases, {n} cells)")
    return 0


def _folders(given: list[str] | None) -> list[Path]:
    """The folders named, else results/<column> (and its shards) under the working dir."""
    if given:
        return [Path(g) for g in given]
    return column_folders(RESULTS_ROOT, columns())


def _collect(given: list[str] | None, what: str, empty_ok: bool = False) -> results_mod.Merged:
    folders = _folders(given)
    merged = results_mod.collect(folders)
    if not merged.rows and not empty_ok:
        shown = ", ".join(str(f) for f in folders) or "results/<platform>"
        raise UsageError(
            f"No results in {shown}. Run a column first (nox -s local, or nox -s cpu|cuda|xpu),"
            f" then {what} its results folder(s); a folder may also hold several results"
            " folders (downloaded CI artifacts), which are merged."
        )
    for clash in merged.clashes:
        print(f"note: {clash}", file=sys.stderr)
    return merged


def _in_matrix_order(merged: results_mod.Merged, matrix_path: str) -> None:
    """Rows in matrix order (as finished they are in completion order); others at the end."""
    try:
        order = {c.id: i for i, c in enumerate(expand(load(matrix_path)))}
    except MatrixError:
        order = {}
    merged.rows.sort(key=lambda r: order.get(r["cell_id"], len(order)))


def cmd_report(ns: argparse.Namespace) -> int:
    merged = _collect(ns.results, "report on")
    _in_matrix_order(merged, ns.matrix)
    folders = sorted({str(p.parent) for p in merged.sources.values()})
    out = Path(ns.out) if ns.out else Path(os.path.commonpath(folders))
    title = "kvrig results: " + ", ".join(report.columns_of(merged.rows))
    md, page = report.write_merged(merged, out, title)
    print(report.terminal(merged.rows))
    for line in report.run_facts(merged.rows):
        print(line)
    print(f"\nresults: {', '.join(folders)}\nreport: {md}  {page}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(md.read_text())
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    """Exit 1 when a cell that passed on the first run is red on the second, or missing."""
    runs = []
    for given in (ns.results_a, ns.results_b):
        merged = _collect([given], "compare")
        _in_matrix_order(merged, ns.matrix)
        runs.append(merged.rows)
    found = compare.compare(*runs)
    for label, given, rows in (("A", ns.results_a, runs[0]), ("B", ns.results_b, runs[1])):
        print(f"{label}: {given}")
        for line in report.run_facts(rows):
            print(f"   {line}")
    print()
    print(compare.table(found, ns.results_a, ns.results_b))
    return 1 if found.regressed else 0


def _previous(ns: argparse.Namespace, merged: results_mod.Merged) -> tuple[list[dict], str] | None:
    """The rows to compare with: --previous, else the previous-results.jsonl beside each."""
    if ns.previous:
        prev = results_mod.collect([Path(p) for p in ns.previous])
        if not prev.rows:
            raise UsageError(
                f"No results in {', '.join(ns.previous)} to compare with. Pass a results"
                " folder (or its results.jsonl) of the earlier run."
            )
        return prev.rows, ", ".join(ns.previous)
    beside = {p.parent / results_mod.PREVIOUS_FILE for p in merged.sources.values()}
    found = sorted(p for p in beside if p.is_file())
    if not found:
        return None
    prev = results_mod.collect(found, results_mod.PREVIOUS_FILE)
    return prev.rows, ", ".join(str(p) for p in found)


def _gate_results(ns: argparse.Namespace) -> tuple[results_mod.Merged, gate_mod.Selection]:
    """The release columns' results under --results (default: results/<column>), and the
    side runs named with --side; everything else found is left out and named."""
    side = [Path(s) for s in ns.side or []]
    folders = _folders(ns.results) if ns.results or not side else []
    side_files = results_mod.files(side)
    for given in side:
        if not results_mod.files([given]):
            raise UsageError(
                f"No results in {given}, named with --side. Name a side run's results folder"
                " (results/<column>-overlay-<digest>, say) or its results.jsonl."
            )
    found = [*results_mod.files(folders), *side_files]
    sources = [(f, results_mod.read_file(f)) for f in dict.fromkeys(found)]
    chosen = gate_mod.select(sources, hardware_columns(), side=set(side_files))
    merged = results_mod.merge(chosen.sources)
    if not merged.rows and not ns.platform:
        shown = ", ".join(str(f) for f in [*folders, *side]) or "results/<platform>"
        left = f" (left out: {'; '.join(chosen.ignored)})" if chosen.ignored else ""
        raise UsageError(
            f"No release results in {shown}{left}. Run a column first (nox -s local, or nox -s"
            " cpu|cuda|xpu), then gate its results folder(s) (results/<column>, or a tree of"
            " them); a side run is gated only when named with --side."
        )
    for clash in merged.clashes:
        print(f"note: {clash}", file=sys.stderr)
    return merged, chosen


def cmd_gate(ns: argparse.Namespace) -> int:
    today = dt.datetime.now(dt.timezone.utc).date()
    m = load(ns.matrix, today=today)
    # With --platform the gate knows what to require, so no results at all is a failure.
    merged, chosen = _gate_results(ns)
    # The columns matrix.yaml's release requires, unless named here; the others found are
    # said, not gated.
    platforms = ns.platform or gate_mod.required_columns(m, chosen.columns)
    for column in chosen.columns:
        if column not in platforms:
            print(
                f"not required: the {column} column (required: matrix.yaml's release.columns,"
                " or --platform)"
            )
    previous = None if ns.no_previous else _previous(ns, merged)
    if previous:
        print(f"comparing with {previous[1]}")
    res = gate_mod.evaluate(
        m,
        merged.rows,
        platforms,
        today,
        previous=previous[0] if previous else None,
        accept_block_size_changes=ns.accept_block_size_changes,
        repro=repro.lines,
        ignored=chosen.ignored,
    )
    print("\n".join(res.lines))
    return 0 if res.passed else 1


def cmd_pipeline(ns: argparse.Namespace) -> int:
    text = pipeline.render(load(ns.matrix), ns.format)
    if ns.output:
        Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.output).write_text(text)
        print(f"wrote {ns.output}")
    else:
        sys.stdout.write(text)
    return 0


def _read_config(given: str) -> dict:
    """A config.json, or the one in a checkpoint folder."""
    path = Path(given)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(
            f"Cannot read {path} ({exc.strerror}); pass a checkpoint's config.json or its folder."
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not JSON ({exc}); pass the checkpoint's config.json."
        ) from None


def _release(ns: argparse.Namespace) -> tuple[str, str]:
    """(version, where it came from): --vllm, else the platform's in matrix.yaml, else
    kvrig's newest rules (a clean install has no matrix.yaml)."""
    if ns.vllm:
        return ns.vllm, "--vllm"
    try:
        m = load(Path(ns.matrix) if ns.matrix else default_matrix())
    except MatrixError:
        m = None
    spec = m.platforms.get(ns.platform) if m else None  # type: ignore[call-overload]
    found = versions.source_version(spec.vllm) if spec else None
    if found:
        return found, f"{m.path.name}'s {ns.platform} platform"  # type: ignore[union-attr]
    return versions.shown(versions.NEWEST), "kvrig's newest rules (no --vllm, no matrix pin)"


def cmd_predict(ns: argparse.Namespace) -> int:
    """The block size vLLM will choose for a checkpoint: steps, vLLM's log lines, or JSON."""
    config = _read_config(ns.config)
    release, origin = _release(ns)
    cls = ns.isa
    if ns.platform != "cpu" and cls is not None:
        raise UsageError(
            f"--isa {cls} names a CPU class, and {ns.platform} has none; leave it out."
        )
    if ns.platform == "cpu" and cls in (None, isa.NATIVE):
        cls = isa.host_class(hardware.cpu_flags(), hardware.cpu_info()["arch"])
    settings = predict_mod.Settings(
        platform=ns.platform,
        vllm=release,
        backend=ns.backend,
        tp=ns.tp,
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        mamba_ssm_cache_dtype=ns.mamba_ssm_cache_dtype,
        block_size=ns.block_size,
        prefix_caching=ns.prefix_caching,
        mamba_cache_mode=ns.mamba_cache_mode,
        num_speculative_tokens=ns.num_speculative_tokens,
        gpu_arch=ns.gpu_arch,
        isa=cls if ns.platform == "cpu" else None,
    )
    try:
        out = predict_mod.predict(config, settings)
    except (shapes.ConfigError, versions.VersionError) as exc:
        raise UsageError(str(exc)) from None
    if ns.json:
        print(json.dumps({**out.as_json(), "vllm": release}, indent=2))
        return 0
    rows = [("vllm", f"{release} ({origin})"), *out.steps]
    rows += [("vLLM logs", line) for line in out.log] or [("vLLM logs", "nothing (no change)")]
    rows.append(("block size", str(out.block_size)))
    for label, text in rows:
        print(f"{label:<12} {text}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvrig", description=__doc__.splitlines()[0])
    p.add_argument("--matrix", default=None, help="matrix file (default: ./matrix.yaml)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("column", help="run one platform's cells (extra args go to pytest)")
    c.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
    c.add_argument("--isa", default=isa.NATIVE, help=isa.ARG_HELP)
    c.add_argument("--results", help="default: results/<column>")
    c.add_argument(
        "--emulate",
        metavar="ARCH",
        help="decide the cuda or xpu cells with vLLM's own platform code for this GPU"
        " architecture, on this host (cuda: 8.0, 8.9, 9.0, 10.0, 12.0; xpu: bmg):"
        " configuration only, into results/<platform>-<arch>-emulated",
    )
    c.add_argument(
        "--cold",
        action="store_true",
        help="a fresh interpreter per cell instead of forking a warm vLLM parent (slower)",
    )
    c.add_argument(
        "--rerun",
        action="store_true",
        help="run every cell again even if the last run was cut short (default: resume)",
    )
    c.add_argument("--shard", help="run shard I of N of the column (e.g. 2/3), for CI jobs")
    c.add_argument(
        "--vllm-source",
        metavar="PATH",
        help="run the Python of this vLLM checkout over the platform's released kernels",
    )
    c.add_argument(
        "--vllm-patch",
        metavar="FILE",
        help="run the platform's vLLM with this diff applied to a copy of its Python",
    )
    em = sub.add_parser(
        "emulated",
        help="every emulated GPU column in turn: each CUDA architecture, and XPU (extra"
        " args go to each column's pytest)",
    )
    em.add_argument(
        "--only",
        action="append",
        metavar="DEVICE",
        help="only this device (cuda:9.0, xpu:bmg) or platform (cuda); repeatable",
    )
    em.add_argument("--rerun", action="store_true", help="run every cell again (default: resume)")
    cl = sub.add_parser("cells", help="list the cells of the matrix")
    cl.add_argument("--platform", choices=PLATFORMS)
    cl.add_argument("--isa", default=isa.NATIVE, help="list the cells of this emulated class")
    cl.add_argument("--emulate", metavar="ARCH", help="list the cells of this emulated GPU")
    cl.add_argument(
        "--explain",
        metavar="CELL",
        help="print how kvrig.rules computes this cell's outcome (the verdict's steps)",
    )
    i = sub.add_parser("isa", help="print this host's CPU class and what it can emulate")
    i.add_argument("--markdown", action="store_true", help="for a CI job summary")
    i.add_argument("--lesser", action="store_true", help="only the classes below the host's")
    sub.add_parser("validate", help="check matrix.yaml and count its cells")
    r = sub.add_parser("report", help="print and write the report of results folders")
    r.add_argument("results", nargs="*", help="folders or trees (default: results/<platform>)")
    r.add_argument("--out", help="folder for report.md and report.html (default: their parent)")
    cp = sub.add_parser(
        "compare",
        help="the cells two runs differ on; exit 1 if one that passed is red or missing on B",
    )
    cp.add_argument("results_a", metavar="RESULTS_A", help="the first run (e.g. the release)")
    cp.add_argument("results_b", metavar="RESULTS_B", help="the second (e.g. a branch on it)")
    g = sub.add_parser("gate", help="exit 0 only if every required cell passed")
    g.add_argument(
        "--results",
        action="append",
        help="folder or tree, repeatable; only release column folders in it are read"
        " (default: results/<column>, results/<column>-shard<i>)",
    )
    g.add_argument(
        "--side",
        action="append",
        metavar="FOLDER",
        help="a side run to gate on as named (an overlay's results/<column>-overlay-<digest>),"
        " repeatable; without --results only the side runs are read",
    )
    g.add_argument(
        "--platform",
        action="append",
        choices=hardware_columns(),
        help="a column whose required cells must pass, repeatable (default: all found)",
    )
    g.add_argument(
        "--previous",
        action="append",
        help="earlier results to compare with (default: previous-results.jsonl beside each)",
    )
    g.add_argument("--no-previous", action="store_true", help="compare with nothing")
    g.add_argument("--accept-block-size-changes", action="store_true")
    pr = sub.add_parser(
        "predict", help="the block size vLLM picks for a checkpoint's config.json (no vLLM)"
    )
    pr.add_argument("config", help="a config.json, or a checkpoint folder holding one")
    pr.add_argument("--platform", choices=predict_mod.PLATFORMS, required=True)
    pr.add_argument("--vllm", help="the release (default: the platform's in matrix.yaml)")
    pr.add_argument("--backend", help="the attention backend (default: the platform's)")
    pr.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    pr.add_argument("--dtype", help="the model dtype (default: the config's)")
    pr.add_argument("--kv-cache-dtype", help="auto (the model dtype), fp8, ...")
    pr.add_argument("--mamba-ssm-cache-dtype", help="auto, float32, bfloat16, float16")
    pr.add_argument("--block-size", type=int, help="a user --block-size (skips phase 1)")
    pr.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: vLLM's (on for these hybrids)",
    )
    pr.add_argument("--mamba-cache-mode", choices=predict_mod.CACHE_MODES)
    pr.add_argument("--num-speculative-tokens", type=int, default=0)
    pr.add_argument("--gpu-arch", help="CUDA compute capability, e.g. 9.0 (decides GDN prefill)")
    pr.add_argument("--isa", help=f"the CPU class on cpu (default: this host's): {isa.CLASSES}")
    pr.add_argument("--json", action="store_true", help="one JSON object")
    pl = sub.add_parser("pipeline", help="print the CI pipeline generated from the matrix")
    pl.add_argument("--format", choices=pipeline.FORMATS, required=True)
    pl.add_argument("--output", help="write it to this file instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ns, extra = parser().parse_known_args(args)
    if extra and ns.command not in ("column", "emulated"):
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    if extra[:1] == ["--"]:
        extra = extra[1:]
    try:
        handler = {
            "cells": cmd_cells,
            "validate": cmd_validate,
            "report": cmd_report,
            "gate": cmd_gate,
            "compare": cmd_compare,
            "pipeline": cmd_pipeline,
            "isa": cmd_isa,
            "predict": cmd_predict,
        }.get(ns.command)
        if ns.command == "emulated":
            return cmd_emulated(ns, extra)
        return handler(ns) if handler else cmd_column(ns, extra)
    except (MatrixError, UsageError, pipeline.ShardError) as exc:
        print(f"kvrig: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
