"""A number written in a `match:` pattern is that number, not a part of a longer one."""

from __future__ import annotations

import re

import pytest

from kvrig.define.patterns import names_something, whole_numbers
from kvrig.judge.verdict import judge, matches

from ..builders import cell_with
from ..records import failed

LATE = "select_common_block_size"


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("No common block size for 128", "No common block size for 1280 (A: [32])."),
        ("28 is", "block size 128 is not supported"),
        ("8 is not", "Aligned KV cache block size 128 is not supported"),
        ("size.*28 ", "block size 128 is"),
        ("128|256", "No common block size for 2560"),
        (r"(?:12)8", "size 1128"),
        ("12+", "size 31222"),
        ("for.*28", "No common block size for 128"),
    ],
)
def test_a_number_of_the_pattern_does_not_match_inside_a_longer_one(pattern, message) -> None:
    assert re.search(pattern, message), "plain search finds it: the case the rewrite is for"
    assert not matches(pattern, message)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("No common block size for 28", "No common block size for 128 (A: [32])."),
        ("for 8", "No common block size for 128"),
        (r"KVRIG_SIBLING: \[32\]", "share no size (KVRIG_SIBLING: [132])"),
        ("for (28|96)", "No common block size for 128"),
    ],
)
def test_a_number_after_a_word_is_not_the_end_of_a_longer_one(pattern, message) -> None:
    assert not matches(pattern, message)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("No common block size for 128", "No common block size for 128 (A: [32]; B: [48])."),
        ("28 is", "size 28 is not supported"),
        (
            r"share no supported KV cache block size.*KVRIG_SIBLING: \[32\]",
            "The attention backends share no supported KV cache block size (CPU_ATTN:"
            " [MultipleOf(32)]; KVRIG_SIBLING: [32])",
        ),
        (
            "FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
            "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
        ),
        (r"\d28", "size 128"),  # the pattern itself asks for a digit before 28
        (r"\d+28", "size 1128"),
        ("[0-9]28", "size 128"),
        (r"(?P<n>12)8", "size 128"),
        ("128|256", "at 256."),
        ("12+", "size 1222"),
        ("(?i)for 28", "FOR 28"),
        (r"a(?=28)", "a28"),
    ],
)
def test_a_whole_number_still_matches(pattern, message) -> None:
    assert matches(pattern, message)


def test_a_late_error_at_a_size_ending_in_the_pattern_s_number_fails() -> None:
    exp = {"outcome": "late_error", "match": "No common block size for 28"}
    assert judge(cell_with(exp), failed("No common block size for 28 (A).", LATE, True)).passed
    v = judge(cell_with(exp), failed("No common block size for 128 (A: [32]).", LATE, True))
    assert v.status == "fail"
    assert "message does not match" in v.reason


@pytest.mark.parametrize("pattern", ["", ".*", r"\w+", "(?:)", "[a-z]+", ".", " "])
def test_a_pattern_with_nothing_of_its_own_names_nothing(pattern) -> None:
    assert not names_something(pattern)


@pytest.mark.parametrize(
    "pattern",
    ["a", "8", r"\[32\]", r"No common block size for \d+", "(?i)sparse", "x*"],
)
def test_a_pattern_with_a_letter_or_digit_names_something(pattern) -> None:
    assert names_something(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        r"(?P<size>\d+) (?P=size)",
        r"(\d)\1 28",
        r"\x41\u0042\N{DIGIT ONE} 28",
        r"[]28] 28",
        r"[^]2] 2{2,3} 2{,3}? 2{} 2",
        r"(28)?(?#a 28 comment)(?(1)x|96)",
        r"(?<=28)(?<!96)x",
        r"(?s:a.28)",
    ],
)
def test_the_rewrite_of_any_pattern_compiles(pattern) -> None:
    re.compile(pattern)
    re.compile(whole_numbers(pattern))
