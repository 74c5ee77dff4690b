from __future__ import annotations

from pathlib import Path

from kvrig import gate, report, results
from kvrig.matrix import Matrix

from .conftest import BASE


def row(cell_id: str, status: str, **kw) -> dict:
    base = {
        "cell_id": cell_id,
        "status": status,
        "expected": "runs",
        "outcome": "ran",
        "reason": f"as expected: engine ran ({cell_id})",
        "gate": False,
        "worker_block_size": 384,
        "engine_block_size": 256,
        "wall_s": 12.0,
    }
    base.update(kw)
    return base


def test_results_keep_the_latest_row_per_cell(tmp_path: Path) -> None:
    results.append(tmp_path, row("a", "fail"))
    results.append(tmp_path, row("b", "pass"))
    results.append(tmp_path, row("a", "pass"))
    with open(tmp_path / results.RESULTS_FILE, "a") as fh:
        fh.write('{"cell_id": "c", "sta')  # a line cut short by a crash
    assert [(r["cell_id"], r["status"]) for r in results.read(tmp_path)] == [
        ("a", "pass"),
        ("b", "pass"),
    ]


def test_terminal_and_markdown_reports() -> None:
    rows = [row("cpu-m-a", "pass"), row("cpu-m-b", "fail", reason="expected X; got Y")]
    text = report.terminal(rows)
    assert "384 (core 256)" in text and "expected X; got Y" in text
    assert text.splitlines()[-1] == "1 passed, 1 failed, 0 skipped"
    md = report.markdown(rows, "t")
    assert "| `cpu-m-b` | FAIL |" in md
    assert "<td>FAIL</td>" in report.to_html(rows, "t")


def test_gate_requires_every_gating_cell_to_pass() -> None:
    m = Matrix.model_validate(BASE)  # cpu-granite_hybrid-default gates
    ok = gate.evaluate(m, {"cpu": [row("cpu-granite_hybrid-default", "pass")]})
    assert ok.passed
    bad = gate.evaluate(m, {"cpu": [row("cpu-granite_hybrid-default", "fail", reason="r")]})
    assert not bad.passed and "FAIL cpu-granite_hybrid-default: r" in bad.lines
    missing = gate.evaluate(m, {"cpu": []})
    assert not missing.passed and "not run" in missing.lines[0]
    assert not gate.evaluate(m, {}).passed


def test_gate_ignores_non_gating_failures() -> None:
    m = Matrix.model_validate(BASE)
    res = gate.evaluate(
        m,
        {
            "cpu": [
                row("cpu-granite_hybrid-default", "pass"),
                row("cpu-granite_hybrid-sibling_rejects", "fail"),
            ]
        },
    )
    assert res.passed
