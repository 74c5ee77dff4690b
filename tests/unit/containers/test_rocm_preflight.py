"""The ROCm column's host checks: an AMD GPU the driver's tools list, its /dev/kfd and render
nodes, the user's access to them, and a gfx target kvrig keeps expectations for, each
missing piece one paragraph (fake hosts: no GPU is needed)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kvrig.containers import host_check as hc
from kvrig.containers import preflight as pf

# What the tools print on an MI300X host (abridged: the lines around those that are read).
ROCMINFO_MI300X = """\
ROCk module version 6.10.5 is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.15
Runtime Ext Version:     1.7
System Timestamp Freq.:  1000.000000MHz
Machine Model:           LARGE
System Endianness:       LITTLE

==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 9654 96-Core Processor
  Uuid:                    CPU-XX
  Marketing Name:          AMD EPYC 9654 96-Core Processor
  Vendor Name:             CPU
  Feature:                 None specified
  Profile:                 FULL_PROFILE
  Node:                    0
  Device Type:             CPU
  Cache Info:
    L1:                      32768(0x8000) KB
  Chip ID:                 0(0x0)
  Compute Unit:            192
  ISA Info:
*******
Agent 2
*******
  Name:                    gfx942
  Uuid:                    GPU-5e0ed2e1f7a1b2c3
  Marketing Name:          AMD Instinct MI300X
  Vendor Name:             AMD
  Feature:                 KERNEL_DISPATCH
  Profile:                 BASE_PROFILE
  Node:                    2
  Device Type:             GPU
  Chip ID:                 29857(0x74a1)
  Compute Unit:            304
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
      Machine Models:          HSA_MACHINE_MODEL_LARGE
*******
Agent 3
*******
  Name:                    gfx942
  Uuid:                    GPU-7a1b2c3d4e5f6071
  Marketing Name:          AMD Instinct MI300X
  Vendor Name:             AMD
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
*** Done ***
"""
# A host whose only agent is its CPU (the amdgpu driver is not bound to any GPU).
ROCMINFO_CPU_ONLY = ROCMINFO_MI300X.split("*******\nAgent 2")[0] + "*** Done ***\n"
# rocminfo run by a user outside the render group: HSA cannot open /dev/kfd.
ROCMINFO_NO_ACCESS = (
    "ROCk module version 6.10.5 is loaded\n"
    "Unable to open /dev/kfd read-write: Permission denied\n"
    'alice is not member of "render" group, the default DRM access group.\n'
)
AMD_SMI_LIST = """\
GPU: 0
    BDF: 0000:05:00.0
    UUID: 1fff74a1-0000-1000-80e1-d8e8c1d7b3a2
    KFD_ID: 45436
    NODE_ID: 2
    PARTITION_ID: 0

GPU: 1
    BDF: 0000:26:00.0
    UUID: 8aff74a1-0000-1000-8050-7c1a2b3d4e5f
    KFD_ID: 63712
    NODE_ID: 3
    PARTITION_ID: 0
"""
AMD_SMI_NO_DRIVER = (
    "ERROR:root:Unable to detect any GPU devices, check amdgpu version and module status"
    " (sudo modprobe amdgpu)\n"
)
AMD_SMI_ASIC_R9700 = """\
GPU: 0
    ASIC:
        MARKET_NAME: AMD Radeon AI PRO R9700
        VENDOR_ID: 0x1002
        VENDOR_NAME: Advanced Micro Devices Inc. [AMD/ATI]
        SUBVENDOR_ID: 0x1002
        DEVICE_ID: 0x7551
        SUBSYSTEM_ID: 0x0c06
        REV_ID: 0xc0
        ASIC_SERIAL: 0x1B2C3D4E5F607182
        OAM_ID: N/A
        NUM_COMPUTE_UNITS: 64
        TARGET_GRAPHICS_VERSION: gfx1201
"""

GPU_LISTED = {"amd-smi list": (0, AMD_SMI_LIST), "rocminfo": (0, ROCMINFO_MI300X)}


class AmdHost:
    """A host with these tools (command line -> its whole answer), /dev/kfd or not, and
    these render nodes; what was run, in order."""

    def __init__(
        self,
        tools: Mapping[str, tuple[int, str]] | None = None,
        kfd: bool = True,
        nodes: Sequence[str] = ("renderD128",),
    ) -> None:
        self.tools = dict(tools or {})
        self.kfd = kfd
        self.nodes = list(nodes)
        self.ran: list[str] = []

    def run_all(self, cmd: Sequence[str]) -> tuple[int, str]:
        line = " ".join(cmd)
        self.ran.append(line)
        return self.tools.get(line, (127, f"{cmd[0]}: command not found"))

    def run(self, cmd: Sequence[str]) -> tuple[int, str]:
        code, out = self.run_all(cmd)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        return code, lines[-1] if lines else ""

    def exists(self, path: Path) -> bool:
        return (path == Path("/dev/kfd") and self.kfd) or (
            path == Path("/dev/dri") and bool(self.nodes)
        )

    def glob(self, folder: Path, pattern: str) -> list[Path]:
        return [folder / n for n in self.nodes if folder == Path("/dev/dri")]

    @property
    def probe(self) -> pf.Probe:
        installed = {line.split()[0] for line in self.tools}
        return pf.Probe(
            which=lambda name: f"/opt/rocm/bin/{name}" if name in installed else None,
            exists=self.exists,
            glob=self.glob,
            run=self.run,
            run_all=self.run_all,
        )


def one_paragraph(exc: pytest.ExceptionInfo[pf.PreflightError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --- the probe's whole answer -----------------------------------------------------------------


def test_run_all_keeps_every_line_and_run_still_keeps_the_last() -> None:
    cmd = ["sh", "-c", "echo 'Name: gfx942'; echo '*** Done ***'; echo warn >&2"]
    assert pf.Probe().run_all(cmd) == (0, "Name: gfx942\n*** Done ***\nwarn\n")
    assert pf.Probe().run(cmd) == (0, "warn")
    assert pf.Probe().run_all(["kvrig-no-such-tool"])[0] == 127


# --- the device ---------------------------------------------------------------------------------


def test_a_host_without_rocm_tools_stops_at_the_first_check() -> None:
    host = AmdHost(kfd=False, nodes=())
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("rocm", host.probe)
    text = one_paragraph(exc)
    assert text.startswith("The ROCm column needs an AMD GPU, but neither `amd-smi` nor")
    assert "amdgpu" in text and "rocm packages" in text
    assert "`nox -s cpu`" in text and "`nox -s emulated`" in text
    assert text.endswith(pf.alternatives("rocm"))
    assert host.ran == []  # nothing was run: there was nothing to run


def test_tools_that_list_no_gpu_are_each_named() -> None:
    host = AmdHost(
        {"amd-smi list": (255, AMD_SMI_NO_DRIVER), "rocminfo": (0, ROCMINFO_CPU_ONLY)},
        kfd=False,
    )
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("rocm", host.probe)
    text = one_paragraph(exc)
    assert "`amd-smi list` lists none (ERROR:root:Unable to detect any GPU devices" in text
    assert "`rocminfo` shows no GPU agent (its agents are all CPUs)" in text
    assert "`lsmod | grep amdgpu`" in text and "`video` and `render` groups" in text
    assert text.endswith(pf.alternatives("rocm"))
    assert host.ran == ["amd-smi list", "rocminfo"]  # the device nodes were not looked for


def test_rocminfo_that_cannot_open_kfd_is_quoted() -> None:
    host = AmdHost({"rocminfo": (1, ROCMINFO_NO_ACCESS)})
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("rocm", host.probe)
    text = one_paragraph(exc)
    assert '`rocminfo` shows no GPU agent (alice is not member of "render" group' in text
    assert "amd-smi" not in text.split(".")[0]  # not installed, so not blamed


def test_a_gpu_amd_smi_lists_is_enough_and_rocminfo_is_not_asked() -> None:
    host = AmdHost(GPU_LISTED)
    assert pf.check_device("rocm", host.probe) is None
    assert host.ran == ["amd-smi list"]


def test_rocminfo_answers_where_amd_smi_does_not() -> None:
    host = AmdHost({"amd-smi list": (255, AMD_SMI_NO_DRIVER), "rocminfo": (0, ROCMINFO_MI300X)})
    assert pf.check_device("rocm", host.probe) is None
    assert host.ran == ["amd-smi list", "rocminfo"]
    assert pf.check_device("rocm", AmdHost({"rocminfo": (0, ROCMINFO_MI300X)}).probe) is None


@pytest.mark.parametrize(
    "kfd, nodes, named",
    [
        (False, ["renderD128"], "no /dev/kfd, although"),
        (True, [], "no a render node (renderD*) in /dev/dri, although"),
        (False, [], "no /dev/kfd and no a render node (renderD*) in /dev/dri"),
    ],
)
def test_a_listed_gpu_without_its_device_nodes(kfd: bool, nodes: list[str], named: str) -> None:
    host = AmdHost({"amd-smi list": (0, AMD_SMI_LIST)}, kfd=kfd, nodes=nodes)
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_device("rocm", host.probe)
    text = one_paragraph(exc)
    assert text.startswith("The ROCm column needs /dev/kfd and a render node in /dev/dri")
    assert named in text
    assert "`amd-smi` sees the GPU" in text
    assert "`--device /dev/kfd --device /dev/dri`" in text and "`sudo modprobe amdgpu`" in text
    assert text.endswith(pf.alternatives("rocm"))


# --- the gfx target ---------------------------------------------------------------------------


def test_the_gfx_target_is_rocminfos_first_gpu_agent() -> None:
    # The CPU agent (Agent 1) is named by its model, the ISA lines by the full triple.
    assert pf.rocm_arch(AmdHost({"rocminfo": (0, ROCMINFO_MI300X)}).probe) == "gfx942"


def test_a_target_named_with_its_features_is_keyed_without_them() -> None:
    out = ROCMINFO_MI300X.replace("  Name:                    gfx942", "  Name: gfx90a:sramecc+")
    assert pf.rocm_arch(AmdHost({"rocminfo": (0, out)}).probe) == "gfx90a"


def test_amd_smi_names_the_target_where_rocminfo_does_not() -> None:
    tools = {"rocminfo": (1, ROCMINFO_NO_ACCESS), "amd-smi static --asic": (0, AMD_SMI_ASIC_R9700)}
    host = AmdHost(tools)
    assert pf.rocm_arch(host.probe) == "gfx1201"
    assert host.ran == ["rocminfo", "amd-smi static --asic"]
    only_smi = AmdHost({"amd-smi static --asic": (0, AMD_SMI_ASIC_R9700)})
    assert pf.rocm_arch(only_smi.probe) == "gfx1201"


def test_no_tool_that_names_a_target_is_none() -> None:
    assert pf.rocm_arch(AmdHost().probe) is None
    host = AmdHost({"rocminfo": (0, ROCMINFO_CPU_ONLY), "amd-smi static --asic": (2, "")})
    assert pf.rocm_arch(host.probe) is None


def gfx(target: str) -> pf.Probe:
    out = ROCMINFO_MI300X.replace("gfx942", target)
    return AmdHost({**GPU_LISTED, "rocminfo": (0, out)}).probe


def test_a_kept_gfx_target_names_the_column() -> None:
    assert pf.check_architecture(gfx("gfx942"), platform="rocm") == "gfx942"
    assert pf.check_architecture(gfx("gfx1201"), "gfx1201", platform="rocm") == "gfx1201"


def test_a_gfx_target_kvrig_keeps_no_expectations_for() -> None:
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_architecture(gfx("gfx90a"), platform="rocm")
    text = one_paragraph(exc)
    assert text.startswith(
        "This host's GPU has gfx target gfx90a, an architecture kvrig keeps no ROCm"
    )
    for kept in ("gfx942 (gfx942: MI300X, MI325X)", "gfx950 (gfx950: MI355X", "gfx1201 (gfx1201:"):
        assert kept in text
    assert "`nox -s emulated` decides every ROCm cell" in text


def test_a_runner_labelled_for_another_amd_gpu() -> None:
    with pytest.raises(pf.PreflightError, match="gfx target gfx942, and the column was asked"):
        pf.check_architecture(gfx("gfx942"), "gfx950", platform="rocm")
    with pytest.raises(pf.PreflightError, match="'gfx90a' is not a rocm architecture"):
        pf.check_architecture(gfx("gfx942"), "gfx90a", platform="rocm")


def test_a_gpu_that_names_no_target() -> None:
    host = AmdHost({"amd-smi list": (0, AMD_SMI_LIST), "rocminfo": (1, ROCMINFO_NO_ACCESS)})
    with pytest.raises(pf.PreflightError, match="gfx target"):
        pf.check_architecture(host.probe, platform="rocm")


# --- the device in a container ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_the_amd_gpu_that_does_not_reach_a_container(engine: str) -> None:
    cmd = [engine, "run", "--device", "/dev/kfd", "--device", "/dev/dri", "base"]
    host = AmdHost({engine: (1, "no render node is readable and writable by uid 1000")})
    with pytest.raises(pf.PreflightError) as exc:
        pf.check_passthrough("rocm", engine, cmd, {}, host.probe)
    text = one_paragraph(exc)
    assert text.startswith("The host sees the AMD GPU (/dev/kfd and its render node), but a")
    assert "`--device /dev/kfd --device /dev/dri`" in text
    assert "`sudo usermod -aG video,render $USER`" in text
    assert ("keep-groups" in text) == (engine == "podman")
    assert "`kvrig check host rocm`" in text
    assert text.endswith(pf.alternatives("rocm"))


# --- the whole host check, in its order -------------------------------------------------------


def test_the_rocm_host_check_stops_at_the_device_first(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_access_check(*args: object) -> None:
        pytest.fail("the access check ran on a host without a GPU")

    monkeypatch.setattr(hc, "check_kfd_access", no_access_check)
    with pytest.raises(pf.PreflightError, match="neither `amd-smi` nor `rocminfo`"):
        hc.check("rocm", "vllm/vllm-openai-rocm:v0.34.0", AmdHost().probe)


def test_the_rocm_host_check_asks_access_before_the_architecture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []
    monkeypatch.setattr(hc, "check_kfd_access", lambda probe: steps.append("access"))
    hc.check("rocm", "vllm/vllm-openai-rocm:v0.34.0", gfx("gfx942"), "gfx942")
    assert steps == ["access"]
    with pytest.raises(pf.PreflightError, match="gfx target gfx90a, an architecture kvrig"):
        hc.check("rocm", "vllm/vllm-openai-rocm:v0.34.0", gfx("gfx90a"))
    assert steps == ["access", "access"]


@pytest.fixture
def amd_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, pf.Probe]:
    """/dev/kfd and one render node as files (owned by this user's group), a non-root user
    in no group, and a probe that lists the node."""
    kfd, node = tmp_path / "kfd", tmp_path / "renderD128"
    kfd.write_text("")
    node.write_text("")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    return kfd, node, pf.Probe(glob=lambda folder, pattern: [node])


def test_a_user_outside_kfds_group_is_told_to_join_it(
    amd_nodes: tuple[Path, Path, pf.Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    kfd, _node, probe = amd_nodes
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(pf.PreflightError) as exc:
        hc.check_kfd_access(probe, kfd, kfd.parent)
    text = one_paragraph(exc)
    assert text.startswith(f"The ROCm column opens {kfd}, and this user is not in its group")
    assert "`video` for /dev/kfd on older ROCm" in text
    assert f"`sudo usermod -aG $(stat -c %G {kfd}) $USER`" in text
    assert "`--group-add keep-groups`" in text


def test_a_user_outside_the_render_nodes_group_is_told_to_join_it(
    amd_nodes: tuple[Path, Path, pf.Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    kfd, node, probe = amd_nodes
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) == kfd)
    with pytest.raises(pf.PreflightError, match=f"opens {node}, and this user is not in"):
        hc.check_kfd_access(probe, kfd, kfd.parent)


def test_a_member_of_the_groups_or_root_may_open_the_gpu(
    amd_nodes: tuple[Path, Path, pf.Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    kfd, _node, probe = amd_nodes
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "getgroups", lambda: [kfd.stat().st_gid])
    assert hc.check_kfd_access(probe, kfd, kfd.parent) is None
    monkeypatch.setattr(os, "getgroups", lambda: [])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert hc.check_kfd_access(probe, kfd, kfd.parent) is None
