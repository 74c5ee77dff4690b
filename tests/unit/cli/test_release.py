"""`kvrig release diff` and `kvrig release check` without vLLM: the sides and their folders,
the previous release, the unread vLLM the check makes, and a diff of records written by hand
(what the columns would have left), read with --no-run the way a user re-reads a diff."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvrig.cli import release
from kvrig.cli.command import main
from kvrig.cli.usage import UsageError
from kvrig.define import named_release
from kvrig.define.matrix import load
from kvrig.provision import patches

from ..builders import NEWEST_READ, ROOT, UNREAD

PIN = named_release.pinned(load(ROOT / "matrix.yaml"), "cuda")


def _ns(**kw: object) -> argparse.Namespace:
    base = {"old": "0.33.0", "new": "0.34.0", "vllm_patch": None, "vllm_source": None,
            "results": None}  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_the_pinned_side_runs_into_the_releases_own_folders(tmp_path: Path) -> None:
    a, b = release.sides(_ns(), tmp_path, "0.34.0")
    assert a.folder == tmp_path / "a"
    assert b.folder == Path("results").resolve()  # results/<column>, resumed if finished
    a, b = release.sides(_ns(results=str(tmp_path)), tmp_path, "0.34.0")
    assert b.folder == tmp_path / "b"  # a folder of its own when one is named


def test_each_side_keeps_a_finished_column_unless_asked_to_rerun(tmp_path: Path) -> None:
    a, b = release.sides(_ns(), tmp_path, "0.34.0")
    label, command = release.column_command(None, b, "cuda", "9.0", rerun=False)
    assert label == "cuda-sm90-emulated (vLLM 0.34.0)"
    assert "--keep-finished" in command and "--rerun" not in command
    assert command[command.index("--results") + 1] == str(b.folder / "cuda-sm90-emulated")
    _, again = release.column_command(None, a, "cuda", "9.0", rerun=True)
    assert "--rerun" in again and "--keep-finished" not in again


def test_a_patched_side_is_never_the_release_folder(tmp_path: Path) -> None:
    patch = tmp_path / "x.diff"
    a, b = release.sides(_ns(old="0.34.0", vllm_patch=str(patch)), tmp_path, "0.34.0")
    assert a.folder == Path("results").resolve()
    assert b.folder.parent == tmp_path and b.folder.name.startswith("b-")
    assert b.overlay == ("--vllm-patch", str(patch)) and "with the Python of" in b.label


def test_a_release_against_itself_or_two_new_sides_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="against itself shows nothing"):
        release.sides(_ns(old="0.34.0"), tmp_path, "0.34.0")
    with pytest.raises(UsageError, match="not both"):
        release.sides(_ns(vllm_patch="a", vllm_source="b"), tmp_path, "0.34.0")


def test_devices_and_the_previous_release() -> None:
    assert release.devices(["cuda:9.0"]) == [("cuda", "9.0")]
    assert ("xpu", "bmg") in release.devices(None)
    with pytest.raises(UsageError, match="not an emulated device"):
        release.devices(["cuda:7.5"])
    assert release.previous_release("0.34.0") == "0.33.0"
    assert release.previous_release(UNREAD) == NEWEST_READ
    with pytest.raises(UsageError, match="no release before"):
        release.previous_release("0.20.0")


def test_the_unread_vllm_doubles_the_start_size_and_applies(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    (package / "config").mkdir(parents=True)
    text = "class CacheConfig:\n    DEFAULT_BLOCK_SIZE: ClassVar[int] = 64\n    other = 1\n"
    (package / "config" / "cache.py").write_text(text)
    diff = release.start_size_patch(package)
    (new,) = patches.apply(patches.read(diff), lambda path: text).values()
    assert "DEFAULT_BLOCK_SIZE: ClassVar[int] = 128" in str(new)
    (package / "config" / "cache.py").write_text("class CacheConfig:\n    pass\n")
    with pytest.raises(UsageError, match="declares no `DEFAULT_BLOCK_SIZE"):
        release.start_size_patch(package)


def _record(cell_id: str, block: int) -> dict:
    return {
        "cell_id": cell_id,
        "outcome": "configured",
        "worker_block_size": block,
        "kernel_block_sizes": [block, block],
        "layer_backends": {"model.layers.1.self_attn.attn": "FLASH_ATTN"},
    }


def _column(folder: Path, records: dict[str, int]) -> None:
    (folder / "records").mkdir(parents=True)
    for cell_id, block in records.items():
        (folder / "records" / f"{cell_id}.json").write_text(json.dumps(_record(cell_id, block)))


def test_a_diff_of_what_the_folders_hold_explains_or_reds_each_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    column = "cuda-sm90-emulated"
    cell = f"{column}-granite_hybrid-default"
    _column(tmp_path / "a" / column, {cell: 144})
    _column(tmp_path / "b" / column, {cell: 192})
    argv = ["release", "diff", "0.33.0", "0.34.0", "--only", "cuda:9.0", "--no-run"]
    code = main([*argv, "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert cell in out and "explained" in out and "default_block_size 16 -> 64" in out
    # Every other cell of the column has no record on either side: red, and said.
    assert code == 1 and "not on both sides" in out
    data = json.loads((tmp_path / "diff.json").read_text())
    assert [m["cell_id"] for m in data["moves"]] == [cell] and data["moves"][0]["explained"]
    assert (tmp_path / "diff.md").is_file() and (tmp_path / "diff.html").is_file()


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("{cell}.old.json", None),  # a copy of the cell's record, as it was before
        ("notes.json", "{}"),
        ("{cell}.tmp", "{"),
    ],
)
def test_a_side_whose_records_folder_holds_anything_but_one_record_per_cell_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str | None
) -> None:
    """Without the stray file the move is read, and red; with a copy of the old record
    beside the new one, the copy would be read for the cell and hide it."""
    column = "cuda-sm90-emulated"
    cell = f"{column}-granite_hybrid-default"
    _column(tmp_path / "a" / column, {cell: 144})
    _column(tmp_path / "b" / column, {cell: 208})
    argv = ["release", "diff", "0.33.0", "0.34.0", "--only", "cuda:9.0", "--no-run"]
    assert main([*argv, "--results", str(tmp_path)]) == 1
    assert f"{cell}  UNEXPLAINED" in capsys.readouterr().out
    stray = tmp_path / "b" / column / "records" / name.format(cell=cell)
    stray.write_text(text if text is not None else json.dumps(_record(cell, 192)))
    assert main([*argv, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{stray.parent} holds 1 file(s) that are no cell's record" in err
    assert stray.name in err and err.count("\n") == 1


def test_a_release_kvrig_cannot_know_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["release", "diff", "0.33.4", "0.34.0", "--results", str(tmp_path)]
    assert main(argv) == 2
    assert "falls between" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(PIN is None, reason="the matrix pins no CUDA release")
def test_without_releases_the_diff_is_the_previous_read_one_against_the_pin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["release", "diff", "--only", "cuda:9.0", "--no-run", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"B: vLLM {PIN}" in out and f"A: vLLM {release.previous_release(str(PIN))}" in out


def test_the_release_check_runs_every_proof_s_columns_together_the_pinned_one_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[list[tuple[str, list[str]]], list[str]]] = []

    def run_each(commands, at_once, groups):  # type: ignore[no-untyped-def]
        ran.append((commands, groups))
        return [(label, 0) for label, _ in commands]

    monkeypatch.setattr(release.in_turn, "run_each", run_each)
    check = argparse.Namespace(matrix=None, only=None, device="cuda:9.0", rerun=False)
    patch = tmp_path / "doubled.diff"
    explained = release._diff_ns(check, "0.33.0", str(PIN), None, None)
    unread = release._diff_ns(check, str(PIN), str(PIN), None, str(patch))
    assert explained.no_run and unread.no_run  # compared after every column ran
    release.run_proof_columns([explained, unread], str(PIN))
    [(commands, groups)] = ran
    labels = [label for label, _ in commands]
    assert labels == [
        "cuda-sm90-emulated (vLLM 0.33.0)",
        f"cuda-sm90-emulated (vLLM {PIN})",
        f"cuda-sm90-emulated (vLLM {PIN} with the Python of {patch})",
    ]
    assert len(set(groups)) == 3
    monkeypatch.setattr(
        release.in_turn, "run_each", lambda commands, **kw: [(c[0], 2) for c in commands]
    )
    with pytest.raises(UsageError, match="could not run the column of"):
        release.run_proof_columns([explained], str(PIN))
