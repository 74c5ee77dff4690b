"""The compile prerequisites of CPU engines: a C++ compiler and Python.h."""

from __future__ import annotations

from pathlib import Path

from kvrig.provision import compiler


def test_what_is_missing_is_named_as_debian_packages(tmp_path: Path) -> None:
    (tmp_path / "Python.h").write_text("")
    assert compiler.needed(lambda name: "/usr/bin/g++", str(tmp_path), (3, 11)) == []
    assert compiler.needed(lambda name: None, str(tmp_path), (3, 11)) == ["g++"]
    empty = tmp_path / "none"
    assert compiler.needed(lambda name: "/usr/bin/g++", str(empty), (3, 12)) == ["python3.12-dev"]
