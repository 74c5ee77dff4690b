"""`kvrig gate`: the release gate over the release's columns, against the previous run.

Exit 0 only if every required cell passed or is allowed (kvrig.publish.gate decides);
this side finds the results, keeps side runs out unless named, and says what it left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.cli.results import folders_of
from kvrig.cli.usage import UsageError
from kvrig.define.column_names import hardware_columns
from kvrig.define.matrix import load
from kvrig.define.vllm_names import PLATFORMS
from kvrig.publish import gate as gate_mod
from kvrig.publish import repro
from kvrig.publish import results as results_mod
from kvrig.run import holds


def _previous(ns: argparse.Namespace, merged: results_mod.Merged) -> tuple[list[dict], str] | None:
    """The rows to compare with: --previous, else the previous-results.jsonl beside each."""
    if ns.previous:
        prev = results_mod.collect([Path(p) for p in ns.previous])
        if not prev.rows:
            raise UsageError(
                f"No results in {', '.join(ns.previous)} to compare with. Pass a results"
                " folder (or its results.jsonl) of the earlier run."
            )
        return prev.rows, ", ".join(ns.previous)
    beside = {p.parent / results_mod.PREVIOUS_FILE for p in merged.sources.values()}
    found = sorted(p for p in beside if p.is_file())
    if not found:
        return None
    prev = results_mod.collect(found, results_mod.PREVIOUS_FILE)
    return prev.rows, ", ".join(str(p) for p in found)


@dataclass(frozen=True)
class Found:
    """What the gate reads: the merged rows and what was left out, the cells read from
    side runs named with --side, and the release folders that hold a side run."""

    merged: results_mod.Merged
    chosen: gate_mod.Selection
    side_cells: frozenset[str]
    refused: list[str]


def _found(ns: argparse.Namespace) -> Found:
    """The rows, and what of them is a side run's: a folder named as a release column is
    the release's, named with --side or not, and its rows are held to the release's vLLM."""
    merged, chosen, side_files = _gate_results(ns)
    side_files = {f for f in side_files if holds.release_column(f.parent) is None}
    side_cells = frozenset(c for c, path in merged.sources.items() if path in side_files)
    held = {
        path.parent: holds.read(path.parent) for path, _ in chosen.sources if path not in side_files
    }
    return Found(merged, chosen, side_cells, gate_mod.side_folders(held))


def _gate_results(
    ns: argparse.Namespace,
) -> tuple[results_mod.Merged, gate_mod.Selection, set[Path]]:
    """The release columns' results under --results (default: results/<column>), and the
    side runs named with --side; everything else found is left out and named."""
    side = [Path(s) for s in ns.side or []]
    folders = folders_of(ns.results) if ns.results or not side else []
    side_files = results_mod.files(side)
    for given in side:
        if not results_mod.files([given]):
            raise UsageError(
                f"No results in {given}, named with --side. Name a side run's results folder"
                " (results/<column>-overlay-<digest>, say) or its results.jsonl."
            )
    found = [*results_mod.files(folders), *side_files]
    sources = [(f, results_mod.read_file(f)) for f in dict.fromkeys(found)]
    chosen = gate_mod.select(sources, hardware_columns(), side=set(side_files))
    merged = results_mod.merge(chosen.sources)
    if not merged.rows and not ns.platform:
        shown = ", ".join(str(f) for f in [*folders, *side]) or "results/<platform>"
        left = f" (left out: {'; '.join(chosen.ignored)})" if chosen.ignored else ""
        raise UsageError(
            f"No release results in {shown}{left}. Run a column first (nox -s local, or nox -s"
            " cpu|cuda|xpu|rocm), then gate its results folder(s) (results/<column>, or a tree of"
            " them); a side run is gated only when named with --side."
        )
    for clash in merged.clashes:
        print(f"note: {clash}", file=sys.stderr)
    return merged, chosen, set(side_files)


def cmd_gate(ns: argparse.Namespace, extra: list[str]) -> int:
    today = dt.datetime.now(dt.timezone.utc).date()
    m = load(ns.matrix, today=today)
    # With --platform the gate knows what to require, so no results at all is a failure.
    found = _found(ns)
    merged, chosen = found.merged, found.chosen
    # The columns matrix.yaml's release requires, unless named here; the others found are
    # said, not gated.
    if ns.platform:
        platforms = gate_mod.named_columns(m, ns.platform)
    else:
        platforms = gate_mod.required_columns(m, chosen.columns)
    for column in chosen.columns:
        if column not in platforms:
            print(
                f"not required: the {column} column (required: matrix.yaml's release.columns,"
                " or --platform)"
            )
    previous = None if ns.no_previous else _previous(ns, merged)
    if previous:
        print(f"comparing with {previous[1]}")
    res = gate_mod.evaluate(
        m,
        merged.rows,
        platforms,
        today,
        previous=previous[0] if previous else None,
        accept_block_size_changes=ns.accept_block_size_changes,
        repro=repro.lines,
        ignored=chosen.ignored,
        standing=gate_mod.Standing.of(m, found.side_cells),
        refused=found.refused,
    )
    print("\n".join(res.lines))
    return 0 if res.passed else 1


def register(sub: Any) -> None:
    g = sub.add_parser("gate", help="exit 0 only if every required cell passed")
    g.add_argument(
        "--results",
        action="append",
        help="folder or tree, repeatable; only release column folders in it are read"
        " (default: results/<column>, results/<column>-shard<i>)",
    )
    g.add_argument(
        "--side",
        action="append",
        metavar="FOLDER",
        help="a side run to gate on as named (an overlay's results/<column>-overlay-<digest>),"
        " repeatable; without --results only the side runs are read",
    )
    g.add_argument(
        "--platform",
        action="append",
        choices=[*PLATFORMS, *(c for c in hardware_columns() if c not in PLATFORMS)],
        help="a column whose required cells must pass, or a platform for all of its"
        " columns (cuda: one per architecture matrix.yaml's ci.archs lists); repeatable"
        " (default: matrix.yaml's release.columns)",
    )
    g.add_argument(
        "--previous",
        action="append",
        help="earlier results to compare with (default: previous-results.jsonl beside each)",
    )
    g.add_argument("--no-previous", action="store_true", help="compare with nothing")
    g.add_argument("--accept-block-size-changes", action="store_true")
    g.set_defaults(run=cmd_gate)
