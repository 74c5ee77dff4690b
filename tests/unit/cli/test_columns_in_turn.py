"""Several columns in turn (`kvrig cpu-classes`, `kvrig emulated`): which columns, the
command each runs, and the outcome (no column is run: the runner is recorded)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import pytest

from kvrig.cli import columns, delegated, in_turn, main
from kvrig.host import isa

AMX = set(isa.REQUIRES["amx"])


def test_the_classes_are_the_hosts_own_then_every_lesser_one() -> None:
    assert isa.lesser(AMX) == ["avx2", "avx512", "avx512_bf16"]
    assert isa.lesser({"avx2"}) == []
    assert isa.lesser(set()) == []  # below avx2: only the native run, which refuses
    assert isa.lesser(AMX, "aarch64") == []


def test_each_class_runs_its_own_column_with_the_users_arguments() -> None:
    runs = columns.cpu_class_columns(["native", "avx2"], "m.yaml", True, ["-k", "llama"])
    assert [column for column, _ in runs] == ["cpu", "cpu-avx2"]
    assert runs[1][1] == [
        sys.executable, "-m", "kvrig", "--matrix", "m.yaml", "column", "--platform", "cpu",
        "--isa", "avx2", "--rerun", "-k", "llama",
    ]  # fmt: skip
    assert "--matrix" not in columns.cpu_class_columns(["native"], None, False, [])[0][1]


class Runner:
    def __init__(self, codes: dict[str, int]) -> None:
        self.codes, self.ran = codes, []

    def __call__(self, command: Sequence[str]) -> int:
        isa_given = command[command.index("--isa") + 1] if "--isa" in command else "?"
        self.ran.append(isa_given)
        return self.codes.get(isa_given, 0)


def test_every_column_runs_even_after_one_fails_and_the_end_says_which(capsys) -> None:
    runs = columns.cpu_class_columns(["native", "avx2", "avx512"], None, False, [])
    runner = Runner({"avx2": 1, "avx512": 2})
    assert in_turn.run_columns(runs, "title", runner) == 1
    assert runner.ran == ["native", "avx2", "avx512"]
    out = capsys.readouterr().out
    assert "  passed  cpu  (results/cpu)" in out
    assert "  FAILED  cpu-avx2  (results/cpu-avx2)" in out
    assert "  refused cpu-avx512  (results/cpu-avx512)" in out
    assert in_turn.run_columns(runs[:1], "title", Runner({})) == 0


def test_kvrig_cpu_classes_runs_the_hosts_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns.hardware, "cpu_flags", lambda: AMX)
    monkeypatch.setattr(columns.hardware, "cpu_info", lambda: {"arch": "x86_64"})
    seen: list[list[str]] = []
    monkeypatch.setattr(
        in_turn, "run_columns", lambda runs, title: seen.extend(c for c, _ in runs) or 0
    )
    assert main(["cpu-classes", "-k", "x"]) == 0
    assert seen == ["cpu", "cpu-avx2", "cpu-avx512", "cpu-avx512_bf16"]


def test_the_emulated_devices_follow_only() -> None:
    everything = columns.emulated_columns(None, None, False, [])
    assert [c for c, _ in everything][-4:] == [
        "xpu-bmg-emulated",
        "rocm-gfx942-emulated",
        "rocm-gfx950-emulated",
        "rocm-gfx1201-emulated",
    ]
    assert len(everything) == 10
    rocm = columns.emulated_columns(["rocm"], None, False, [])
    assert [c for c, _ in rocm] == [
        "rocm-gfx942-emulated",
        "rocm-gfx950-emulated",
        "rocm-gfx1201-emulated",
    ]
    [(column, command)] = columns.emulated_columns(["cuda:9.0"], None, True, ["-x"])
    assert column == "cuda-sm90-emulated"
    assert command[-5:] == ["cuda", "--emulate", "9.0", "--rerun", "-x"]


def test_delegated_commands_get_their_arguments_exactly_and_the_global_matrix() -> None:
    assert delegated.split(["--matrix", "m.yaml", "container", "cpu", "--", "-k", "x"]) == (
        "m.yaml",
        "container",
        ["cpu", "--", "-k", "x"],
    )
    assert delegated.split(["--matrix=m.yaml", "bench", "--naive"]) == (
        "m.yaml",
        "bench",
        ["--naive"],
    )
    assert delegated.split(["column", "container"]) is None  # a pytest argument, not a command


def test_kvrig_container_hands_the_matrix_to_the_containers_own_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: list[list[str]] = []
    monkeypatch.setattr(delegated.launch, "main", lambda argv: given.append(argv) or 0)
    assert main(["--matrix", "m.yaml", "container", "cpu", "--dry-run", "--", "-x"]) == 0
    assert given == [["--matrix", "m.yaml", "cpu", "--dry-run", "--", "-x"]]


def test_emulated_columns_run_two_at_a_time_with_one_worker_each_unless_told(capsys) -> None:
    many = columns.emulated_columns(["rocm"], None, False, ["-x"])
    assert all(command[-3:] == ["-n", "0", "-x"] for _, command in many)
    assert columns.side_by_side(len(many), ["-x"]) == in_turn.SIDE_BY_SIDE == 2
    chosen = columns.emulated_columns(["rocm"], None, False, ["-n", "2"])
    assert all(command.count("-n") == 1 for _, command in chosen)  # the user's own
    assert columns.side_by_side(len(chosen), ["-n", "2"]) == 1
    started: list[str] = []

    def beside(column: str, command: list[str]) -> int:
        started.append(column)
        return {"rocm-gfx950-emulated": 1}.get(column, 0)

    outcome = in_turn.run_each(many, at_once=2, beside=beside)
    assert sorted(started) == sorted(c for c, _ in many)
    assert outcome == [  # in the order given, whichever ended first
        ("rocm-gfx942-emulated", 0),
        ("rocm-gfx950-emulated", 1),
        ("rocm-gfx1201-emulated", 0),
    ]


def test_grouped_columns_run_in_two_lanes_the_first_pair_from_two_groups() -> None:
    emulated = [p for p, _ in columns.gpus.chosen_devices(None)]
    order = [emulated[i] for i in in_turn.lanes(emulated)]
    # CUDA's six in one lane, ROCm's three and XPU's one in the other, taken in turn.
    assert order == ["cuda", "rocm"] * 3 + ["cuda", "xpu", "cuda", "cuda"]
    diff = [f"{side}: {p}" for side in ("0.33.0", "0.34.0") for p in emulated]
    pairs = [diff[i] for i in in_turn.lanes(diff)]
    # Each release's platforms in a lane of their own: the two sides overlap throughout.
    assert all(p.startswith("0.33.0") for p in pairs[0::2])
    assert all(p.startswith("0.34.0") for p in pairs[1::2])
    assert sorted(in_turn.lanes(diff)) == list(range(len(diff)))


def test_a_group_shares_its_parents_folder_which_is_stopped_when_its_last_column_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvrig.run import platform_parent

    stopped: list[tuple[str, list[str]]] = []
    given: dict[str, dict[str, str]] = {}
    monkeypatch.setattr(
        platform_parent.Parents,
        "stop",
        lambda self, group: stopped.append((group, sorted(given))),
    )
    runs = [(f"c{i}", ["kvrig", str(i)]) for i in range(4)]

    def beside(column: str, command: list[str], env: dict[str, str] | None = None) -> int:
        given[column] = dict(env or {})
        return 0

    groups = ["cuda", "cuda", "rocm", "cuda"]
    outcome = in_turn.run_each(runs, at_once=2, beside=beside, groups=groups)
    assert outcome == [(c, 0) for c, _ in runs]
    folders = {c: e[platform_parent.PARENTS_ENV] for c, e in given.items()}
    assert folders["c0"] == folders["c1"] == folders["c3"] != folders["c2"]
    assert {e[platform_parent.OWNER_ENV] for e in given.values()} == {str(os.getpid())}
    # Each group stopped once, after its own columns; then every group once more at the end.
    early = [group for group, _ in stopped[:2]]
    assert sorted(early) == ["cuda", "rocm"]
    [cuda_done] = [ran for group, ran in stopped[:2] if group == "cuda"]
    assert {"c0", "c1", "c3"} <= set(cuda_done)
