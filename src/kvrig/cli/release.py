"""`kvrig release diff OLD NEW`: the emulated columns of two vLLMs, and what moved.

A move no rule switch explains is red, so a new release (or a patch or checkout over one)
cannot change a block size without kvrig's rules being read for it. Exit 0: every move
explained; 1: an unexplained move, or a cell one side could not show; 2: refused.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.cli import in_turn
from kvrig.cli.usage import UsageError
from kvrig.define import gpus, named_release
from kvrig.define.cells import expand
from kvrig.define.loader import default_matrix
from kvrig.define.matrix import Matrix, load
from kvrig.define.paths import RESULTS_ROOT
from kvrig.provision import overlay
from kvrig.publish import compare, release_diff
from kvrig.publish import results as results_mod
from kvrig.rules import versions

ROOT_FOLDER = "release-diff"


@dataclass(frozen=True)
class SideRun:
    """One side: the release named, what is laid over it, where its columns go."""

    name: str  # as given: 0.34.0, or a wheel's path
    named: named_release.NamedRelease
    overlay: tuple[str, ...]  # --vllm-patch FILE / --vllm-source PATH, or nothing
    folder: Path

    @property
    def label(self) -> str:
        over = f" with the Python of {self.overlay[1]}" if self.overlay else ""
        return f"{self.named.describe()}{over}"


def devices(only: list[str] | None) -> list[tuple[str, str]]:
    """The emulated devices the diff runs (`--only cuda:9.0`, `--only xpu`), all without."""
    try:
        return gpus.chosen_devices(only)
    except gpus.GpuError as exc:
        raise UsageError(str(exc)) from None


def sides(ns: argparse.Namespace, root: Path, pin: str | None) -> tuple[SideRun, SideRun]:
    """The two sides. The unpatched pin runs into the release's own folders, so a column the
    `emulated` session finished with the same matrix and software is kept, not run again."""
    overlay: tuple[str, ...] = ()
    if ns.vllm_patch and ns.vllm_source:
        raise UsageError("Give --vllm-patch or --vllm-source, not both: the new side is one vLLM.")
    if ns.vllm_patch:
        overlay = ("--vllm-patch", str(Path(ns.vllm_patch).resolve()))
    elif ns.vllm_source:
        overlay = ("--vllm-source", str(Path(ns.vllm_source).resolve()))
    old, new = named_release.parse(ns.old), named_release.parse(ns.new)
    if old == new and not overlay:
        raise UsageError(
            f"A diff of vLLM {ns.old} against itself shows nothing: name two releases, or give"
            " the new one a patch or a checkout (--vllm-patch, --vllm-source)."
        )
    tag = _overlay_tag(overlay)
    own = None if ns.results else RESULTS_ROOT.resolve()

    def folder(named: named_release.NamedRelease, laid: tuple[str, ...], default: Path) -> Path:
        plain = not laid and named.wheel is None and pin is not None
        pinned = plain and versions.parse(named.version) == versions.parse(pin)  # type: ignore[arg-type]
        return own if pinned and own is not None else default

    return (
        SideRun(ns.old, old, (), folder(old, (), root / "a")),
        SideRun(ns.new, new, overlay, folder(new, overlay, root / ("b" + tag))),
    )


def _overlay_tag(overlay: tuple[str, ...]) -> str:
    if not overlay:
        return ""
    return "-" + hashlib.sha256(overlay[1].encode()).hexdigest()[:8]


def diff_root(ns: argparse.Namespace) -> Path:
    if ns.results:
        return Path(ns.results).resolve()
    old = named_release.parse(ns.old).slug
    new = named_release.parse(ns.new).slug
    return (RESULTS_ROOT / ROOT_FOLDER / f"{old}--{new}").resolve()


def column_command(
    matrix: str | None, side: SideRun, platform: str, arch: str, rerun: bool
) -> tuple[str, list[str]]:
    column = gpus.emulated_column(platform, arch)
    folder = side.folder / column
    command = in_turn.kvrig_command(
        matrix, "column", "--platform", platform, "--emulate", arch, "--vllm", side.name,
        *side.overlay, "--results", str(folder), "--rerun" if rerun else "--keep-finished",
        *in_turn.ONE_WORKER, "-q", "--tb=no",
    )  # fmt: skip
    return f"{column} (vLLM {side.label})", command


def run_sides(
    ns: argparse.Namespace, runs: tuple[SideRun, SideRun], chosen: list[tuple[str, str]]
) -> None:
    """Both sides' columns at once (kvrig.cli.in_turn); a refused column stops the diff, as
    there would be nothing to compare. Red cells are the diff's data, not its failure."""
    run_columns([(ns.matrix, side, p, a, ns.rerun) for side in runs for p, a in chosen])


def run_columns(columns: list[tuple[str | None, SideRun, str, str, bool]]) -> None:
    """Each distinct column once, two at a time, a side's platform sharing its parents."""
    unique: dict[str, tuple[tuple[str, list[str]], str]] = {}
    for matrix, side, platform, arch, rerun in columns:
        label, command = column_command(matrix, side, platform, arch, rerun)
        unique.setdefault(" ".join(command), ((label, command), f"{side.label}: {platform}"))
    commands = [command for command, _ in unique.values()]
    groups = [group for _, group in unique.values()]
    outcome = in_turn.run_each(commands, at_once=in_turn.SIDE_BY_SIDE, groups=groups)
    refused = [label for label, code in outcome if code == 2]
    if refused:
        raise UsageError(
            f"The release diff could not run the column of {'; '.join(refused)}: the paragraph"
            " above says why. Nothing was compared."
        )


def side_info(matrix: Matrix, side: SideRun, platform: str) -> release_diff.Side:
    """How the report names a side, and why its rules may not be its own."""
    rules = versions.rules(platform, side.named.version)
    unread = rules.unread
    if side.overlay and unread is None:
        unread = (
            f"the Python of {side.overlay[1]} over {side.named.describe()}: kvrig's rules were"
            f" read for {versions.shown(rules.version)}'s code, not for this change"
        )
    return release_diff.Side(side.label, side.named.version, unread)


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A side's records and rows, exactly one record per cell: anything else in records/ is
    refused, named, since a copy read as a record could stand for its cell and hide a move."""
    records, strays = {}, []
    where = folder / "records"
    for path in sorted(where.iterdir()) if where.is_dir() else []:
        data = _record_at(path)
        if data is None or f"{data['cell_id']}.json" != path.name:
            strays.append(path.name)
            continue
        records[data["cell_id"]] = data
    if strays:
        raise UsageError(
            f"{where} holds {len(strays)} file(s) that are no cell's record as a column writes"
            f" it, `<cell id>.json` holding that cell ({compare.names(strays)}); the diff reads"
            " one record per cell, and a copy could stand for its cell. Move them out of"
            " records/ (a *.tmp is a write a killed run left: rerun that column) and run the"
            " diff again."
        )
    rows = {r["cell_id"]: r for r in results_mod.read(folder)} if folder.is_dir() else {}
    return records, rows


def _record_at(path: Path) -> dict[str, Any] | None:
    """The record a file holds (a JSON object naming its cell), or None."""
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("cell_id"), str) else None


def pairs(
    matrix: Matrix, runs: tuple[SideRun, SideRun], chosen: list[tuple[str, str]]
) -> list[release_diff.CellPair]:
    old, new = runs
    out = []
    for platform, arch in chosen:
        column = gpus.emulated_column(platform, arch)
        per_side = []
        for side in runs:
            m, _ = named_release.for_column(matrix, platform, True, side.name)
            per_side.append(expand(m, platform, gpu_arch=arch, device_emulated=True))
        old_records, old_rows = _read(old.folder / column)
        new_records, new_rows = _read(new.folder / column)
        out += release_diff.pairs_of(
            column, per_side[0], per_side[1], old_records, new_records, old_rows, new_rows
        )
    return out


def write(found: release_diff.Diff, root: Path, title: str) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "diff.json").write_text(json.dumps(release_diff.as_json(found), indent=2))
    md, page = root / "diff.md", root / "diff.html"
    md.write_text(release_diff.markdown(found, title))
    page.write_text(release_diff.to_html(found, title))
    return md, page


def run_diff(ns: argparse.Namespace) -> release_diff.Diff:
    """Both sides run (unless --no-run), compared, written and printed."""
    matrix = load(ns.matrix or default_matrix())
    chosen = devices(ns.only)
    root = diff_root(ns)
    runs = sides(ns, root, named_release.pinned(matrix, "cuda"))
    for side in runs:  # refuse a release the rules cannot know before anything runs
        named_release.for_column(matrix, "cuda", True, side.name)
    if not ns.no_run:
        run_sides(ns, runs, chosen)
    old, new = (side_info(matrix, s, "cuda") for s in runs)
    found = release_diff.diff(pairs(matrix, runs, chosen), old, new)
    title = f"kvrig release diff: vLLM {old.label} -> {new.label}"
    md, page = write(found, root, title)
    print()
    print(release_diff.terminal(found))
    print(f"diff: {md}  {page}  ({root / 'diff.json'})")
    return found


def cmd_diff(ns: argparse.Namespace, extra: list[str]) -> int:
    if ns.old is None or ns.new is None:
        pin = named_release.pinned(load(ns.matrix or default_matrix()), "cuda")
        if pin is None:
            raise UsageError(
                "matrix.yaml's cuda platform pins no release: name both, kvrig release diff"
                " OLD NEW."
            )
        ns.new = ns.new or pin
        ns.old = ns.old or previous_release(ns.new)
    return 1 if run_diff(ns).red else 0


def previous_release(pin: str) -> str:
    """The newest release before the pin that kvrig's CUDA rules were read in."""
    older = [
        r.version
        for r in versions.READ
        if "cuda" in r.platforms and r.version < versions.parse(pin)
    ]
    if not older:
        raise UsageError(
            f"kvrig's rules were read in no release before {pin}, so there is nothing to diff"
            " it against; add the previous release to kvrig.define.releases.READ."
        )
    return versions.shown(max(older))


def start_size_patch(package: Path) -> str:
    """A diff of the installed vLLM that doubles CacheConfig.DEFAULT_BLOCK_SIZE: a vLLM
    kvrig has never read, whose every moved cell its rules cannot explain."""
    path = package / "config" / "cache.py"
    text = path.read_text()
    m = re.search(r"^\s*DEFAULT_BLOCK_SIZE: ClassVar\[int\] = (\d+)", text, re.M)
    if m is None:
        raise UsageError(
            f"{path} declares no `DEFAULT_BLOCK_SIZE: ClassVar[int] = N`: the release moved its"
            " start size elsewhere, so the release check cannot make its unread vLLM. Read"
            " the release (kvrig release diff) and point start_size_patch at the new place."
        )
    new = text[: m.start(1)] + str(2 * int(m.group(1))) + text[m.end(1) :]
    name = "vllm/config/cache.py"
    body = difflib.unified_diff(
        text.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return f"diff --git a/{name} b/{name}\n" + "".join(body)


@dataclass(frozen=True)
class Proof:
    what: str
    held: bool
    detail: str


def _diff_ns(
    ns: argparse.Namespace, old: str, new: str, root: Path | None, patch: str | None
) -> argparse.Namespace:
    return argparse.Namespace(
        matrix=ns.matrix,
        old=old,
        new=new,
        only=ns.only or [ns.device],
        results=str(root) if root else None,
        vllm_patch=patch,
        vllm_source=None,
        rerun=ns.rerun,
        no_run=True,  # the proofs' columns run together first (run_proof_columns)
    )


def run_proof_columns(asked: list[argparse.Namespace], pin: str) -> None:
    """Every column the diffs compare, before any is compared: each diff's new column is
    one import of vLLM on one core, so two diffs' columns side by side take half the time
    one after the other would; the pinned side (the `emulated` session's column, kept) is
    shared, so it is run (resumed) once."""
    matrix = load(asked[0].matrix or default_matrix())
    columns = []
    for diff_ns in asked:
        runs = sides(diff_ns, diff_root(diff_ns), pin)
        for side in runs:  # refuse a release the rules cannot know before anything runs
            named_release.for_column(matrix, "cuda", True, side.name)
        chosen = devices(diff_ns.only)
        columns += [(diff_ns.matrix, side, p, a, diff_ns.rerun) for side in runs for p, a in chosen]
    run_columns(columns)


def prove_explained(ns: argparse.Namespace, prev: str, pin: str) -> Proof:
    # The pinned side in the release's own folders: the `emulated` session's column kept.
    found = run_diff(_diff_ns(ns, prev, pin, None, None))
    held = not found.red and found.compared > 0
    return Proof(
        f"kvrig release diff {prev} {pin}: every moved cell explained by a rule switch",
        held,
        release_diff.summary(found),
    )


def unread_patch(root: Path) -> Path:
    """The pin with its start size doubled, as a diff (kvrig's rules never read it)."""
    patch = root / "start-size-doubled.diff"
    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_text(start_size_patch(overlay.installed_package()))
    return patch


def prove_unread_is_red(ns: argparse.Namespace, pin: str, patch: Path) -> Proof:
    """The pinned release with its start size doubled: moves no switch explains (red), and
    none of its cells passed on kvrig's rules for the release (UNREAD or FAIL)."""
    asked = _diff_ns(ns, pin, pin, None, str(patch))  # the pin's side: its own folders
    found = run_diff(asked)
    side_b = sides(asked, diff_root(asked), pin)[1].folder
    rows = [r for f in sorted(side_b.glob("*")) if f.is_dir() for r in results_mod.read(f)]
    plain = [
        r["cell_id"]
        for r in rows
        if r.get("status") == "pass" and r.get("expected") != "unsupported"
    ]
    held = bool(found.unexplained) and not plain and bool(rows)
    detail = release_diff.summary(found) + (
        f"; passed plainly on rules not read for it: {', '.join(plain[:5])}" if plain else ""
    )
    return Proof(
        f"vLLM {pin} with its start size doubled: unexplained moves red, no cell judged by"
        " older rules as a plain pass",
        held,
        detail,
    )


def prove_mutation(ns: argparse.Namespace, release: str) -> Proof:
    command = in_turn.kvrig_command(
        ns.matrix, "check", "mutation", "--emulate", ns.device.split(":")[1], "--vllm", release
    )
    code = subprocess.run(command, check=False).returncode
    return Proof(
        f"the mutation check on vLLM {release}'s emulated {ns.device} column",
        code == 0,
        f"exit {code}",
    )


def cmd_check(ns: argparse.Namespace, extra: list[str]) -> int:
    """The release gate's own proof, in a form CI runs: the previous release against the
    pinned one explained; an unread vLLM red; the mutation check on the previous release."""
    matrix = load(ns.matrix or default_matrix())
    pin = named_release.pinned(matrix, "cuda")
    if pin is None:
        raise UsageError("matrix.yaml's cuda platform pins no release, so there is none to check.")
    prev = ns.previous or previous_release(pin)
    patch = unread_patch((RESULTS_ROOT / "release-check").resolve())
    run_proof_columns(
        [_diff_ns(ns, prev, pin, None, None), _diff_ns(ns, pin, pin, None, str(patch))], pin
    )
    proofs = [
        prove_explained(ns, prev, pin),
        prove_unread_is_red(ns, pin, patch),
        prove_mutation(ns, prev),
    ]
    print("\nkvrig release check:")
    for proof in proofs:
        print(f"  {'held  ' if proof.held else 'FAILED'} {proof.what} ({proof.detail})")
    return 0 if all(p.held for p in proofs) else 1


def register(sub: Any) -> None:
    r = sub.add_parser("release", help="what moved between two vLLM releases (kvrig release diff)")
    what = r.add_subparsers(dest="what", required=True, metavar="WHAT")
    d = what.add_parser(
        "diff",
        help="the emulated columns of two vLLMs (every architecture and XPU, or --only), and"
        " every cell whose outcome, size, backends, kernel sizes or error moved, each"
        " explained by a rule switch or red",
    )
    d.add_argument(
        "old",
        metavar="OLD",
        nargs="?",
        help="a release (0.33.0) or a vLLM wheel file (default: the one read before the pin)",
    )
    d.add_argument(
        "new",
        metavar="NEW",
        nargs="?",
        help="a release (0.34.0) or a vLLM wheel file (default: the one matrix.yaml pins)",
    )
    d.add_argument("--vllm-patch", metavar="FILE", help="the new side: NEW with this diff")
    d.add_argument("--vllm-source", metavar="PATH", help="the new side: this checkout over NEW")
    in_turn.declare_emulated(d)
    d.add_argument("--results", metavar="DIR", help="default: results/release-diff/OLD--NEW")
    d.add_argument(
        "--no-run", action="store_true", help="compare what the folders hold; run nothing"
    )
    d.set_defaults(run=cmd_diff)
    c = what.add_parser(
        "check",
        help="the release tooling proved on one emulated device: the previous release against"
        " the pinned one explained, an unread vLLM (the pin with its start size doubled) red,"
        " and the mutation check on the previous release",
    )
    c.add_argument("--device", default="cuda:9.0", help="the emulated device (default cuda:9.0)")
    c.add_argument("--previous", metavar="RELEASE", help="default: the release read before the pin")
    c.add_argument("--rerun", action="store_true", help="run every cell again (default: resume)")
    c.set_defaults(run=cmd_check, only=None)
