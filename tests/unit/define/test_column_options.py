"""The column's options are declared once: kvrig column, the pytest plugin and kvrig
container take the same ones, under their own spellings, with the same help."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvrig.cli.command import parser as kvrig_parser
from kvrig.containers import plan
from kvrig.containers.args import parse_args
from kvrig.containers.assemble import make_plan
from kvrig.define import column_options as co

from ..builders import ROOT

OVERLAY = ("vllm-source", "vllm-patch")


def _options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in kvrig_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_kvrig_column_takes_every_option_with_the_tables_help() -> None:
    given = _options_of(_subparser("column"))
    for option in co.OPTIONS:
        assert f"--{option.name}" in given, option.name
        assert given[f"--{option.name}"].help == option.help


def test_the_plugin_takes_the_same_under_kvrig_names_except_the_overlays(
    pytester: pytest.Pytester,
) -> None:
    config = pytester.parseconfig("-p", "kvrig")
    declared = {
        name: argument.attrs().get("help")
        for argument in config._parser.getgroup("kvrig").options
        for name in argument.names()
    }
    for option in co.OPTIONS:
        spelled = f"--kvrig-{option.name}"
        if option.name in OVERLAY:  # built before pytest starts, by kvrig column
            assert spelled not in declared
            continue
        assert declared[spelled] == option.help, spelled
        assert config.getoption(spelled) == (False if option.flag else option.default)
    assert "--kvrig-cell" in declared  # the plugin's own: a pytest selection


def test_the_container_takes_what_means_something_in_a_container() -> None:
    args = parse_args(
        ["cpu", "--isa", "avx2", "--rerun", "--shard", "1/2", "--results", "r", "-k", "x"], {}
    )
    assert args.results == Path("r")  # the host's folder, mounted: not handed on
    assert args.column_args == ("--isa=avx2", "--rerun", "--shard=1/2")
    assert args.pytest_args == ["-k", "x"]
    # The platform is its first argument; an emulated GPU is handed on to the column.
    assert parse_args(["cpu", "--platform", "cuda"], {}).pytest_args == ["--platform", "cuda"]
    emulated = parse_args(["cuda", "--emulate", "9.0"], {})
    assert (emulated.emulate, emulated.column_args) == ("9.0", ("--emulate=9.0",))


def test_a_forwarded_class_names_the_hosts_folder_and_reaches_the_column(
    tmp_path: Path,
) -> None:
    root = ROOT
    args = parse_args(["cpu", "--isa", "avx2", "--cold", "--", "-x"], {})
    made = make_plan(args, root, plan.Host(uid=1000, gid=1000), "docker", {}, "n")
    assert made.results == (root / "results" / "cpu-avx2").resolve()
    inside = made.run[made.run.index("kvrig") :]
    assert inside == [
        "kvrig", "column", "--platform", "cpu", "--results", "/results",
        "--isa=avx2", "--cold", "-x",
    ]  # fmt: skip
    with pytest.raises(plan.UsageError, match="the cuda column has none"):
        make_plan(
            parse_args(["cuda", "--isa", "avx2"], {}),
            root,
            plan.Host(uid=1000, gid=1000),
            "docker",
            {},
            "n",
        )


def test_the_command_line_leaves_out_what_is_unset_off_or_default() -> None:
    values = {"platform": "cpu", "isa": "native", "cold": False, "rerun": True, "shard": None}
    assert co.command_line(values, co.PYTEST) == ["--kvrig-platform=cpu", "--kvrig-rerun"]
    assert co.command_line({**values, "isa": "avx2"}, co.CLI) == [
        "--platform=cpu",
        "--isa=avx2",
        "--rerun",
    ]
    # The overlay is built before pytest starts: never handed to it.
    assert co.command_line({"vllm_patch": "fix.diff"}, co.PYTEST) == []
    assert co.command_line({"vllm_patch": "fix.diff"}, co.CLI) == ["--vllm-patch=fix.diff"]
