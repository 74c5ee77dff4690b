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
    assert "2 passed on A and are red on B" in text
    assert "ran on A only (1): cpu-m-gone" in text and "ran on B only (1): cpu-m-new" in text


def test_a_fixed_cell_is_a_change_but_not_a_regression() -> None:
    result = compare.compare([row("cpu-m-c", "fail")], [row("cpu-m-c")])
    assert [c.key for c in result.changed] == ["cpu-m-c"] and not result.turned_red


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
