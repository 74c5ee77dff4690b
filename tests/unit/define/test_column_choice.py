"""Which column a run is, decided in one place for kvrig column, the plugin, kvrig cells
and kvrig container (fake hosts: no GPU, no particular CPU needed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvrig.define.column_choice import Choice, ChoiceError, choose, requested

AVX512 = {"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl"}


@dataclass
class FakeHost:
    platform: str = "cpu"
    flags: set[str] = field(default_factory=lambda: set(AVX512))
    arch: str = "x86_64"
    gpu_arch: str | None = None  # what nvidia-smi says (--query-gpu=compute_cap)


def test_the_hosts_platform_and_class_when_none_is_named() -> None:
    assert choose(None, host=FakeHost()) == Choice("cpu", "avx512", emulated=False)
    assert choose(None, host=FakeHost()).column == "cpu"
    h100 = FakeHost(platform="cuda", gpu_arch="9.0")
    assert choose(None, host=h100) == Choice("cuda", arch="9.0")
    assert choose(None, host=h100).column == "cuda-sm90"


def test_a_lesser_class_is_emulated_into_its_own_column() -> None:
    chosen = choose("cpu", "avx2", host=FakeHost())
    assert chosen == Choice("cpu", "avx2", emulated=True)
    assert chosen.column == "cpu-avx2"
    # Named, even as the host's own class: emulated, as the CPU-class columns are.
    assert choose("cpu", "avx512", host=FakeHost()).column == "cpu-avx512"


def test_a_class_above_the_host_or_unknown_is_refused() -> None:
    with pytest.raises(ChoiceError, match="needs the flags avx512_bf16"):
        choose("cpu", "avx512_bf16", host=FakeHost())
    with pytest.raises(ChoiceError, match="Unknown CPU class 'sse'"):
        choose("cpu", "sse", host=FakeHost())
    with pytest.raises(ChoiceError, match="has no AVX2"):
        choose("cpu", host=FakeHost(flags=set()))


def test_a_gpu_column_needs_its_device_and_has_no_cpu_class() -> None:
    with pytest.raises(ChoiceError, match="The cuda column needs an NVIDIA GPU"):
        choose("cuda", host=FakeHost())
    with pytest.raises(ChoiceError, match="an Intel XPU"):
        choose("xpu", host=FakeHost(platform="cuda"))
    with pytest.raises(ChoiceError, match="--isa avx2 names a CPU class, and the cuda column"):
        choose("cuda", "avx2", host=FakeHost(platform="cuda", gpu_arch="9.0"))
    with pytest.raises(ChoiceError, match="Unknown platform 'tpu'"):
        choose(None, host=FakeHost(platform="tpu"))  # KVRIG_PLATFORM=tpu


def test_an_emulated_device_needs_no_gpu_but_a_gpu_platform() -> None:
    chosen = choose("cuda", emulate="sm90", host=FakeHost())
    assert chosen == Choice("cuda", device="9.0")
    assert chosen.column == "cuda-sm90-emulated"
    assert choose(None, emulate="9.0", host=FakeHost(platform="cuda")).device == "9.0"
    with pytest.raises(ChoiceError, match="--emulate fakes a GPU"):
        choose(None, emulate="9.0", host=FakeHost())
    with pytest.raises(ChoiceError, match="an emulated cuda device has none"):
        choose("cuda", "avx2", emulate="9.0", host=FakeHost())
    with pytest.raises(ChoiceError, match=r"'7\.0' is not a cuda architecture"):
        choose("cuda", emulate="7.0", host=FakeHost())


def test_a_named_column_is_checked_without_a_host() -> None:
    assert requested("cpu", "amx").column == "cpu-amx"  # listed, not run: no flags needed
    assert requested(None, "avx2") == Choice("cpu", "avx2", emulated=True)
    assert requested("xpu") == Choice("xpu")
    assert requested("xpu", emulate="bmg").column == "xpu-bmg-emulated"
    with pytest.raises(ChoiceError, match="Unknown CPU class"):
        requested("cpu", "sse")


def test_a_cuda_column_is_named_by_its_gpu_and_a_label_must_match_it() -> None:
    l40s = FakeHost(platform="cuda", gpu_arch="8.9")
    assert choose("cuda", gpu_arch="sm89", host=l40s).column == "cuda-sm89"
    assert choose("cuda", gpu_arch="8.9", host=l40s) == Choice("cuda", arch="8.9")
    with pytest.raises(ChoiceError, match=r"compute capability 8\.9, and the column was asked"):
        choose("cuda", gpu_arch="sm90", host=l40s)  # a runner labelled for another GPU
    with pytest.raises(ChoiceError, match="nvidia-smi does not say"):
        choose("cuda", host=FakeHost(platform="cuda"))
    # An architecture kvrig keeps no expectations for is refused, not run on the base ones.
    with pytest.raises(ChoiceError, match=r"'7\.5' is not a cuda architecture"):
        choose("cuda", host=FakeHost(platform="cuda", gpu_arch="7.5"))


def test_gpu_arch_is_a_real_cuda_devices_only() -> None:
    assert requested("cuda", gpu_arch="10.0").column == "cuda-sm100"  # listed without a GPU
    for platform, kwargs in (("xpu", {}), ("cpu", {}), ("cuda", {"emulate": "9.0"})):
        with pytest.raises(ChoiceError, match=r"--gpu-arch 9\.0 names the architecture"):
            requested(platform, gpu_arch="9.0", **kwargs)
    with pytest.raises(ChoiceError, match=r"--gpu-arch 9\.0 names"):
        requested("cuda", "avx2", gpu_arch="9.0")
