"""The uv-cache proof: a changed cached vLLM file fails it; a new install does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvrig.cli import main
from kvrig.provision import uv_cache


def check(action: str, snap: Path) -> int:
    return main(["check", "uv-cache", action, str(snap)])


def _cache(tmp_path: Path) -> Path:
    cache = tmp_path / "uv"
    pkg = cache / "archive-v0" / "abc" / "vllm" / "platforms"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "interface.py").write_text("check\n")
    (cache / "archive-v0" / "abc" / "torch").mkdir()  # not vLLM: not hashed
    (cache / "archive-v0" / "abc" / "torch" / "x.py").write_text("")
    return cache


def test_digests_cover_every_cached_vllm_file_and_changes_are_found(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    before = uv_cache.digests(cache)
    assert sorted(Path(p).name for p in before) == ["__init__.py", "interface.py"]
    (cache / "archive-v0" / "new" / "vllm").mkdir(parents=True)
    (cache / "archive-v0" / "new" / "vllm" / "__init__.py").write_text("")
    assert uv_cache.changed(before, uv_cache.digests(cache)) == []  # added: fine
    target = cache / "archive-v0" / "abc" / "vllm" / "platforms" / "interface.py"
    target.write_text("no check\n")
    assert uv_cache.changed(before, uv_cache.digests(cache)) == [str(target)]


def test_snapshot_then_compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    cache = _cache(tmp_path)
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    snap = tmp_path / "snap.json"
    assert check("compare", snap) == 2  # no snapshot yet: says so
    assert "take one first (kvrig check uv-cache snapshot" in capsys.readouterr().err
    assert check("snapshot", snap) == 0
    assert json.loads(snap.read_text())["cache"] == str(cache)
    assert check("compare", snap) == 0
    assert "byte-identical" in capsys.readouterr().out
    (cache / "archive-v0" / "abc" / "vllm" / "__init__.py").write_text("changed")
    assert check("compare", snap) == 1
    assert "uv cache CHANGED" in capsys.readouterr().out


def test_an_empty_snapshot_says_there_was_nothing_to_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "empty"))
    snap = tmp_path / "snap.json"
    assert check("snapshot", snap) == 0
    assert check("compare", snap) == 0
    assert "nothing to compare" in capsys.readouterr().out


def test_without_uv_the_cache_cannot_be_found_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    monkeypatch.setenv("UV", str(tmp_path / "no-uv"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check("snapshot", tmp_path / "snap.json") == 2
    assert "uv is not on PATH" in capsys.readouterr().err
