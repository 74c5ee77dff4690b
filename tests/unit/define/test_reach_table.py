"""The branch table kvrig check reach measures: the shipped one is whole and each row says
why, and a malformed one is refused."""

from __future__ import annotations

import pydantic
import pytest

from kvrig.define import reach_table

ROW = """
release: "0.34.0"
rows:
  - n: 1
    file: platforms/interface.py
    function: Platform.update_block_size_for_backend
    what: "phase 1 runs"
    arms: [{at: "if not cache_config.user_specified_block_size:", arm: "true"}]
    class: reachable
    reason: "any default cell"
"""


def test_the_shipped_table_holds_every_row_of_the_inventory_once() -> None:
    table = reach_table.load()
    assert [r.n for r in table.rows] == list(range(1, 157))
    assert table.release == "0.34.0"


def test_every_row_says_what_a_cell_needs_or_why_none_can() -> None:
    for row in reach_table.load().rows:
        assert row.reason.strip(), row.n
        assert row.what.strip(), row.n


def test_the_classes_the_report_lists_apart() -> None:
    classes = [r.class_ for r in reach_table.load().rows]
    assert classes.count("dead") == 10
    assert classes.count("hardware") == 1
    assert sum(c == "reachable" for c in classes) > 100


def test_the_files_measured_are_the_rows_files_inside_vllm() -> None:
    files = reach_table.load().files
    assert "platforms/interface.py" in files
    assert "model_executor/layers/mamba/abstract.py" in files  # an arm's, not only a row's
    assert all(not f.startswith(("/", "vllm/")) for f in files)


def test_a_row_parses_with_its_class_and_arm() -> None:
    table = reach_table.parse(ROW)
    row = table.rows[0]
    assert row.reachable and row.arms[0].arm == "true"
    assert row.arms[0].platforms == reach_table.PLATFORMS
    assert table.files == ("platforms/interface.py",)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('arm: "true"', 'arm: "maybe"'),  # an arm kind the report cannot measure
        ("class: reachable", "class: someday"),
        ('reason: "any default cell"', 'reason: ""'),
        ("arms: [", "armz: ["),
        ('arm: "true"}', 'arm: "true", platforms: [tpu]}'),
    ],
)
def test_a_malformed_row_is_refused(old: str, new: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        reach_table.parse(ROW.replace(old, new))


def test_two_rows_of_one_number_are_refused() -> None:
    twice = ROW + ROW.split("rows:\n", 1)[1]
    with pytest.raises(pydantic.ValidationError, match="numbered twice"):
        reach_table.parse(twice)
