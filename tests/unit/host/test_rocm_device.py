"""The device check a ROCm column runs in its container before each cell (kvrig.host.device):
each way the AMD GPU goes missing is named with what went."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from kvrig.host import device

MI300X_LISTED = (0, "GPU: 0\n    BDF: 0000:05:00.0\n    UUID: 1fff74a1-0000-1000-80e1-d8e8c1d7b3a2")
NODES = ("/dev/kfd", "/dev/dri/card1", "/dev/dri/renderD128")


def looks(
    nodes: Sequence[str] = NODES,
    usable: Sequence[str] | None = None,
    smi: tuple[int, str] | None = MI300X_LISTED,
) -> tuple[device.Looks, list[str]]:
    """A container with these device nodes, of which `usable` (default: all) may be opened,
    and amd-smi answering `smi` (None: no amd-smi in the image); what was run."""
    ran: list[str] = []
    may_open = set(nodes if usable is None else usable)

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        ran.append(" ".join(cmd))
        return smi or (127, "")

    return (
        device.Looks(
            glob=lambda pattern: [n for n in nodes if fnmatch.fnmatch(n, pattern)],
            usable=lambda path: path in may_open,
            which=lambda tool: f"/opt/rocm/bin/{tool}" if smi and tool == "amd-smi" else None,
            run=run,
        ),
        ran,
    )


def test_an_amd_gpu_passed_in_and_listed_is_usable() -> None:
    seen, ran = looks()
    assert device.missing("rocm", seen) is None
    assert ran == ["amd-smi list"]


def test_without_amd_smi_the_usable_nodes_are_enough() -> None:
    seen, ran = looks(smi=None)
    assert device.missing("rocm", seen) is None
    assert ran == []


def test_a_container_without_kfd_was_started_without_the_gpu() -> None:
    reason = device.missing("rocm", looks(["/dev/dri/renderD128"])[0])
    assert reason is not None and reason.startswith("no /dev/kfd is here")
    assert "--device /dev/kfd --device /dev/dri" in reason and "the GPU has gone" in reason


def test_kfd_the_user_cannot_open_names_the_groups() -> None:
    reason = device.missing("rocm", looks(usable=["/dev/dri/renderD128"])[0])
    assert reason is not None and reason.startswith("/dev/kfd cannot be opened")
    assert "video and render groups" in reason and "keep-groups" in reason


def test_a_container_without_a_render_node_was_started_without_dri() -> None:
    reason = device.missing("rocm", looks(["/dev/kfd"])[0])
    assert reason is not None and reason.startswith("no /dev/dri/renderD* node is here")
    assert "--device /dev/dri" in reason


def test_render_nodes_the_user_cannot_open_name_the_render_group() -> None:
    reason = device.missing("rocm", looks(usable=["/dev/kfd"])[0])
    assert reason is not None and "/dev/dri/renderD128 cannot be opened" in reason
    assert "render group" in reason


def test_a_gpu_amd_smi_no_longer_lists_is_gone() -> None:
    gone = (255, "ERROR:root:Unable to detect any GPU devices, check amdgpu version")
    reason = device.missing("rocm", looks(smi=gone)[0])
    assert reason is not None and reason.startswith("`amd-smi list` lists no GPU (ERROR:root")
    assert "the driver has lost the device" in reason
    assert "lists no GPU (exit 0)" in (device.missing("rocm", looks(smi=(0, ""))[0]) or "")
