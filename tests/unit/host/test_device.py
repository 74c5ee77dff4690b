"""The device check a real GPU's column runs before each cell (kvrig.host.device), and the
column ending at the first cell whose device is gone (kvrig.column.plugin)."""

from __future__ import annotations

import fnmatch
import importlib.machinery
import importlib.util
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvrig.column import plugin
from kvrig.define import column_choice
from kvrig.host import device

from ..builders import ROOT


def looks(
    nodes: Sequence[str] = (),
    usable: bool = True,
    smi: tuple[int, str] | None = (0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"),
) -> device.Looks:
    return device.Looks(
        glob=lambda pattern: [n for n in nodes if fnmatch.fnmatch(n, pattern)],
        usable=lambda path: usable,
        which=lambda tool: None if smi is None else f"/usr/bin/{tool}",
        run=lambda cmd: smi or (127, ""),
    )


def test_a_cuda_gpu_passed_in_and_listed_is_usable() -> None:
    assert device.missing("cuda", looks(["/dev/nvidia0", "/dev/nvidiactl"])) is None


def test_a_cuda_container_without_device_nodes_says_it_was_started_without_the_gpu() -> None:
    reason = device.missing("cuda", looks(["/dev/nvidiactl"], smi=None))
    assert reason is not None and "/dev/nvidiaN" in reason and "--gpus all" in reason
    assert device.missing("cuda", looks(["/dev/dxg"], smi=None)) is None  # WSL's GPU node


def test_a_gpu_the_driver_no_longer_lists_is_gone() -> None:
    gone = looks(["/dev/nvidia0"], smi=(6, "No devices were found"))
    reason = device.missing("cuda", gone)
    assert reason is not None and "No devices were found" in reason


def test_without_nvidia_smi_the_device_node_is_enough() -> None:
    assert device.missing("cuda", looks(["/dev/nvidia0"], smi=None)) is None


def test_an_xpu_render_node_the_user_cannot_open_names_the_render_group() -> None:
    reason = device.missing("xpu", looks(["/dev/dri/renderD128"], usable=False))
    assert reason is not None and "render group" in reason and "renderD128" in reason
    assert device.missing("xpu", looks(["/dev/dri/renderD128"])) is None
    assert "--device /dev/dri" in (device.missing("xpu", looks([])) or "")


def test_the_cpu_has_no_device_to_lose() -> None:
    assert device.missing("cpu", looks([])) is None


def test_this_host_has_no_cuda_device() -> None:
    """The real looks, on a host without a GPU (as every CI host of the rig's own is)."""
    if Path("/dev/nvidia0").exists():
        pytest.skip("this host has an NVIDIA GPU")
    assert device.missing("cuda") is not None


def test_a_gpu_column_stops_at_the_first_cell_once_its_device_is_gone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No engine starts: the check runs in each cell's setup, before the cell does, and the
    run stays unfinished so that the same command resumes there."""
    real = column_choice.choose

    def on_an_h100(*args: object, **kwargs: object) -> column_choice.Choice:
        if kwargs.get("gpu_arch") == "9.0":
            return column_choice.Choice("cuda", arch="9.0")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(column_choice, "choose", on_an_h100)
    monkeypatch.setattr(plugin.device, "missing", lambda platform: "the GPU has gone")
    # vLLM need not be here: no cell gets as far as an engine.
    stand_in = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    stand_in.submodule_search_locations = [str(tmp_path)]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: stand_in if name == "vllm" else find_spec(name, *a),
    )
    matrix = tmp_path / "matrix.yaml"
    shutil.copy(ROOT / "matrix.yaml", matrix)
    results = tmp_path / "results"
    done = pytester.runpytest(
        str(matrix),
        "-p",
        "no:cacheprovider",
        "--kvrig-platform=cuda",
        "--kvrig-gpu-arch=9.0",
        "--kvrig-cold",
        f"--kvrig-results={results}",
    )
    out = done.stdout.str()
    assert done.ret == pytest.ExitCode.INTERRUPTED, out
    assert "the cuda-sm90 column stops before" in out and "the GPU has gone" in out
    assert not list((results / "cells").glob("*/record.json"))
