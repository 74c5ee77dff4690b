"""The mutation check's pure parts: what counts as noticed, and what it runs where."""

from __future__ import annotations

import sys
from pathlib import Path

from kvrig.publish import mutation_check as mutation

from ..builders import ROOT


def test_verdict_problems_read_the_records_and_require_the_full_count() -> None:
    rows = [
        {"cell_id": "a", "expected": "early_error", "status": "fail", "reason": "got ran"},
        {"cell_id": "b", "expected": "early_error", "status": "pass", "reason": "ok"},
        {"cell_id": "c", "expected": "early_error", "status": "fail", "reason": "got SIGILL"},
        {"cell_id": "d", "expected": "early_error", "status": "fail", "reason": "late"},
        {"cell_id": "e", "expected": "early_error", "status": "fail", "reason": "early"},
    ]
    records = {
        "a": {"outcome": "ran"},
        "c": {"outcome": "crashed"},
        "d": {"outcome": "error", "kv_cache_sized_before_error": True},
        "e": {"outcome": "error", "kv_cache_sized_before_error": False},
    }
    problems = mutation.verdict_problems(rows, records, {"a", "b", "c", "d", "e", "f"})
    assert problems[0] == "5 of the matrix's 6 early_error cells ran; missing: f"
    assert problems[1:] == [
        "b still passed with the check disabled",
        "c failed for another reason: got SIGILL",
        "e failed for another reason: early",
    ]
    assert mutation.verdict_problems([], {}) == ["no early_error cell ran"]


def test_verdict_problems_require_the_mutated_overlay() -> None:
    rows = [
        {"cell_id": "a", "expected": "early_error", "status": "fail", "reason": "got ran",
         "vllm_overlay": {"patch_sha256": "abc"}},
        {"cell_id": "b", "expected": "early_error", "status": "fail", "reason": "got ran",
         "vllm_overlay": None},
    ]  # fmt: skip
    records = {"a": {"outcome": "ran"}, "b": {"outcome": "ran"}}
    assert mutation.verdict_problems(rows, records, {"a", "b"}, "abc") == [
        "b did not run on the mutated overlay (it names None)"
    ]


def test_the_mutation_patch_is_kept_in_the_repo_and_disables_only_the_check() -> None:
    text = mutation.PATCH.read_text()
    assert text.startswith("diff --git a/vllm/platforms/interface.py b/vllm/platforms/interface.py")
    removed = [x for x in text.splitlines() if x.startswith("-") and not x.startswith("---")]
    assert removed == ["-        if block_size == pre_block_size:", "-            return"]


def test_the_patch_is_the_checkouts() -> None:
    assert mutation.PATCH == ROOT / "patches" / "no_early_check.diff"


def test_the_mutated_column_runs_on_this_host_in_the_image_or_on_an_emulated_gpu() -> None:
    results = Path("/r")
    here = mutation.column_command(mutation.Options(pytest_args=("-k", "x")), results)
    assert here[:5] == [sys.executable, "-m", "kvrig", "column", "--platform"]
    assert here[5] == "cpu"
    assert ["--vllm-patch", str(mutation.PATCH)] == here[here.index("--vllm-patch") :][:2]
    assert "--rerun" in here
    assert here[-6:] == ["-m", "expect_early_error", "-q", "--tb=no", "-k", "x"]
    image = mutation.column_command(mutation.Options(container=True, matrix="m.yaml"), results)
    assert image[:7] == [sys.executable, "-m", "kvrig", "--matrix", "m.yaml", "container", "cpu"]
    assert image[image.index("--") + 1 :][:2] == ["-m", "expect_early_error"]
    gpu = mutation.column_command(mutation.Options(emulate="9.0"), results)
    assert gpu[3:9] == ["column", "--platform", "cuda", "--emulate", "9.0", "--results"]


def test_each_mutation_run_has_its_own_side_folder() -> None:
    assert mutation.results_of(mutation.Options()).name == "cpu-mutation"
    assert mutation.results_of(mutation.Options(container=True)).name == "cpu-mutation-container"
    emulated = mutation.results_of(mutation.Options(emulate="9.0"))
    assert emulated.name == "cuda-sm90-emulated-mutation"
    assert mutation.results_of(mutation.Options(results="/x")) == Path("/x")


def test_it_cannot_prove_anything_without_uvs_cache_and_a_refused_overlay_is_red(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import subprocess

    monkeypatch.setattr(mutation, "expected_cells", lambda matrix, emulate=None, vllm=None: {"a"})
    monkeypatch.setattr(mutation.uv_cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(mutation.uv_cache, "digests", lambda cache: {})
    ran: list[list[str]] = []

    def run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 2)

    monkeypatch.setattr(mutation.subprocess, "run", run)
    opts = mutation.Options(results=str(tmp_path / "r"))
    assert mutation.run(opts) == 2  # no vLLM in uv's cache: nothing to hold it to
    assert "holds no vLLM" in capsys.readouterr().out
    assert ran == []  # and no column started
    monkeypatch.setattr(mutation.uv_cache, "digests", lambda cache: {"vllm/x.py": "1"})
    assert mutation.run(opts) == 1  # the column refused: the patch no longer applies
    assert "the mutated overlay could not be built" in capsys.readouterr().out
    assert ran[0][3] == "column"


def test_each_kind_of_mutation_run_is_said_where_it_ran() -> None:
    kinds = [mutation.Options(), mutation.Options(container=True), mutation.Options(emulate="9.0")]
    assert [mutation.described(o) for o in kinds] == [
        "on this host",
        "in the CPU image",
        "on the emulated CUDA 9.0 column",
    ]


# --- seeded changes of the branches the knobs reach ---------------------------------------


def test_every_seeded_change_is_a_patch_of_one_function_for_cases_of_the_matrix() -> None:
    from kvrig.define.matrix import load
    from kvrig.provision import patches
    from kvrig.publish import seeded_mutations

    from ..builders import ROOT

    matrix = load(ROOT / "matrix.yaml")
    cases = {(c.model, c.id) for c in matrix.cases}
    for seeded in seeded_mutations.SEEDED:
        text = seeded.patch.read_text()
        # A hunk that names its function applies wherever that function moved to.
        assert all(
            h.group(2).startswith("def ")
            for h in map(
                patches.HUNK_HEADER.match,
                [line for line in text.splitlines() if line.startswith("@@")],
            )
        ), seeded.name
        assert set(seeded.cases) <= cases, seeded.name


def test_a_seeded_change_is_noticed_only_when_each_of_its_cells_failed_on_its_overlay() -> None:
    from kvrig.publish import seeded_mutations

    def row(cid: str, status: str, sha: str = "abc") -> dict:
        return {
            "cell_id": cid,
            "status": status,
            "reason": "r",
            "vllm_overlay": {"patch_sha256": sha},
        }

    expected = ["a", "b"]
    assert seeded_mutations.problems([row("a", "fail"), row("b", "fail")], expected, "abc") == []
    found = seeded_mutations.problems(
        [row("a", "pass"), row("b", "fail", "other")], expected, "abc"
    )
    assert found == [
        "a still pass with the branch changed: r",
        "b did not run on the mutated overlay (it names other)",
    ]
    assert seeded_mutations.problems([row("a", "fail")], expected, "abc") == ["b did not run"]


def test_the_seeded_cells_are_the_column_s_own(monkeypatch) -> None:
    from kvrig.publish import mutation_check, seeded_mutations

    [core, _, conv, _, draft] = seeded_mutations.SEEDED
    on_sm90 = mutation_check.Options(emulate="9.0")
    assert seeded_mutations.cells_of(core, on_sm90) == [
        "cuda-sm90-emulated-granite_hybrid-max_model_len_below_block",
        "cuda-sm90-emulated-nemotron_h-pp_stage_without_attention",
    ]
    assert seeded_mutations.cells_of(conv, on_sm90) == [
        "cuda-sm90-emulated-granite_hybrid-spec_ngram"
    ]
    assert seeded_mutations.cells_of(draft, on_sm90) == [
        "cuda-sm90-emulated-granite_hybrid-spec_draft_shorter_context"
    ]
    monkeypatch.setattr(seeded_mutations.isa, "resolve", lambda *a: ("amx", None))
    assert seeded_mutations.cells_of(conv, mutation_check.Options()) == []
    assert seeded_mutations.cells_of(draft, mutation_check.Options()) == []


def test_seeded_changes_run_two_at_a_time_and_each_one_s_problems_are_kept(
    monkeypatch, tmp_path: Path
) -> None:
    import threading
    import time

    from kvrig.publish import mutation_check, seeded_mutations

    running: list[str] = []
    most = []
    lock = threading.Lock()

    def column(name: str, command: list[str]) -> int:
        with lock:
            running.append(name)
            most.append(len(running))
        time.sleep(0.2)
        with lock:
            running.remove(name)
        return 0

    names = [s.name for s in seeded_mutations.SEEDED]
    monkeypatch.setattr(mutation_check, "uv_cache_snapshot", lambda check: (tmp_path, {"f": "1"}))
    monkeypatch.setattr(seeded_mutations.uv_cache, "digests", lambda cache: {"f": "1"})
    monkeypatch.setattr(seeded_mutations, "cells_of", lambda seeded, opts: [seeded.name])
    monkeypatch.setattr(seeded_mutations.prefixed, "run", column)
    monkeypatch.setattr(seeded_mutations.results_mod, "read", lambda folder: [])
    opts = mutation_check.Options(emulate="9.0", results=str(tmp_path / "m"))
    assert seeded_mutations.run(opts) == 1  # no rows: every cell "did not run"
    assert max(most) == seeded_mutations.AT_ONCE == 2 and len(most) == len(names)
    monkeypatch.setattr(
        seeded_mutations.results_mod,
        "read",
        lambda folder: [
            {"cell_id": folder.name, "status": "fail", "reason": "r",
             "vllm_overlay": {"patch_sha256": seeded_mutations.hashlib.sha256(
                 (seeded_mutations.SEEDED_PATCHES / f"{folder.name}.diff").read_bytes()
             ).hexdigest()}}
        ],
    )  # fmt: skip
    assert seeded_mutations.run(opts) == 0


def test_a_column_beside_another_runs_one_worker_unless_told() -> None:
    assert mutation.one_worker(("-x",)) == ("-x", "-n", "0")
    assert mutation.one_worker(("-n", "2")) == ("-n", "2")
    assert mutation.one_worker(("-n2",)) == ("-n2",)
