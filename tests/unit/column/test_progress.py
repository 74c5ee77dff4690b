"""The progress line's arithmetic and wording (pure; the pytest plugin is its edge)."""

from __future__ import annotations

import math

from kvrig.column.progress import State, cell_name, clock, remaining_s


def test_clock() -> None:
    assert clock(5) == "0:05"
    assert clock(125) == "2:05"
    assert clock(3725) == "1:02:05"


def test_remaining_spreads_the_mean_over_workers_less_time_already_spent() -> None:
    assert math.isnan(remaining_s([], 10, 2, []))
    assert remaining_s([10, 20], 4, 2, []) == 30.0
    assert remaining_s([10, 20], 4, 2, [5.0, 100.0]) == (60 - 5 - 15) / 2
    assert remaining_s([10], 0, 1, [50.0]) == 0.0


def test_the_bar_names_running_cells_and_fits_the_width() -> None:
    s = State(total=4, workers=2, started_at=0.0)
    s.start("t.py::cpu-a-b", 0.0)
    s.start("t.py::cpu-c-d", 1.0)
    assert "?" in s.bar(2.0)  # no estimate before a cell ended
    s.finish("t.py::cpu-a-b", 10.0)
    bar = s.bar(10.0)
    assert bar.startswith("[####............] 1/4  0:10 elapsed  ~")
    assert bar.endswith("running: cpu-c-d")
    assert len(s.bar(10.0, width=30)) == 30


def test_plain_line_for_ci_logs() -> None:
    s = State(total=2, workers=1, started_at=0.0)
    s.start("m.yaml::cpu-a-b", 0.0)
    took = s.finish("m.yaml::cpu-a-b", 12.0)
    assert s.plain("m.yaml::cpu-a-b", "passed", took, 12.0) == (
        "kvrig [1/2] cpu-a-b passed in 12.0 s (0:12 elapsed, ~0:12 left)"
    )
    assert cell_name("plain") == "plain"
