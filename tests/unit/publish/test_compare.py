"""`kvrig compare`: the cells two runs differ on, and exit 1 when one that passed is red."""

from __future__ import annotations

import json
from pathlib import Path

from kvrig.cli import main
from kvrig.publish import compare


def row(cell: str, status: str = "pass", **kw: object) -> dict:
    model, case = cell.split("-")[-2:]
    return {
        "cell_id": cell,
        "model": model,
        "case": case,
        "status": status,
        "outcome": "ran",
        "worker_block_size": 256,
        "engine_block_size": 256,
        "error": None,
        "expected": "runs",
        "reason": "r",
        **kw,
    }


def test_only_differing_cells_are_changes_and_a_passing_cell_turned_red_is_marked() -> None:
    a = [
        row("cpu-m-same"),
        row("cpu-m-size"),
        row("cpu-m-red", outcome="error", error="ValueError from f: x", expected="early_error"),
        row("cpu-m-known", "xfail"),
        row("cpu-m-gone"),
    ]
    b = [
        row("cpu-m-same"),
        row("cpu-m-size", worker_block_size=512, engine_block_size=512),
        row("cpu-m-red", "fail", expected="early_error"),
        row("cpu-m-known", "fail", error="RuntimeError from g: y", outcome="error"),
        row("cpu-m-new"),
    ]
    result = compare.compare(a, b)
    assert [c.key for c in result.changed] == ["cpu-m-size", "cpu-m-red", "cpu-m-known"]
    assert [c.key for c in result.turned_red] == ["cpu-m-red", "cpu-m-known"]
    assert result.changed[0].differs == ("block",)
    assert result.changed[1].differs == ("verdict", "outcome", "error")
    assert (result.only_a, result.only_b, result.same) == (["cpu-m-gone"], ["cpu-m-new"], 1)
    text = compare.table(result, "release", "branch")
    assert "cpu-m-red" in text and "<- turned red" in text
    assert "cpu-m-same" not in text.split("\n", 2)[2].split("cell(s) differ")[0]
    assert "2 passed on A and are red, no longer shown or a known defect on B" in text
    assert "ran on A only (1): cpu-m-gone" in text and "ran on B only (1): cpu-m-new" in text


def test_a_fixed_cell_is_a_change_but_not_a_regression() -> None:
    result = compare.compare([row("cpu-m-c", "fail")], [row("cpu-m-c")])
    assert [c.key for c in result.changed] == ["cpu-m-c"] and not result.turned_red


def test_a_cell_that_did_as_expected_and_is_now_a_known_defect_regressed() -> None:
    a = [row("cpu-m-pass"), row("cpu-m-unread", "unread"), row("cpu-m-known", "xfail")]
    b = [row(r["cell_id"], "xfail", outcome="error") for r in a]
    result = compare.compare(a, b)
    assert [c.key for c in result.turned_red] == ["cpu-m-pass", "cpu-m-unread"]
    assert result.regressed
    text = compare.table(result, "release", "branch")
    assert text.count("<- now a known defect (xfail): regressed") == 2
    assert text.splitlines()[-1].startswith("compare: REGRESSED (2 passed on A")
    # xfail on both is no change of the cell's standing, and a fixed defect no regression.
    assert not compare.compare([row("cpu-m-c", "xfail")], [row("cpu-m-c")]).regressed


def test_two_columns_are_matched_by_model_and_case() -> None:
    result = compare.compare([row("cpu-m-c")], [row("cpu-avx2-m-c", "fail")])
    assert [c.key for c in result.changed] == ["m-c"] and result.turned_red


def _folder(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_command_exits_1_on_a_regression_0_otherwise_2_without_results(
    tmp_path: Path, capsys
) -> None:
    a = _folder(tmp_path / "a", [row("cpu-m-c"), row("cpu-m-d")])
    b = _folder(tmp_path / "b", [row("cpu-m-c", "fail"), row("cpu-m-d")])
    same = _folder(tmp_path / "same", [row("cpu-m-c"), row("cpu-m-d")])
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "cpu-m-c" in out and "<- turned red" in out and f"A: {a}" in out
    assert main(["compare", str(a), str(same)]) == 0
    assert "no cell differs" in capsys.readouterr().out
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "No results in" in capsys.readouterr().err


def test_a_cell_that_passed_on_a_and_is_missing_on_b_is_lost() -> None:
    a = [row("cpu-m-c"), row("cpu-m-d"), row("cpu-m-f", "fail")]
    result = compare.compare(a, [row("cpu-m-c")])
    assert result.lost == ["cpu-m-d"]  # cpu-m-f failed on A: nothing was lost with it
    assert result.only_a == ["cpu-m-d", "cpu-m-f"]
    assert result.regressed and not result.turned_red
    text = compare.table(result, "release", "branch")
    assert "passed on A and missing on B (1): cpu-m-d" in text


def test_the_command_exits_1_when_b_lacks_a_cell_that_passed_on_a(tmp_path: Path, capsys) -> None:
    a = _folder(tmp_path / "a", [row("cpu-m-c"), row("cpu-m-d")])
    cut = _folder(tmp_path / "cut", [row("cpu-m-c")])
    assert main(["compare", str(a), str(cut)]) == 1
    assert "passed on A and missing on B (1): cpu-m-d" in capsys.readouterr().out
    assert main(["compare", str(cut), str(a)]) == 0  # B ran more than A: nothing lost


def test_a_status_kvrig_never_writes_on_b_is_red_not_a_traceback() -> None:
    result = compare.compare([row("cpu-m-c")], [row("cpu-m-c", "error")])
    assert [c.key for c in result.turned_red] == ["cpu-m-c"]
    assert "ERROR?" in compare.table(result, "a", "b")


# --- what B no longer shows, statuses kvrig never writes, runs judged differently -------------


def test_a_cell_that_passed_on_a_and_is_skipped_or_undecided_on_b_regressed(
    tmp_path: Path, capsys
) -> None:
    a = _folder(tmp_path / "a", [row("cpu-m-c"), row("cpu-m-d"), row("cpu-m-e", "skip")])
    b = _folder(
        tmp_path / "b",
        [row("cpu-m-c", "skip"), row("cpu-m-d", "undecided"), row("cpu-m-e", "skip")],
    )
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "<- no longer shown (skip): regressed" in out
    assert "<- no longer shown (undecided): regressed" in out
    assert (
        "compare: REGRESSED (2 passed on A and red, no longer shown or a known defect on B" in out
    )
    # Skipped on both: nothing was shown on A either.
    result = compare.compare([row("cpu-m-e", "skip")], [row("cpu-m-e", "skip")])
    assert not result.regressed


def test_a_cell_unread_on_b_is_no_regression_and_said_to_be_no_pass(tmp_path: Path, capsys) -> None:
    a = _folder(tmp_path / "a", [row("cpu-m-c"), row("cpu-m-d")])
    b = _folder(tmp_path / "b", [row("cpu-m-c", "unread"), row("cpu-m-d")])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no cell differs" in out  # vLLM did the same on both
    assert "passed on A and unread on B (1): cpu-m-c; B's vLLM did as they expect" in out
    assert "B: 1 cell(s) judged by kvrig rules not read for its vLLM" in out
    assert out.rstrip().endswith("compare: no regression in vLLM's outcomes (1 unread on B)")
    # Where something else differs too, the cell's own line says it.
    moved = compare.compare([row("cpu-m-c")], [row("cpu-m-c", "unread", worker_block_size=512)])
    assert "<- unread on B: as expected by vLLM's outcome, not a pass" in compare.table(
        moved, "a", "b"
    )


def test_a_status_kvrig_never_writes_is_refused_in_one_paragraph_not_a_traceback(
    tmp_path: Path, capsys
) -> None:
    a = _folder(tmp_path / "a", [row("cpu-m-c"), row("cpu-m-d")])
    odd = {k: v for k, v in row("cpu-m-d").items() if k not in ("status", "reason")}
    b = _folder(tmp_path / "b", [row("cpu-m-c", "error"), odd])
    assert main(["compare", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    assert "ERROR?" in captured.out and "NONE?" in captured.out  # shown, then refused
    assert "status kvrig never writes: B cpu-m-c: 'error'" in captured.out
    assert captured.err.startswith("kvrig: 2 row(s) carry a status kvrig never writes (")
    assert f"{b}: cpu-m-c 'error'; {b}: cpu-m-d None" in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    # On A too: a run nothing can be compared with.
    assert main(["compare", str(b), str(a)]) == 2


def test_runs_judged_under_different_matrices_or_by_different_kvrigs_are_said_to_be() -> None:
    a = [row("cpu-m-c", judged_under="x", judged_by="k1", vllm_version="0.33.0")]
    b = [row("cpu-m-c", judged_under="y", judged_by="k2", vllm_version="0.34.0")]
    result = compare.compare(a, b)
    assert (result.other_matrix, result.other_kvrig) == (["cpu-m-c"], ["cpu-m-c"])
    assert result.other_vllm == ("0.33.0", "0.34.0")
    text = compare.table(result, "a", "b")
    assert "judged under different matrices on A and B (1): cpu-m-c;" in text
    assert "(here every one ran vLLM 0.33.0 on A and 0.34.0 on B, whose pins differ" in text
    assert "judged by different kvrigs on A and B (1): cpu-m-c;" in text
    assert "rerun both with one kvrig to compare their verdicts" in text
    assert text.endswith(
        "compare: no regression in vLLM's outcomes (1 judged under different matrices;"
        " 1 judged by different kvrigs)"
    )
    same_vllm = compare.compare(a, [{**b[0], "vllm_version": "0.33.0"}])
    assert same_vllm.other_vllm is None
    assert "whose pins differ" not in compare.table(same_vllm, "a", "b")
    assert not compare.compare(a, a).other_matrix


def test_a_cell_unread_on_a_regresses_when_b_fails_or_lacks_it() -> None:
    """A run on rules not read for its vLLM (a nightly) against the same with a patch:
    vLLM's outcome is what regresses, whichever rules checked the size."""
    a = [row("cpu-m-c", "unread"), row("cpu-m-d", "unread")]
    result = compare.compare(a, [row("cpu-m-c", "fail")])
    assert [c.key for c in result.turned_red] == ["cpu-m-c"] and result.lost == ["cpu-m-d"]
    assert not compare.compare(a, a).regressed
