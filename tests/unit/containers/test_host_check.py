"""The GPU host checks that run before anything is installed: each missing piece is one
paragraph naming what to install (fake hosts: no GPU is needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kvrig.containers import host_check as hc
from kvrig.containers import preflight as pf

from ..builders import ROOT

IMAGE = "nvidia/cuda:13.0.2-runtime-ubuntu24.04"


def host(
    driver: str = "580.95.05",
    tools: Sequence[str] = ("nvidia-smi", "nvidia-ctk"),
    cdi: Sequence[str] = (),
    compute_cap: str = "9.0",
) -> pf.Probe:
    def run(cmd: Sequence[str]) -> tuple[int, str]:
        if cmd[:2] == ["nvidia-smi", "-L"]:
            return 0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
        if "--query-gpu=compute_cap" in cmd:
            return 0, compute_cap
        if cmd[0] == "nvidia-smi":
            return 0, driver
        return 127, "not found"

    def glob(folder: Path, pattern: str) -> list[Path]:
        return [folder / n for n in cdi if Path(n).match(pattern) and folder == Path("/etc/cdi")]

    return pf.Probe(
        which=lambda name: f"/usr/bin/{name}" if name in tools else None, run=run, glob=glob
    )


def test_a_host_with_gpu_driver_and_toolkit_passes() -> None:
    hc.check("cuda", IMAGE, host())
    hc.check("cuda", IMAGE, host(tools=("nvidia-smi",), cdi=("nvidia.yaml",)))


def test_no_gpu_stops_before_anything_else() -> None:
    with pytest.raises(pf.PreflightError, match="`nvidia-smi` is not installed"):
        hc.check("cuda", IMAGE, host(tools=()))


def test_a_driver_too_old_for_the_images_cuda_is_named_with_the_one_needed() -> None:
    with pytest.raises(
        pf.PreflightError, match=r"at least 580\.65\.06, and this host has 550\.54\.15"
    ):
        hc.check("cuda", IMAGE, host(driver="550.54.15"))
    hc.check("cuda", "nvidia/cuda:12.8.1-runtime", host(driver="550.54.15"))


def test_a_host_without_the_toolkit_or_a_cdi_spec_is_told_how_to_get_one() -> None:
    with pytest.raises(pf.PreflightError, match="nvidia-ctk cdi generate"):
        hc.check("cuda", IMAGE, host(tools=("nvidia-smi",)))


def test_the_gpus_architecture_must_be_known_and_the_one_the_runner_is_labelled_for() -> None:
    hc.check("cuda", IMAGE, host(), gpu_arch="sm90")
    with pytest.raises(pf.PreflightError, match=r"compute capability 9\.0, and the column was"):
        hc.check("cuda", IMAGE, host(), gpu_arch="sm89")
    with pytest.raises(pf.PreflightError, match=r"compute capability 7\.5, an architecture kvrig"):
        hc.check("cuda", IMAGE, host(compute_cap="7.5"))
    with pytest.raises(pf.PreflightError, match=r"'7\.5' is not a cuda architecture kvrig knows"):
        hc.check("cuda", IMAGE, host(), gpu_arch="7.5")
    with pytest.raises(pf.PreflightError, match="nvidia-smi does not say"):
        hc.check("cuda", IMAGE, host(compute_cap="[N/A]"))


def test_the_images_cuda_is_read_off_its_tag() -> None:
    assert hc.image_cuda(IMAGE) == (13, 0)
    assert hc.image_cuda("vllm/vllm-openai:v0.33.0") is None


def test_the_command_exits_2_naming_the_missing_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from kvrig.cli import main

    with pytest.raises(pf.PreflightError, match="The CUDA column needs an NVIDIA GPU"):
        hc.check_host("cuda", host(tools=()))
    no_dri = pf.Probe(exists=lambda p: False, glob=lambda p, pat: [])
    with pytest.raises(pf.PreflightError, match="has no render node"):
        hc.check_host("xpu", no_dri)
    monkeypatch.setattr(hc, "Probe", lambda: host(tools=()))
    assert main(["check", "host", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: The CUDA column needs an NVIDIA GPU") and err.count("\n") == 1
    # `nox -s rocm` on a host without an AMD GPU: the first check, one paragraph.
    assert main(["check", "host", "rocm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvrig: The ROCm column needs an AMD GPU, but neither `amd-smi`")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["check", "host", "tpu"])
    assert exit_.value.code == 2


def test_the_container_sessions_check_the_host_before_installing_an_engine() -> None:
    text = (ROOT / "noxfile.py").read_text()
    body = text.split("def _container_column(")[1].split("\n@nox")[0]
    check = body.index('"check", "host", platform, *session.posargs')
    assert check < body.index("_container_engine(session, *engine_packages)")
    for platform in ("cpu", "cuda", "xpu", "rocm"):
        session = text.split(f"def {platform}(session: nox.Session)")[1].split("\n@nox")[0]
        assert f'_container_column(session, "{platform}"' in session, platform
    # What the sessions run, with these arguments: tests/unit/containers/test_advice.py.
