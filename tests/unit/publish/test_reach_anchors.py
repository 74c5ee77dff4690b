"""An arm found by its function and a fragment of one line, whatever line it moved to,
and turned into the lines whose running takes it; one the source lacks is named."""

from __future__ import annotations

from kvrig.define.reach_table import Arm
from kvrig.publish.reach.anchors import Located, Missing, find_defs, locate

SOURCE = """\
import math


class Platform:
    @classmethod
    def update(cls, config):
        if not config.user_size:
            config.size = 64
        if config.hybrid:
            config.size = 96
        elif config.dense:
            config.size = 16
        else:
            config.size = 1
        primary = (
            config.explicit
            if config.dtype != "auto"
            else config.model
        )
        assert primary >= 0, (
            "negative"
        )
        if config.skip:  config.size = 2
        if config.mode == "align":
            config.a = 1
        if config.mode == "align":
            config.b = 2
        return primary


def helper():
    def inner():
        if True:
            return 1
    return inner
"""


def arm(at: str, kind: str = "line", **kw: object) -> Arm:
    return Arm(at=at, arm=kind, **kw)  # type: ignore[arg-type]


def test_a_line_arm_is_taken_when_its_line_runs() -> None:
    found = locate(SOURCE, "Platform.update", arm("config.size = 64"))
    assert found == Located(8, enter=frozenset({8}))


def test_the_same_fragment_is_found_wherever_the_lines_moved() -> None:
    moved = locate("\n\n\n" + SOURCE, "Platform.update", arm("config.size = 64"))
    assert isinstance(moved, Located) and moved.line == 11


def test_a_true_arm_is_its_body() -> None:
    found = locate(SOURCE, "Platform.update", arm("if config.hybrid:", "true"))
    assert isinstance(found, Located) and found.enter == frozenset({10})


def test_a_false_arm_with_an_else_is_the_else() -> None:
    found = locate(SOURCE, "Platform.update", arm("if config.hybrid:", "false"))
    assert isinstance(found, Located) and found.enter == frozenset(range(11, 15))
    elif_ = locate(SOURCE, "Platform.update", arm("elif config.dense:", "false"))
    assert isinstance(elif_, Located) and elif_.enter == frozenset({14})


def test_a_false_arm_without_an_else_leaves_the_statement_or_the_function() -> None:
    found = locate(SOURCE, "Platform.update", arm("if not config.user_size:", "false"))
    assert isinstance(found, Located)
    assert found.leave == frozenset({7}) and found.inside == frozenset({7, 8})
    assert found.exit == -5  # the code object starts at its decorator
    assert not found.enter


def test_an_assertion_has_only_a_false_arm_by_the_exit() -> None:
    found = locate(SOURCE, "Platform.update", arm("assert primary >= 0, (", "false"))
    assert isinstance(found, Located) and found.exit_only and found.leave == frozenset({20})
    refused = locate(SOURCE, "Platform.update", arm("assert primary >= 0, (", "true"))
    assert isinstance(refused, Missing) and "assertion" in refused.reason


def test_a_conditional_expressions_arm_is_its_own_line() -> None:
    found = locate(SOURCE, "Platform.update", arm("else config.model"))
    assert isinstance(found, Located) and found.enter == frozenset({18})


def test_an_arm_on_its_conditions_line_cannot_be_told_apart() -> None:
    found = locate(SOURCE, "Platform.update", arm("if config.skip:", "true"))
    assert isinstance(found, Missing) and "shares its line" in found.reason


def test_a_line_that_holds_no_condition_has_no_true_arm() -> None:
    found = locate(SOURCE, "Platform.update", arm("config.size = 64", "true"))
    assert isinstance(found, Missing) and "no if" in found.reason


def test_a_fragment_on_several_lines_must_be_told_which() -> None:
    found = locate(SOURCE, "Platform.update", arm('if config.mode == "align":', "true"))
    assert isinstance(found, Missing) and "24, 26" in found.reason
    second = locate(SOURCE, "Platform.update", arm('if config.mode == "align":', "true", nth=2))
    assert isinstance(second, Located) and second.enter == frozenset({27})


def test_the_next_lines_of_code_tell_one_fragment_from_another() -> None:
    found = locate(
        SOURCE, "Platform.update", arm('if config.mode == "align":\nconfig.b = 2', "false")
    )
    assert isinstance(found, Located) and found.line == 26


def test_a_whole_line_wins_over_lines_that_contain_it() -> None:
    found = locate(SOURCE, "Platform.update", arm("primary"))  # `return primary` contains it
    assert isinstance(found, Missing)  # no line is `primary` alone, and several contain it
    found = locate(SOURCE, "Platform.update", arm("return primary"))
    assert isinstance(found, Located) and found.line == 28


def test_what_the_source_lacks_is_named() -> None:
    assert locate(SOURCE, "Platform.gone", arm("x")) == Missing("no function Platform.gone")
    nowhere = locate(SOURCE, "Platform.update", arm("config.size = 128"))
    assert isinstance(nowhere, Missing) and "nowhere" in nowhere.reason
    broken = locate("def f(:\n", "f", arm("x"))
    assert isinstance(broken, Missing) and "does not parse" in broken.reason


def test_nested_functions_are_found_by_their_path() -> None:
    import ast

    assert [d.name for d in find_defs(ast.parse(SOURCE), "helper.inner")] == ["inner"]
    found = locate(SOURCE, "helper.inner", arm("if True:", "false"))
    assert isinstance(found, Located) and found.exit == -32  # inner's own exit
