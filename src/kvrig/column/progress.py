"""A column's progress: done/total, the cells running, elapsed and remaining time.

In a CI log (not a TTY, or CI set) it is a plain line per finished cell instead of a
redrawn status line, so the log reads top to bottom.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

BAR_WIDTH = 16


def clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def remaining_s(done_s: list[float], left: int, workers: int, running_for: list[float]) -> float:
    """Cells left times the mean cell so far, spread over the workers, less what the
    running cells have already spent (never below zero)."""
    if not done_s:
        return float("nan")
    mean = sum(done_s) / len(done_s)
    return max(0.0, (left * mean - sum(min(r, mean) for r in running_for)) / max(1, workers))


def cell_name(nodeid: str) -> str:
    """The cell id of a test id like matrix.yaml::cpu-llama-default."""
    return nodeid.rsplit("::", 1)[-1]


@dataclass
class State:
    total: int = 0
    workers: int = 1
    started_at: float = field(default_factory=time.monotonic)
    running: dict[str, float] = field(default_factory=dict)  # nodeid -> start
    durations: list[float] = field(default_factory=list)
    failed: int = 0

    @property
    def done(self) -> int:
        return len(self.durations)

    def start(self, nodeid: str, now: float) -> None:
        self.running.setdefault(nodeid, now)

    def finish(self, nodeid: str, now: float) -> float:
        began = self.running.pop(nodeid, now)
        self.durations.append(now - began)
        return now - began

    def remaining(self, now: float) -> float:
        left = max(0, self.total - self.done)
        return remaining_s(
            self.durations, left, self.workers, [now - t for t in self.running.values()]
        )

    def bar(self, now: float, width: int = 100) -> str:
        """The status line: [#####.....] 12/25  running: a, b  0:41 elapsed  ~1:10 left."""
        frac = self.done / self.total if self.total else 0.0
        filled = round(frac * BAR_WIDTH)
        left = self.remaining(now)
        eta = "?" if left != left else "~" + clock(left)  # NaN before the first cell ends
        head = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total}"
            f"  {clock(now - self.started_at)} elapsed  {eta} left"
        )
        if self.failed:
            head += f"  {self.failed} failed"
        names = ", ".join(cell_name(n) for n in self.running)
        line = f"{head}  running: {names}" if names else head
        return line if len(line) <= width else line[: max(0, width - 1)] + "…"

    def plain(self, nodeid: str, outcome: str, took: float, now: float) -> str:
        left = self.remaining(now)
        eta = "?" if left != left else "~" + clock(left)
        return (
            f"kvrig [{self.done}/{self.total}] {cell_name(nodeid)} {outcome} in {took:.1f} s"
            f" ({clock(now - self.started_at)} elapsed, {eta} left)"
        )


def interactive(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("CI")


class ProgressPlugin:
    """Feeds State from pytest's hooks (also forwarded from pytest-xdist workers).

    On a terminal with xdist, pytest's own per-test lines are silenced, since they and the
    redrawn bar would overwrite each other; failures still get pytest's full report.
    """

    def __init__(self, config: pytest.Config, workers: int) -> None:
        self.config = config
        self.state = State(workers=workers)
        # A single pytest process writes a test's id first and its outcome later on the
        # same line, which a redrawn bar would cut: the bar needs pytest-xdist.
        self.tty = interactive() and workers > 1
        self.outcomes: dict[str, str] = {}
        self._drawn = False
        if self.tty:
            config.option.verbose = min(config.option.verbose, 0)

    @property
    def _tr(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def _clear(self) -> None:
        tr = self._tr
        if self._drawn and tr is not None:
            tr.rewrite("", erase=True)
            tr.write("\r", flush=True)
            self._drawn = False

    def _draw(self) -> None:
        tr = self._tr
        if not self.tty or tr is None or not self.state.total:
            return
        width = shutil.get_terminal_size().columns - 1
        tr.rewrite(self.state.bar(time.monotonic(), width), erase=True)
        tr.write("", flush=True)
        self._drawn = True

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        tr = self._tr
        if self.tty and tr is not None:
            tr.showfspath = False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        """No "." per test (this plugin writes a line per cell); on a terminal no
        verbose line either (the bar would cut it)."""
        outcome = yield
        category, _, word = outcome.get_result()
        outcome.force_result((category, "", "" if self.tty else word))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.state.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.state.total = max(self.state.total, len(ids))

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.state.start(nodeid, time.monotonic())
        self._draw()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.passed and ("verdict", "unread") in report.user_properties:
            self.outcomes[report.nodeid] = "unread (rules not read for this vLLM)"
        elif report.skipped:
            kind = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            self.outcomes.setdefault(report.nodeid, kind)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        now = time.monotonic()
        took = self.state.finish(nodeid, now)
        outcome = self.outcomes.get(nodeid, "passed")
        if outcome == "failed":
            self.state.failed += 1
        tr = self._tr
        if tr is None:
            return
        self._clear()
        tr.write_line(self.state.plain(nodeid, outcome, took, now))
        self._draw()

    @pytest.hookimpl(tryfirst=True)
    def pytest_terminal_summary(self) -> None:
        self._clear()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        self._clear()

    def pytest_keyboard_interrupt(self) -> None:
        self._clear()
