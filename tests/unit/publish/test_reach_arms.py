"""Whether a process's raw arcs take an arm: the arcs coverage.py records with the
settings a reach run gives it, on real code (a small module, not vLLM), then the rule
that reads them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvrig.define.reach_table import Arm
from kvrig.publish.reach import measured
from kvrig.publish.reach.anchors import Located, locate
from kvrig.publish.reach.arms import taken
from kvrig.run import reach as hook

MODULE = textwrap.dedent(
    """\
    class Platform:
        @classmethod
        def pick(cls, sizes, dtype, user):
            chosen = [
                s for s in sizes
                if s % 16 == 0
            ] or [1]
            width = (
                2
                if dtype == "bf16"
                else 4
            )
            if user:
                chosen = [user]
            if all(s > 0 for s in chosen):
                return chosen[0] * width
            return 0

        @classmethod
        def check(cls, size):
            assert size > 0, (
                f"size {size} is not positive"
            )
            return size
    """
)
CALLS = "Platform.pick([32], 'bf16', None); Platform.check(1)"


def run_measured(root: Path, name: str, source: str, call: str) -> set[tuple[int, int]]:
    """The raw arcs of one call into a module placed at vllm/<name>, measured as a reach
    run measures a cell (coverage.py started from rc_text), in a process of its own."""
    path = root / "vllm" / name
    path.parent.mkdir(parents=True)
    for package in path.relative_to(root).parents[:-1]:  # vllm/platforms, vllm
        (root / package / "__init__.py").write_text("")
    path.write_text(source)
    rc = root / "coveragerc"
    rc.write_text(hook.rc_text([name]))
    module = "vllm." + name.removesuffix(".py").replace("/", ".")
    script = (
        "import coverage\n"
        f"cov = coverage.Coverage(data_file='data', config_file={str(rc)!r})\n"
        "cov.start()\n"
        f"from {module} import *\n"
        f"{call}\n"
        "cov.stop(); cov.save()\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=root, check=True)
    (data,) = root.glob("data.*")  # parallel: one file per process
    found = measured.read_arcs(data)
    assert list(found) == [str(path)]  # only the table's files
    return next(iter(found.values()))


@pytest.fixture(scope="module")
def arcs(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[int, int]]:
    """The raw arcs of one run of CALLS."""
    root = tmp_path_factory.mktemp("reach")
    return run_measured(root, "platforms/interface.py", MODULE, CALLS)


def where(at: str, kind: str = "line", function: str = "Platform.pick") -> Located:
    found = locate(MODULE, function, Arm(at=at, arm=kind))  # type: ignore[arg-type]
    assert isinstance(found, Located), found
    return found


def test_the_arm_of_a_conditional_expression_that_ran_is_seen(arcs: set) -> None:
    assert taken(where("2"), arcs)
    assert not taken(where("else 4"), arcs)


def test_an_or_default_is_seen_only_when_it_is_taken(arcs: set) -> None:
    assert not taken(where("] or [1]"), arcs)


def test_an_if_without_else_that_was_false_leaves_it(arcs: set) -> None:
    assert taken(where("if user:", "false"), arcs)
    assert not taken(where("if user:", "true"), arcs)


def test_a_generators_own_exit_is_not_the_false_arm(arcs: set) -> None:
    # all(...) runs a generator on the condition's line, which exits on that line too.
    assert taken(where("if all(s > 0 for s in chosen):", "true"), arcs)
    assert not taken(where("if all(s > 0 for s in chosen):", "false"), arcs)


def test_an_assertion_that_held_took_no_arm(arcs: set) -> None:
    check = "Platform.check"
    assert not taken(where("assert size > 0, (", "false", check), arcs)
    assert not taken(where('f"size {size} is not positive"', function=check), arcs)


def test_the_rule_on_arcs_alone() -> None:
    false_arm = Located(10, leave=frozenset({10}), inside=frozenset({10, 11}), exit=-5)
    assert taken(false_arm, [(10, 12)])  # to the next statement
    assert taken(false_arm, [(10, -5)])  # out of the function
    assert not taken(false_arm, [(10, 11)])  # into its body
    assert not taken(false_arm, [(10, -10)])  # a generator on line 10 ending
    assert not taken(false_arm, [(9, 12)])  # from another line
    failing = Located(20, leave=frozenset({20}), inside=frozenset({20}), exit=-5, exit_only=True)
    assert taken(failing, [(20, -5)]) and not taken(failing, [(20, 21)])
    assert taken(Located(7, enter=frozenset({8, 9})), [(3, 9)])
    assert not taken(Located(7, enter=frozenset({8})), [(8, -1)])  # an exit is no entry


JUMP_ON_BODY = textwrap.dedent(
    """\
    def select(block, tensors):
        kernel = (
            block
            if any(
                t > 3
                for t in tensors
            )
            else block // 2
        )
        return kernel
    """
)


@pytest.mark.parametrize(("tensors", "outermost"), [([1], False), ([5], True)])
def test_a_conditionals_first_value_is_taken_only_when_true(
    tmp_path: Path, tensors: list[int], outermost: bool
) -> None:
    """The compiler puts the jump of `any(...)` on the first value's line, so that line
    runs either way: the arm is the value leaving it (vLLM's prepare_kernel_block_sizes)."""
    arcs = run_measured(tmp_path, "v1/worker/utils.py", JUMP_ON_BODY, f"select(64, {tensors})")
    line_ran = any(b == 3 for _, b in arcs)
    assert line_ran  # the first value's line runs whichever way the test went
    first = locate(JUMP_ON_BODY, "select", Arm(at="block", arm="true"))
    other = locate(JUMP_ON_BODY, "select", Arm(at="else block // 2", arm="line"))
    assert isinstance(first, Located) and isinstance(other, Located)
    assert taken(first, arcs) is outermost
    assert taken(other, arcs) is not outermost
