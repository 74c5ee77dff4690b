"""A model's cells need what its vLLM code imports (Qwen3.5: torchvision): a column whose
environment lacks it skips them, saying what to do; one that has it runs them."""

from __future__ import annotations

from kvrig.define.cells import expand, judged_under, with_needs_met
from kvrig.define.matrix import load
from kvrig.provision import install

from ..builders import ROOT


def qwen35(platform: str = "cpu") -> list:
    cells = expand(load(ROOT / "matrix.yaml"), platform)
    return [c for c in cells if c.model_name == "qwen35_4b"]


def test_qwen35_needs_torchvision_and_its_cpu_cell_expects_to_run() -> None:
    [cell] = qwen35()
    assert cell.model.needs == ["torchvision"]
    assert cell.expect.outcome == "runs"


def test_without_torchvision_the_cell_is_skipped_naming_what_to_do() -> None:
    cells = qwen35()
    [skipped] = with_needs_met(cells, lambda m: False, install.missing_module_hint)
    assert skipped.expect.outcome == "skip"
    assert "needs torchvision, which this environment lacks" in skipped.expect.reason
    assert "PIP_FIND_LINKS" in skipped.expect.reason and "CPU index" in skipped.expect.reason
    # The same cell, judged under the same matrix: the gate's allowance still names it.
    assert skipped.id == cells[0].id and judged_under(skipped) == judged_under(cells[0])


def test_with_torchvision_the_cell_runs_and_other_models_are_untouched() -> None:
    cells = expand(load(ROOT / "matrix.yaml"), "cpu")
    asked: list[str] = []
    kept = with_needs_met(cells, lambda m: asked.append(m) or True, install.missing_module_hint)
    assert kept == cells and set(asked) == {"torchvision"}
    lacking = with_needs_met(cells, lambda m: False, install.missing_module_hint)
    changed = [a.id for a, b in zip(cells, lacking, strict=True) if a != b]
    assert changed == [c.id for c in qwen35()]


def test_what_a_model_needs_is_part_of_what_its_rows_were_judged_under() -> None:
    [granite] = [
        c for c in expand(load(ROOT / "matrix.yaml"), "cpu") if c.id == "cpu-granite_hybrid-default"
    ]
    with_needs = granite.model_copy(
        update={"model": granite.model.model_copy(update={"needs": ["x"]})}
    )
    assert judged_under(with_needs) != judged_under(granite)


def test_a_run_resumed_after_the_module_is_installed_starts_over() -> None:
    """The cells the environment lacked a module for are part of what a resumed run must
    share, so installing torchvision's CPU build does not leave the first run's skips."""
    from kvrig.column.column_run import ColumnRun, column_facts
    from kvrig.define.column_choice import Choice

    matrix = load(ROOT / "matrix.yaml")
    cells = expand(matrix, "cpu")

    def facts(have: bool) -> dict:
        now = with_needs_met(cells, lambda m: have, install.missing_module_hint)
        run = ColumnRun(matrix, Choice("cpu"), now, ROOT / "results", cold=True)
        return column_facts(run)

    assert facts(False)["lacking"] == ["cpu-qwen35_4b-default"]
    assert facts(True)["lacking"] == []
