"""Images built once and shared through a registry, and the CUDA column's image source:
vLLM's release image by default, the release's wheels with --from-wheels.

No engine runs: the commands are compared as argv lists, and the engine's answers faked.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from kvrig import cli
from kvrig.containers import host_check, launch, preflight
from kvrig.containers import plan as c
from kvrig.containers.args import parse_args, registry_name
from kvrig.containers.assemble import make_plan
from kvrig.containers.facts import load_spec
from kvrig.define import releases
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.platform_spec import VllmSource
from kvrig.provision import install
from kvrig.run.emulation import wheel

from ..builders import ROOT
from ..container_builders import MATRIX, USER, flag_values

REG = "ghcr.io/my-org"
IMAGE_MATRIX = MATRIX.replace(
    'vllm: {kind: pypi, package: vllm, version: "0.33.0"}',
    'vllm: {kind: image, image: "vllm/vllm-openai:v0.33.0"}',
)


@pytest.fixture(autouse=True)
def _an_image_matrix(checkout: Path) -> None:
    """The minimal checkout (containers/conftest.py), its CUDA platform taking vLLM's image
    of 0.33.0."""
    (checkout / "matrix.yaml").write_text(IMAGE_MATRIX)


def plan_for(checkout: Path, argv: list[str], env: dict[str, str] | None = None) -> c.Plan:
    args = parse_args(argv, env or {})
    return make_plan(args, checkout, USER, "docker", {"HOME": str(checkout)}, "kvrig-cuda-1")


# --- the image's name in a registry ----------------------------------------------------------


def test_a_registry_prefixes_the_same_content_tag(checkout: Path) -> None:
    """The CPU runner that pushes and the GPU runner that pulls compute the same name."""
    here = plan_for(checkout, ["cuda"]).image
    shared = plan_for(checkout, ["cuda", "--registry", "GHCR.io/My-Org/"]).image
    assert re.fullmatch(r"kvrig-cuda:1\.2\.3-[0-9a-f]{12}", here)
    assert shared == f"{REG}/{here}"
    assert plan_for(checkout, ["cuda"], {"KVRIG_REGISTRY": REG}).image == shared
    # The GPU's architecture names the column, never the image.
    assert plan_for(checkout, ["cuda", "--registry", REG, "--gpu-arch", "9.0"]).image == shared


def test_a_registry_pulls_before_building_and_pushes_when_asked(checkout: Path) -> None:
    plan = plan_for(checkout, ["cuda", "--registry", REG, "--push"])
    assert plan.pull == ["docker", "pull", plan.image]
    assert plan.push == ["docker", "push", plan.image]
    assert flag_values(plan.build, "--tag")[0] == plan.image
    assert plan.run[plan.run.index(plan.image) + 1 :][:2] == ["kvrig", "column"]
    bare = plan_for(checkout, ["cuda"])
    assert bare.pull == [] and bare.push == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cuda", "--push"], "--push pushes the image to a registry, and none is named"),
        (["cuda", "--registry", "https://ghcr.io/x"], "is not a registry"),
        (["cuda", "--registry", "ghcr.io/x/kvrig-cuda:1"], "without a scheme or an image tag"),
    ],
)
def test_a_push_without_a_registry_or_a_bad_registry_is_one_paragraph(
    argv: list[str], message: str
) -> None:
    with pytest.raises(c.UsageError, match=re.escape(message)) as err:
        parse_args(argv, {})
    assert "\n" not in str(err.value)


def test_a_registry_with_a_port_is_a_registry() -> None:
    assert registry_name("registry.example.com:5000/ci") == "registry.example.com:5000/ci"
    assert registry_name("localhost:5000") == "localhost:5000"  # a local registry, no namespace
    with pytest.raises(c.UsageError, match="not a registry"):
        registry_name("ghcr.io/org/kvrig-cuda:1")  # an image's tag


def test_the_dry_run_shows_pull_build_push_and_for_build_only_no_column(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)
    argv = ["cuda", "--dry-run", "--registry", REG, "--push", "--build-only"]
    assert launch.main(argv, probe=_no_probe()) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    verbs = [shlex.split(ln)[1] for ln in lines if shlex.split(ln)[0] == "docker"]
    assert verbs == ["pull", "push"]
    order = [next(i for i, ln in enumerate(lines) if f" {v} " in ln) for v in ("pull", "build")]
    assert order[0] < order[1] < next(i for i, ln in enumerate(lines) if " push " in ln)
    assert not [ln for ln in lines if " run " in ln or "KVRIG_IMAGE_DIGEST" in ln]
    assert launch.main(["cuda", "--dry-run", "--registry", REG], probe=_no_probe()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(" pull " in ln for ln in lines) and any(" run " in ln for ln in lines)
    assert not any(" push " in ln for ln in lines)


def _no_probe() -> preflight.Probe:
    def no_engine(cmd: object) -> tuple[int, str]:
        raise AssertionError(f"dry run probed the host: {cmd}")

    return preflight.Probe(which=lambda name: None, run=no_engine)


# --- building on a CPU runner, pulling on a GPU runner ----------------------------------------


class Engine:
    """Docker on a host without a GPU: what it was asked, and its answers."""

    def __init__(self, pull: int = 0, push: int = 0, present: bool = False) -> None:
        self.codes = {"pull": pull, "push": push, "build": 0}
        self.present = present
        self.teed: list[list[str]] = []
        self.probed: list[list[str]] = []

    def probe(self) -> preflight.Probe:
        def run(cmd: list[str]) -> tuple[int, str]:
            self.probed.append(list(cmd))
            return (0, "") if cmd[0] == "docker" else (127, f"{cmd[0]}: not found")

        return preflight.Probe(
            which=lambda n: "/usr/bin/docker" if n == "docker" else None, run=run
        )

    def teed_run(self, cmd: list[str], env: dict[str, str], keep: int = 400) -> tuple[int, str]:
        self.teed.append(list(cmd))
        code = self.codes[cmd[1]]
        self.present = self.present or (code == 0 and cmd[1] in ("pull", "build"))
        return code, "" if code == 0 else "denied: requested access to the resource is denied"


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, checkout: Path) -> Engine:
    fake = Engine()
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)
    monkeypatch.delenv("KVRIG_REGISTRY", raising=False)
    monkeypatch.setattr(launch, "_image_present", lambda *a: fake.present)  # as inspect
    monkeypatch.setattr(launch, "_run_teed", fake.teed_run)
    return fake


def test_build_only_needs_no_gpu_and_builds_and_pushes_when_the_pull_fails(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.codes["pull"] = 1
    argv = ["cuda", "--build-only", "--push", "--registry", REG]
    assert launch.main(argv, probe=engine.probe()) == 0
    assert [cmd[1] for cmd in engine.teed] == ["pull", "build", "push"]
    assert not [cmd for cmd in engine.probed if cmd[0] == "nvidia-smi"]
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "could not be pulled" in ln]
    assert len(said) == 1 and "building it here" in said[0] and "docker login ghcr.io" in said[0]
    assert "runs no column" in out


def test_a_pulled_image_is_neither_built_nor_its_base_fetched(engine: Engine) -> None:
    assert launch.main(["cuda", "--build-only", "--registry", REG], probe=engine.probe()) == 0
    assert [cmd[1] for cmd in engine.teed] == ["pull"]
    assert not [cmd for cmd in engine.probed if "vllm/vllm-openai:v0.33.0" in cmd]


def test_an_image_found_here_is_pushed_with_push(engine: Engine) -> None:
    engine.present = True
    argv = ["cuda", "--build-only", "--push", "--registry", REG]
    assert launch.main(argv, probe=engine.probe()) == 0
    assert [cmd[1] for cmd in engine.teed] == ["push"]


def test_a_failed_push_is_one_paragraph_naming_the_login(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.codes["push"] = 1
    argv = ["cuda", "--build-only", "--push", "--registry", REG]
    assert launch.main(argv, probe=engine.probe()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    paragraph = [ln for ln in err if ln.startswith("kvrig.containers:")]
    assert len(paragraph) == 1
    assert "Pushing ghcr.io/my-org/kvrig-cuda:" in paragraph[0]
    assert "`docker login ghcr.io`" in paragraph[0] and "packages: write" in paragraph[0]


def test_a_column_still_needs_its_gpu(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main(["cuda", "--registry", REG], probe=engine.probe()) == 2
    assert "nvidia-smi" in capsys.readouterr().err
    assert engine.teed == []


def test_the_host_check_lets_a_build_only_run_pass_without_a_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nox -s cuda -- --build-only --push` runs `kvrig check host cuda` first, on a CPU
    runner; without --build-only the same host is checked (and here refused)."""
    checked: list[str] = []

    def no_gpu(platform: str, **kw: object) -> None:
        checked.append(platform)
        raise preflight.PreflightError("The CUDA column needs an NVIDIA GPU")

    monkeypatch.setattr(host_check, "check_host", no_gpu)
    assert cli.main(["check", "host", "cuda", "--build-only", "--push", "--registry", REG]) == 0
    assert "no device is needed" in capsys.readouterr().out
    assert checked == []
    assert cli.main(["check", "host", "cuda", "--gpu-arch", "9.0"]) == 2
    assert checked == ["cuda"]


# --- the CUDA column's image: vLLM's own, or the release's wheels ------------------------------


def test_the_cuda_image_is_vllms_release_image_with_the_rig_layered_on(checkout: Path) -> None:
    args = c.build_args("cuda", load_spec(parse_args(["cuda"], {}), checkout))
    assert args["VLLM_SOURCE"] == "image"
    assert args["BASE_IMAGE"] == "vllm/vllm-openai:v0.33.0"
    assert args["VLLM_VERSION"] == "0.33.0"  # the Dockerfile checks the image's vLLM is it
    assert "EXTRA_PACKAGES" not in args  # the image's own CUDA stack is kept as it is
    assert args["TORCH_INDEX"] == ""  # nor its torch: the index is not the image's input


def test_from_wheels_builds_the_same_release_from_the_index_on_the_base_image(
    checkout: Path,
) -> None:
    args = c.build_args("cuda", load_spec(parse_args(["cuda", "--from-wheels"], {}), checkout))
    assert args["VLLM_SOURCE"] == "pypi"
    assert (args["VLLM_PACKAGE"], args["VLLM_VERSION"]) == ("vllm", "0.33.0")
    assert args["BASE_IMAGE"] == "nvidia/cuda:13.0.2-runtime-ubuntu24.04"
    assert set(install.CUDA_PINS) <= set(args["EXTRA_PACKAGES"].split())
    assert plan_for(checkout, ["cuda", "--from-wheels"]).image != plan_for(checkout, ["cuda"]).image
    assert plan_for(checkout, ["cuda", "--from-wheels"]).vllm_image is None


def test_from_wheels_refuses_an_image_that_names_no_release(checkout: Path) -> None:
    (checkout / "matrix.yaml").write_text(
        IMAGE_MATRIX.replace("vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:nightly")
    )
    with pytest.raises(c.UsageError, match=r"names none in its tag.*platforms\.cuda\.vllm"):
        load_spec(parse_args(["cuda", "--from-wheels"], {}), checkout)


def test_an_unpullable_vllm_image_says_how_to_build_from_wheels() -> None:
    def run(cmd: list[str]) -> tuple[int, str]:
        return 1, "no such host"

    with pytest.raises(preflight.PreflightError, match="add --from-wheels"):
        launch.resolve_base(
            "docker",
            "vllm/vllm-openai:v0.33.0",
            c.es.NO_SETTINGS,
            preflight.Probe(run=run),
            "vllm/vllm-openai:v0.33.0",
        )


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("vllm/vllm-openai:v0.33.0", "0.33.0"),
        ("docker.io/vllm/vllm-openai:0.34.0rc1", "0.34.0rc1"),
        ("localhost:5000/vllm-openai", None),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None),
    ],
)
def test_an_images_tag_names_its_release(image: str, release: str | None) -> None:
    assert releases.image_version(image) == release
    assert releases.source_version(VllmSource(kind="image", image=image)) == release


def test_an_image_tagged_with_one_release_and_given_another_is_refused() -> None:
    with pytest.raises(ValueError, match=r"is tagged 0\.33\.0 and 'version' says 0\.32\.0"):
        VllmSource(kind="image", image="vllm/vllm-openai:v0.33.0", version="0.32.0")
    digest = "vllm/vllm-openai@sha256:" + "b" * 64
    assert releases.source_version(VllmSource(kind="image", image=digest, version="0.33.0"))


def test_the_shipped_cuda_platform_is_vllms_image_and_its_wheel_is_the_same_release() -> None:
    """The emulated GPU columns (PyPI's vllm on the host) and the release's rules must know
    the release from the matrix, though the CUDA column's vLLM is an image."""
    matrix = load(ROOT / "matrix.yaml")
    cuda = matrix.platforms["cuda"]
    release = releases.shown(releases.newest_read("cuda"))  # the matrix pins the newest read
    assert cuda.vllm.kind == "image" and cuda.vllm.image == f"vllm/vllm-openai:v{release}"
    assert releases.source_version(cuda.vllm) == release
    assert cuda.vllm.wheels == VllmSource(kind="pypi", package="vllm", version=release)
    assert wheel.wanted_release(matrix, "cuda") == release
    assert wheel.wanted_release(matrix, "xpu") == release
    assert install.emulated_plan(cuda) == [f"vllm=={release}", *install.CUDA_PINS]


def test_the_emulated_columns_refuse_an_image_that_names_no_release() -> None:
    data = load(ROOT / "matrix.yaml").model_dump(mode="json", exclude={"path"})
    data["platforms"]["cuda"]["vllm"] = {"kind": "image", "image": "vllm/vllm-openai:nightly"}
    try:
        matrix = Matrix.model_validate(data)
    except (MatrixError, ValueError) as exc:  # pragma: no cover - the dump must reload
        pytest.fail(f"the shipped matrix does not reload: {exc}")
    with pytest.raises(wheel.EmulationError, match="pins no PyPI release"):
        wheel.wanted_release(matrix, "cuda")


def test_the_dockerfile_keeps_the_images_packages_and_checks_its_release() -> None:
    text = textwrap.dedent((ROOT / "docker" / "Dockerfile.cuda").read_text())
    assert '"${have%%+*}" != "${VLLM_VERSION}"' in text
    assert "--format freeze" in text and '--constraint "${pins}"' in text


def test_a_dry_run_pulls_then_checks_the_device_in_the_pulled_image_then_builds(
    checkout: Path,
) -> None:
    plan = plan_for(checkout, ["cuda", "--registry", "ghcr.io/org"])
    lines = c.dry_run_lines(plan)
    pull = next(i for i, ln in enumerate(lines) if ln.startswith("docker pull"))
    smoke = next(i for i, ln in enumerate(lines) if "--entrypoint nvidia-smi" in ln)
    build = next(i for i, ln in enumerate(lines) if " build " in ln)
    assert pull < smoke < build  # the order a real run takes
    assert plan.image in lines[smoke] and plan.base_image not in lines[smoke]
