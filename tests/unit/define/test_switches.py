"""A release switch is one declaration: its steps give its value at any release, the rules
are read from the switches, and docs/releases.md's table lists each of them."""

from __future__ import annotations

import re
from dataclasses import replace

from kvrig.define import releases
from kvrig.rules import versions

from ..builders import ROOT

TWICE = releases.switch(
    "default_block_size",
    "start",
    16,
    ((0, 34, 0), 64, (0, 33, 0)),
    ((0, 36, 0), 128, (0, 35, 0)),
    where="vllm/config/cache.py: CacheConfig.DEFAULT_BLOCK_SIZE",
    evidence="a default that moves again: one more step of the same switch",
    platforms=("cuda", "xpu", "rocm"),
    elsewhere=releases.CPU_START,
)


def test_a_default_that_moves_twice_is_one_switch_with_two_steps() -> None:
    at = {v: TWICE.at(releases.parse(v)) for v in ("0.33.0", "0.34.0", "0.35.0", "0.36.0")}
    assert at == {"0.33.0": 16, "0.34.0": 64, "0.35.0": 64, "0.36.0": 128}
    assert TWICE.at((0, 33, 1)) is None and TWICE.at((0, 35, 1)) is None  # where a step landed
    assert TWICE.on("cpu", (0, 36, 0)) == releases.CPU_START
    assert (
        TWICE.known_text()
        == "known up to 0.33.0 and from 0.34.0 and up to 0.35.0 and from 0.36.0 on"
    )
    assert TWICE.seen() == {(0, 33, 0), (0, 34, 0), (0, 35, 0), (0, 36, 0)}


def test_a_release_diff_across_both_steps_names_the_one_switch() -> None:
    old = versions.rules("cuda", "0.33.0")
    new = replace(versions.rules("cuda", "0.34.0"), start=TWICE.at((0, 36, 0)))
    moved = [s.name for s in versions.differing(old, new)]
    assert moved.count("default_block_size") == 1
    assert versions.reverted(new, old, releases.DEFAULT_START).start == 16


def test_the_rules_are_read_from_the_switches() -> None:
    for platform in ("cpu", "cuda", "xpu", "rocm"):
        for release in ("0.32.0", "0.33.0", "0.34.0"):
            rules = versions.rules(platform, release)
            v = releases.parse(release)
            for s in releases.SWITCHES:
                assert getattr(rules, s.field) == s.on(platform, v), (platform, release, s.name)
    assert len({s.field for s in releases.SWITCHES}) == len(releases.SWITCHES)


def test_docs_list_every_switch_in_the_table_of_switches() -> None:
    text = (ROOT / "docs" / "releases.md").read_text()
    table = text[text.index("| switch | before | from | where |") :].split("\n\n")[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    named = {n for row in rows for n in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == {s.name for s in releases.SWITCHES}, (
        "docs/releases.md's table of switches must name each switch of"
        " kvrig.define.releases.SWITCHES, and nothing else, in its first column"
    )
