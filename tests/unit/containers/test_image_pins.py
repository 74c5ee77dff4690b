"""The matrix's pin overrides in an image, as on a host: only the overrides whose pin the
release declares reach the build, and its stamp is the one every record reads."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvrig.containers import plan as c
from kvrig.containers.args import parse_args
from kvrig.containers.assemble import make_plan
from kvrig.provision import pins, stamp
from kvrig.provision.install import Plan

from ..builders import ROOT
from ..container_builders import MATRIX, USER, flag_values
from ..provision.fake_index import INDEX, FakeIndex, wheel

MAPPING = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
WHY = "matrix.yaml platforms.cuda.pin_overrides"
ENV = {"UV_DEFAULT_INDEX": INDEX}
PYPI = 'vllm: {kind: pypi, package: vllm, version: "0.33.0"}'
V34 = 'vllm: {kind: pypi, package: vllm, version: "0.34.0"}'
V33 = PYPI
TAKEN = (
    f"flashinfer-python==0.7.3 pinned by vllm 0.34.0; {WHY} takes flashinfer-python==0.7.4"
    " instead: the image's environment is not the release's own"
)
DOCKERFILES = ("cpu", "cuda", "xpu")


def served() -> FakeIndex:
    """0.34.0 pins the flashinfer the index lacks; 0.33.0 pins one it has."""
    fake = FakeIndex()
    fake.release("vllm", "0.34.0", ["torch==2.14.0", "flashinfer-python==0.7.3"], metadata=True)
    fake.release("vllm", "0.33.0", ["torch==2.14.0", "flashinfer-python==0.7.2.post1"])
    return fake


def with_cuda(checkout: Path, vllm: str, mapping: dict[str, str] | None = MAPPING) -> None:
    """The checkout's matrix with its cuda platform's vLLM `vllm` and `mapping` as its
    pin_overrides."""
    extra = f"    pin_overrides: {json.dumps(mapping)}\n" if mapping else ""
    (checkout / "matrix.yaml").write_text(MATRIX.replace(f"    {PYPI}\n", f"    {vllm}\n{extra}"))


def plan_for(
    checkout: Path,
    argv: tuple[str, ...] = ("cuda",),
    env: dict[str, str] = ENV,
    **kw: object,
) -> c.Plan:
    args = parse_args(list(argv), {})
    host_env = {"HOME": str(checkout), **env}
    return make_plan(args, checkout, USER, "docker", host_env, "kvrig-cuda-1", **kw)  # type: ignore[arg-type]


def build_args(plan: c.Plan) -> dict[str, str]:
    return dict(a.split("=", 1) for a in flag_values(plan.build, "--build-arg"))


def stamped_overrides(plan: c.Plan) -> list[dict[str, object]]:
    return json.loads(build_args(plan)["VLLM_STAMP"])["overrides"]


# --- which overrides the build takes -------------------------------------------------------


def test_the_build_takes_an_override_only_for_a_release_that_pins_it(checkout: Path) -> None:
    with_cuda(checkout, V34)
    plan = plan_for(checkout, get=served())
    assert build_args(plan)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"
    # The stamp's override is the host's, word for word (kvrig.provision.pin_check).
    host = pins.from_matrix(
        MAPPING, [pins.Pin("flashinfer-python", "0.7.3")], "cuda", "vllm 0.34.0"
    )
    assert stamped_overrides(plan) == [o.as_json() for o in host]
    assert plan.pins.lines == (TAKEN,)
    # A release that pins another flashinfer is not touched.
    with_cuda(checkout, V33)
    older = plan_for(checkout, get=served())
    assert "PIN_OVERRIDES" not in build_args(older)
    assert stamped_overrides(older) == [] and older.pins.lines == ()


def test_the_overrides_are_in_the_tag_and_an_untouched_release_keeps_its_own(
    checkout: Path,
) -> None:
    with_cuda(checkout, V34)
    overridden = plan_for(checkout, get=served()).image
    with_cuda(checkout, V34, mapping=None)  # no pin_overrides: no index is read at all
    assert plan_for(checkout).image != overridden
    with_cuda(checkout, V33)
    untouched = plan_for(checkout, get=served()).image
    with_cuda(checkout, V33, mapping=None)
    assert plan_for(checkout).image == untouched


def test_the_dry_run_names_the_overrides_before_the_build(checkout: Path) -> None:
    with_cuda(checkout, V34)
    lines = c.dry_run_lines(plan_for(checkout, get=served()))
    build = next(i for i, ln in enumerate(lines) if " build " in ln)
    assert lines.index(f"# {TAKEN}") < build
    assert "PIN_OVERRIDES=flashinfer-python==0.7.4" in shlex.split(lines[build])


def test_from_wheels_reads_the_images_release_and_the_image_itself_installs_nothing(
    checkout: Path,
) -> None:
    with_cuda(checkout, 'vllm: {kind: image, image: "vllm/vllm-openai:v0.34.0"}')
    fake = served()
    image = build_args(plan_for(checkout, get=fake))
    assert fake.calls == []  # vLLM's own image: its pins are its own business
    assert "PIN_OVERRIDES" not in image and "VLLM_STAMP" not in image
    wheels = plan_for(checkout, ("cuda", "--from-wheels"), get=fake)
    assert build_args(wheels)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"


def test_a_plan_made_again_takes_the_pins_already_read(checkout: Path) -> None:
    with_cuda(checkout, V34)
    fake = served()
    first = plan_for(checkout, get=fake)
    read = len(fake.calls)
    again = plan_for(checkout, get=fake, base_override="local/base:1", pinned=first.pins)
    assert len(fake.calls) == read and again.pins == first.pins
    assert build_args(again)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"


def test_a_wheels_pins_are_read_from_the_file_in_the_checkout(checkout: Path) -> None:
    name = "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    (checkout / "docker" / "wheels").mkdir()
    (checkout / "docker" / "wheels" / name).write_bytes(
        wheel("vllm", "0.34.0", ["flashinfer-python==0.7.3"])
    )
    with_cuda(checkout, f"vllm: {{kind: wheel, wheel: docker/wheels/{name}}}")
    down = FakeIndex(down=True)
    plan = plan_for(checkout, get=down)
    assert down.calls == []
    assert build_args(plan)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"
    assert json.loads(build_args(plan)["VLLM_STAMP"])["release"] == name


def test_a_vllm_built_from_git_leaves_its_pins_to_uv_as_on_a_host(checkout: Path) -> None:
    with_cuda(checkout, "vllm: {kind: git, git_ref: v0.34.0}")
    fake = served()
    plan = plan_for(checkout, get=fake)
    assert fake.calls == [] and "PIN_OVERRIDES" not in build_args(plan)
    assert plan.pins.lines == (
        "a vLLM built from git: its pins are left to uv (platforms.cuda.pin_overrides not applied)",
    )
    assert f"# {plan.pins.lines[0]}" in c.dry_run_lines(plan)


# --- pins that cannot be read ----------------------------------------------------------------


def test_pins_that_cannot_be_read_are_said_and_the_matrixs_overrides_taken_anyway(
    checkout: Path,
) -> None:
    with_cuda(checkout, V34)
    plan = plan_for(checkout, get=FakeIndex(down=True))
    [line] = plan.pins.lines
    assert line.startswith("could not read vllm 0.34.0's pins (index.example did not answer")
    assert (
        "the image takes platforms.cuda.pin_overrides as written (flashinfer-python==0.7.3 ->"
        " flashinfer-python==0.7.4), and its stamp says the environment is not the release's"
        " own"
    ) in line
    assert f"# {line}" in c.dry_run_lines(plan)
    assert build_args(plan)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"
    [o] = stamped_overrides(plan)
    assert (
        o["replaces"] == "flashinfer-python==0.7.3, if vllm 0.34.0 pins it (its pins were not read)"
    )
    # Not the image of a release whose pins were read: the stamps differ, so do the tags.
    assert plan.image != plan_for(checkout, get=served()).image
    # UV_OFFLINE: kvrig reads no index either, and says so.
    fake = served()
    offline = plan_for(checkout, env={**ENV, "UV_OFFLINE": "1"}, get=fake)
    assert fake.calls == [] and "uv is offline (UV_OFFLINE)" in offline.pins.lines[0]
    assert build_args(offline)["PIN_OVERRIDES"] == "flashinfer-python==0.7.4"


# --- the Dockerfiles ---------------------------------------------------------------------------


def run_bodies(text: str) -> list[str]:
    """Each RUN instruction's shell, its lines joined as the builder joins them (comment
    lines inside dropped) and its options (--mount) left out."""
    bodies: list[str] = []
    current: str | None = None
    for line in text.splitlines():
        if current is None and not line.startswith("RUN "):
            continue
        if current is not None and line.lstrip().startswith("#"):
            continue
        current = (current or "") + line.removesuffix("\\")
        if not line.endswith("\\"):
            bodies.append(re.sub(r"^RUN\s+(--mount=\S+\s+)*", "", current))
            current = None
    return bodies


@pytest.mark.parametrize("platform", DOCKERFILES)
def test_every_run_instruction_is_bash(platform: str) -> None:
    bash = shutil.which("bash") or pytest.skip("no bash here")
    text = (ROOT / "docker" / f"Dockerfile.{platform}").read_text()
    for body in run_bodies(text):
        done = subprocess.run([bash, "-n", "-c", body], capture_output=True, text=True)
        assert done.returncode == 0, (done.stderr, body)


@pytest.mark.parametrize("platform", DOCKERFILES)
def test_the_dockerfile_hands_uv_the_overrides_in_a_file(platform: str, tmp_path: Path) -> None:
    bash = shutil.which("bash") or pytest.skip("no bash here")
    text = (ROOT / "docker" / f"Dockerfile.{platform}").read_text()
    [install] = [b for b in run_bodies(text) if "PIN_OVERRIDES" in b]
    start = install.index('if [ -n "${PIN_OVERRIDES}" ]; then')
    snippet = install[start : install.index("fi;", start) + len("fi;")]
    target = re.search(r"/opt/[\w-]+overrides\.txt", snippet)
    assert target is not None and f"--override {target[0]}" in install  # uv reads that file
    script = snippet.replace(target[0], str(tmp_path / "overrides.txt"))
    # The CPU image's file holds its exclusions already: they are kept, as on the host.
    before = "torchvision ; sys_platform == 'never'\n" if target[0] in install[:start] else ""
    (tmp_path / "overrides.txt").write_text(before)
    env = {"PATH": os.environ.get("PATH", ""), "PIN_OVERRIDES": "flashinfer-python==0.7.4 a[x]==1"}
    subprocess.run([bash, "-eu", "-o", "pipefail", "-c", script], env=env, check=True)
    wanted = f"{before}flashinfer-python==0.7.4\na[x]==1\n"
    assert (tmp_path / "overrides.txt").read_text() == wanted
    # The stamp is written once the rig, which writes it, is installed beside vLLM.
    [rig] = [b for b in run_bodies(text) if "VLLM_STAMP" in b]
    assert rig.index("kvrig.run.vllm_plugin") < rig.index("kvrig.provision.stamp")
    assert text.index("COPY src/ src/") < text.index("kvrig.provision.stamp write")


@pytest.mark.parametrize("platform", DOCKERFILES)
def test_the_stamp_the_dockerfile_writes_is_the_one_every_record_reads(
    platform: str, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_cuda(checkout, V34)
    planned = build_args(plan_for(checkout, get=served()))["VLLM_STAMP"]
    text = (ROOT / "docker" / f"Dockerfile.{platform}").read_text()
    [call] = re.findall(r"python3 -m kvrig\.provision\.stamp (.+?); fi", text)
    argv = [planned if a == "${VLLM_STAMP}" else a for a in shlex.split(call)]
    prefix = tmp_path / "venv"  # the image's /opt/venv: sys.prefix of its Python
    prefix.mkdir()
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(stamp, "installed_version", {"vllm": "0.34.0"}.get)
    assert stamp.main(argv) == 0
    data = stamp.read()
    assert data is not None and stamp.path() == prefix / "kvrig-vllm.json"
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert set(data) == set(stamp.content(Plan([]), None, "", now))  # the host's keys
    assert (data["asked"], data["release"], data["installed"]) == (
        "kvrig container cuda",
        "vllm 0.34.0",
        "0.34.0",
    )
    assert stamp.overrides_in_force(data) == ["flashinfer-python==0.7.4"]
