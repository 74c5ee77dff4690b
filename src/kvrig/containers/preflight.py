"""Checks that a containerised column can start here, each failing with one paragraph.

A column that dies ten minutes into a build or with a CUDA stack trace wastes a CI slot
and says nothing useful; these checks run first and name the missing piece and the fix.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvrig.define import column_choice, gpus
from kvrig.host import hardware


def alternatives(platform: str | None = None) -> str:
    """The ways out every refusal ends with, each a command line that runs as written
    (tests/unit/containers/test_advice.py parses them): this host's own column without a
    container, and the dry run, which prints the plan on any host."""
    dry = (
        f"`nox -s {platform} -- --dry-run` (or `kvrig container {platform} --dry-run`)"
        if platform
        else "the same command with `--dry-run` (after nox's `--`: `nox -s cpu -- --dry-run`)"
    )
    return (
        "`nox -s local` runs this host's own column without a container; to see the"
        f" commands without running anything, run {dry}."
    )


class PreflightError(Exception):
    """A missing engine, device or image; the message is the one paragraph users see."""


@dataclass(frozen=True)
class Probe:
    """How preflight looks at the host: swapped for fakes in tests."""

    which: Callable[[str], str | None] = shutil.which
    exists: Callable[[Path], bool] = Path.exists
    glob: Callable[[Path, str], list[Path]] = lambda p, pat: sorted(p.glob(pat))
    read: Callable[[Path], str | None] = lambda p: _read(p)
    run: Callable[[Sequence[str]], tuple[int, str]] = lambda cmd: _run(cmd)
    # The whole answer, for tools whose facts span lines (rocminfo's agents, amd-smi's GPUs).
    run_all: Callable[[Sequence[str]], tuple[int, str]] = lambda cmd: _run_all(cmd)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _run(cmd: Sequence[str], timeout: float = 60) -> tuple[int, str]:
    """Return code and the last non-empty line of stderr, else of stdout (the useful one)."""
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        return 127, f"{cmd[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s"
    for text in (done.stderr, done.stdout):
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if lines:
            return done.returncode, lines[-1]
    return done.returncode, ""


def _run_all(cmd: Sequence[str], timeout: float = 60) -> tuple[int, str]:
    """Return code and the whole of stdout, then stderr: rocminfo and amd-smi spread the
    facts a check reads over many lines, where `_run`'s last line would lose them."""
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, check=False
        )
    except OSError as exc:
        return 127, f"{cmd[0]}: {exc.strerror or exc}"
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s"
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def choose_engine(requested: str, probe: Probe, platform: str | None = None) -> str:
    """docker or podman: the requested one if it answers, for auto the first that answers.

    `docker info` (not just the binary) is the test, because a client without a reachable
    daemon is the common failure: the build would otherwise fail after a long context upload.
    """
    reasons: list[str] = []
    fixes: list[str] = []
    candidates = ("docker", "podman") if requested == "auto" else (requested,)
    for engine in candidates:
        if probe.which(engine) is None:
            reasons.append(f"{engine} is not installed")
            fixes.append(_ENGINE_FIX[(engine, False)])
            continue
        code, last = probe.run([engine, "info"])
        if code == 0:
            return engine
        reasons.append(f"`{engine} info` failed ({last or f'exit {code}'})")
        fixes.append(_ENGINE_FIX[(engine, True)])
    if requested != "auto":
        other = "podman" if requested == "docker" else "docker"
        fixes.append(f"take {other} instead with `--engine {other}` (or `--engine auto`)")
    fix = "; or ".join(fixes)
    raise PreflightError(
        f"No container engine is reachable: {'; '.join(reasons)}. {fix[:1].upper()}{fix[1:]}."
        f" {alternatives(platform)}"
    )


# What makes each engine answer: (engine, installed) -> the fix, run as written.
_ENGINE_FIX = {
    ("docker", True): "start the Docker daemon (`sudo systemctl start docker`)",
    ("docker", False): "install Docker",
    ("podman", True): "make Podman answer: `podman info` prints why it does not",
    ("podman", False): (
        "install Podman (as root, `kvrig setup container-engine` installs it from Debian's"
        " packages; otherwise `sudo apt-get install podman runc`)"
    ),
}


def check_nvidia_gpu(probe: Probe) -> None:
    """The CUDA column needs a GPU the host's driver sees."""
    if probe.which("nvidia-smi") is None:
        raise PreflightError(
            "The CUDA column needs an NVIDIA GPU, but `nvidia-smi` is not installed here, so"
            " no NVIDIA driver is present. Run it on a GPU host with the NVIDIA driver and the"
            " NVIDIA Container Toolkit (which provides `--gpus all`), or run the CPU column"
            f" with `nox -s cpu`. {alternatives('cuda')}"
        )
    code, last = probe.run(["nvidia-smi", "-L"])
    if code != 0 or "GPU" not in last:
        raise PreflightError(
            "The CUDA column needs an NVIDIA GPU, but `nvidia-smi -L` lists none"
            f" ({last or f'exit {code}'}). Check the driver with `nvidia-smi`, run on a GPU"
            f" host, or run the CPU column with `nox -s cpu`. {alternatives('cuda')}"
        )


def cuda_arch(probe: Probe) -> str | None:
    """The GPU's compute capability as nvidia-smi says it (9.0), or None if it says none."""
    code, last = probe.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
    text = last.strip()
    return text if code == 0 and re.fullmatch(r"\d+\.\d+", text) else None


@dataclass(frozen=True)
class _Device:
    """The host as a column's choice reads it, its GPU asked through the probe."""

    gpu_arch: str | None
    platform: str = "cuda"
    flags: frozenset[str] = frozenset()
    arch: str = ""


def check_architecture(probe: Probe, label: str | None = None, platform: str = "cuda") -> str:
    """The GPU's architecture, which names its column (cuda-sm90, rocm-gfx942): one kvrig
    keeps expectations for, and the one `label` (--gpu-arch, a runner's label) names if given."""
    seen = rocm_arch(probe) if platform == "rocm" else cuda_arch(probe)
    try:
        if label is not None:  # a label no GPU could match is the label's fault
            column_choice.requested(platform, gpu_arch=label)
        if seen is not None and gpus.normalize(platform, seen) not in gpus.GPUS[platform]:
            raise PreflightError(_unknown_gpu(seen, platform))
        choice = column_choice.choose(
            platform, gpu_arch=label, host=_Device(seen, platform=platform)
        )
    except column_choice.ChoiceError as exc:
        raise PreflightError(str(exc)) from None
    assert choice.arch is not None  # a real device's choice always names it
    return choice.arch


def _unknown_gpu(seen: str, platform: str = "cuda") -> str:
    """The host's own GPU is of an architecture kvrig keeps no expectations for: no
    --gpu-arch helps (it must name the GPU's own), so say what does."""
    title, word = gpus.TITLES[platform], gpus.ARCH_WORD[platform]
    listed = ", ".join(f"{g.arch} ({g.label}: {g.examples})" for g in gpus.GPUS[platform].values())
    return (
        f"This host's GPU has {word} {seen}, an architecture kvrig keeps no {title}"
        f" expectations for (it keeps them for {listed}), so its column would have nothing"
        f" to be judged by. Run the {title} column on a GPU of one of those; `nox -s emulated`"
        f" decides every {title} cell of each of them on any host. An architecture of its own"
        " needs an entry in kvrig.define.gpus and its emulated column green first."
    )


def check_amd_gpu(probe: Probe, kfd: Path = Path("/dev/kfd"), dri: Path = Path("/dev/dri")) -> None:
    """The ROCm column needs an AMD GPU that the driver's tools list and whose compute
    (/dev/kfd) and render nodes exist: vLLM's ROCm build opens both."""
    tools = [t for t in ("amd-smi", "rocminfo") if probe.which(t) is not None]
    if not tools:
        raise PreflightError(
            "The ROCm column needs an AMD GPU, but neither `amd-smi` nor `rocminfo` is"
            " installed here, so no ROCm driver or tools are present. Run it on a GPU host"
            " with ROCm installed (the amdgpu kernel driver, amdgpu-dkms, and the rocm"
            " packages from AMD's repository), or run the CPU column with `nox -s cpu`;"
            " `nox -s emulated` decides every ROCm cell on each gfx target kvrig keeps,"
            f" emulated, on any host. {alternatives('rocm')}"
        )
    reasons: list[str] = []
    for tool in tools:
        reason = _amd_gpu_unlisted(tool, probe)
        if reason is None:
            _check_amd_nodes(tool, probe, kfd, dri)
            return
        reasons.append(reason)
    raise PreflightError(
        f"The ROCm column needs an AMD GPU, but {' and '.join(reasons)}."
        " Check that the amdgpu driver is loaded (`lsmod | grep amdgpu`; the kernel log,"
        " `sudo dmesg | grep -i amdgpu`, says why it is not) and that this user is in the"
        " `video` and `render` groups, run on a GPU host, or run the CPU column with"
        f" `nox -s cpu`. {alternatives('rocm')}"
    )


def _check_amd_nodes(tool: str, probe: Probe, kfd: Path, dri: Path) -> None:
    """A GPU the tools see (through sysfs) can still lack the device nodes vLLM opens."""
    absent = [str(kfd)] if not probe.exists(kfd) else []
    if not probe.exists(dri) or not probe.glob(dri, "renderD*"):
        absent.append(f"a render node (renderD*) in {dri}")
    if absent:
        raise PreflightError(
            f"The ROCm column needs {kfd} and a render node in {dri}, and this host has no"
            f" {' and no '.join(absent)}, although `{tool}` sees the GPU. The amdgpu"
            " kernel driver creates them: load it with its compute support (`sudo modprobe"
            " amdgpu`; `sudo dmesg | grep -i kfd` says why it is missing), or, inside a"
            " container, start it with `--device /dev/kfd --device /dev/dri`; or run the CPU"
            f" column with `nox -s cpu`. {alternatives('rocm')}"
        )


def _amd_gpu_unlisted(tool: str, probe: Probe) -> str | None:
    """Why `tool` shows no AMD GPU, or None when it lists one."""
    if tool == "amd-smi":
        code, out = probe.run_all(["amd-smi", "list"])
        if code == 0 and "GPU" in out:
            return None
        detail = _last_line(out) or f"exit {code}"
        return f"`amd-smi list` lists none ({detail})"
    code, out = probe.run_all(["rocminfo"])
    if code == 0 and hardware.parse_rocminfo(out):
        return None
    detail = (_last_line(out) or f"exit {code}") if code != 0 else "its agents are all CPUs"
    return f"`rocminfo` shows no GPU agent ({detail})"


def rocm_arch(probe: Probe) -> str | None:
    """The AMD GPU's gfx target as the matrix keys it (gfx942), read through the probe as
    kvrig.host.hardware.gfx_target reads it; None if no tool answers one."""

    def read(cmd: list[str]) -> str | None:
        if probe.which(cmd[0]) is None:
            return None
        code, out = probe.run_all(cmd)
        return out if code == 0 else None

    target = hardware.gfx_target(read)
    return gpus.normalize("rocm", target) if target else None


INTEL_PCI_VENDOR = "0x8086"


def intel_render_nodes(probe: Probe, dri: Path = Path("/dev/dri")) -> list[Path]:
    """Render nodes whose PCI vendor is Intel, read from sysfs so no host tool is needed."""
    nodes = probe.glob(dri, "renderD*")
    intel = []
    for node in nodes:
        vendor = probe.read(Path("/sys/class/drm") / node.name / "device" / "vendor")
        if vendor is None or vendor.strip() == INTEL_PCI_VENDOR:
            intel.append(node)
    return intel


def check_intel_xpu(probe: Probe, dri: Path = Path("/dev/dri")) -> None:
    """The XPU column needs an Intel GPU render node; host tools, when present, must agree."""
    if not probe.exists(dri) or not probe.glob(dri, "renderD*"):
        raise PreflightError(
            f"The XPU column needs an Intel GPU, but {dri} has no render node (renderD*), so"
            " no GPU driver is loaded here. Run it on an XPU host with the Intel GPU driver"
            " (i915 or xe), or run the CPU column with `nox -s cpu`."
            f" {alternatives('xpu')}"
        )
    if not intel_render_nodes(probe, dri):
        raise PreflightError(
            f"The XPU column needs an Intel GPU, but the render nodes in {dri} belong to"
            " another vendor's GPU. Run it on an XPU host, or run the column that matches"
            f" this GPU (`nox -s cuda` for NVIDIA). {alternatives('xpu')}"
        )
    for tool, args in (("xpu-smi", ["discovery"]), ("sycl-ls", [])):
        if probe.which(tool) is None:
            continue
        code, last = probe.run([tool, *args])
        if code != 0:
            raise PreflightError(
                f"The XPU column needs an Intel GPU that answers, but `{tool}` failed"
                f" ({last or f'exit {code}'}). Check the driver and the level-zero loader"
                f" with `{tool}` on the host, or run the CPU column with `nox -s cpu`."
                f" {alternatives('xpu')}"
            )


def check_device(platform: str, probe: Probe) -> None:
    if platform == "cuda":
        check_nvidia_gpu(probe)
    elif platform == "xpu":
        check_intel_xpu(probe)
    elif platform == "rocm":
        check_amd_gpu(probe)


def check_base_image(
    engine: str,
    image: str,
    probe: Probe,
    global_flags: Sequence[str] = (),
    platform: str | None = None,
) -> None:
    """The image the build starts from is local or can be pulled, before any build starts.
    Only an image no local Debian base stands in for gets here (kvrig.containers.launch
    builds on the stand-in otherwise), so the way out is a copy of that very image."""
    code, _ = probe.run([engine, *global_flags, "image", "inspect", image])
    if code == 0:
        return
    code, last = probe.run([engine, *global_flags, "pull", image])
    if code != 0:
        registry = image.split("/")[0] if "." in image.split("/")[0] else "docker.io"
        raise PreflightError(
            f"The base image {image} is not on this host and cannot be pulled with `{engine}"
            f" pull` ({last or f'exit {code}'}). Log in to its registry (`{engine} login"
            f" {registry}`) or check the host's network; or copy it from a host that can"
            f" pull it (`{engine} save {image}` there, `{engine} load` here), or name a copy"
            f" you have under another name with KVRIG_BASE_IMAGE. {alternatives(platform)}"
        )


def check_wheel(root: Path, wheel: str | None, probe: Probe) -> None:
    """A wheel-sourced vLLM must lie inside the checkout, the image's build context."""
    if wheel is None:
        return
    path = (root / wheel).resolve()
    try:
        path.relative_to(root.resolve())
    except ValueError:
        raise PreflightError(
            f"The vLLM wheel {wheel} named in matrix.yaml lies outside the checkout {root},"
            " which is the image's build context. Copy it into docker/wheels/ and name it"
            " there (wheel: docker/wheels/<file>.whl)."
        ) from None
    if not probe.exists(path):
        raise PreflightError(
            f"The vLLM wheel {wheel} named in matrix.yaml does not exist under {root}. Build"
            " or download it into docker/wheels/, or switch the platform's vLLM source back"
            " to a PyPI version."
        )


# Raw errors of restricted hosts, each with the setting that fixes it (kvrig.containers.settings).
RESTRICTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"setrlimit|setting rlimit", re.IGNORECASE),
        "the runtime may not raise the container's ulimits (root lacks CAP_SYS_RESOURCE):"
        " set KVRIG_ULIMITS=none (a containers.conf with default_ulimits = [])",
    ),
    (
        re.compile(r"cgroups in hybrid mode not supported", re.IGNORECASE),
        "crun refuses this host's hybrid cgroup v1/v2 layout: set KVRIG_RUNTIME=runc and"
        " KVRIG_CGROUP_MANAGER=cgroupfs",
    ),
    (
        re.compile(
            r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|invalid peer certificate"
            r"|UnknownIssuer|self[- ]signed certificate",
            re.IGNORECASE,
        ),
        "TLS to the package index is intercepted by a proxy whose CA the image lacks: set"
        " KVRIG_CA_BUNDLE to the host's CA bundle (or export PIP_CERT, SSL_CERT_FILE or"
        " REQUESTS_CA_BUNDLE naming it)",
    ),
    (
        re.compile(
            r"(no version of|No matching distribution found for|Could not find a version that"
            r" satisfies the requirement) torch==[^\s,]*\+cpu",
            re.IGNORECASE,
        ),
        "the pinned torch build is not on any index the build reaches: set KVRIG_FIND_LINKS"
        " to a folder holding its wheel, or KVRIG_EXTRA_INDEX_URL to an index serving it",
    ),
    (
        re.compile(r"illegal instruction|SIGILL", re.IGNORECASE),
        "a step ran code this host's CPU cannot execute (an instruction set it lacks; see"
        " `kvrig isa`): the image must load only what the host's class gets",
    ),
    (
        re.compile(
            r"Temporary failure in name resolution|Could not resolve host|no such host"
            r"|Network is unreachable",
            re.IGNORECASE,
        ),
        "the container cannot reach the network the host reaches: set KVRIG_NETWORK=host",
    ),
)


def diagnose(output: str) -> list[str]:
    """The known restrictions behind an engine's output, each with its fix (pure)."""
    return [fix for pattern, fix in RESTRICTIONS if pattern.search(output)]


def build_failure(image: str, code: int, output: str) -> str:
    found = diagnose(output)
    cause = (
        " The output shows that " + "; and ".join(found) + "."
        if found
        else " The engine's output above names the failing step."
    )
    return (
        f"Building {image} failed (exit {code}) and no cell was run.{cause} Fix it and run"
        " again (docs/containers.md, Hosts that need special engine settings); `nox -s local`"
        " runs this host's own column without a container."
    )


def _env_prefix(engine_env: Mapping[str, str]) -> list[str]:
    """The engine's environment for a probe, which runs commands without one of its own."""
    return ["env", *(f"{k}={v}" for k, v in engine_env.items())] if engine_env else []


def check_engine_runs(
    engine: str,
    image: str,
    global_flags: Sequence[str],
    engine_env: Mapping[str, str],
    probe: Probe,
    host_network: bool = False,
    may_use_host_network: bool = False,
    platform: str | None = None,
) -> bool:
    """A trivial container starts, so a restricted host fails here with its fix named, not
    minutes into a build. Podman only: Docker's daemon owns these settings. True when only
    the host's network works, so the build needs it too."""
    if engine != "podman":
        return False
    base = [*_env_prefix(engine_env), engine, *global_flags, "run", "--rm"]
    net = ["--network=host"] if host_network else []
    # `true` as the entrypoint: vLLM's own image would run `vllm serve true`.
    cmd = [*base, *net, "--entrypoint", "true", image]
    code, last = probe.run(cmd)
    if code == 0:
        return False
    retry = [*base, "--network=host", "--entrypoint", "true", image]
    if not host_network and may_use_host_network and probe.run(retry)[0] == 0:
        return True
    found = diagnose(last)
    fix = (
        "; and ".join(found) + ", and run again"
        if found
        else f"it said: {last or f'exit {code}'}, which is none of the restrictions kvrig"
        " knows a setting for (docs/containers.md, Hosts that need special engine"
        " settings): run the command above to see the runtime's whole error, and fix that"
    )
    raise PreflightError(
        f"Podman cannot start a trivial container here (`{' '.join(cmd)}` failed): {fix}."
        " With --host-settings off (or KVRIG_HOST_SETTINGS=off) kvrig applies none of its"
        f" settings: leave it at auto. {alternatives(platform)}"
    )


_PASSTHROUGH_FIX = {
    ("cuda", "docker"): (
        "Docker reaches the GPU through the NVIDIA Container Toolkit: install"
        " nvidia-container-toolkit, run `sudo nvidia-ctk runtime configure --runtime=docker`"
        " and restart the daemon (`sudo systemctl restart docker`)"
    ),
    ("cuda", "podman"): (
        "Podman reaches the GPU through a CDI spec: install nvidia-container-toolkit and"
        " generate it with `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
        " (again after every driver update); `nvidia-ctk cdi list` must name nvidia.com/gpu=all"
    ),
    ("xpu", "docker"): (
        "the container's user must be in the group owning /dev/dri/renderD* (usually"
        " `render`): add the runner's user to it (`sudo usermod -aG render $USER`, then log in"
        " again) and check the node with `ls -ln /dev/dri`"
    ),
    ("xpu", "podman"): (
        "the container's user must be in the group owning /dev/dri/renderD* (usually"
        " `render`): add the runner's user to it (`sudo usermod -aG render $USER`, then log in"
        " again); rootless Podman keeps it only with a runtime that supports keep-groups"
        " (crun, or runc 1.1 and newer)"
    ),
    ("rocm", "docker"): (
        "the container gets the AMD GPU with `--device /dev/kfd --device /dev/dri`, and its"
        " user must be in the host's groups owning them (`video` and `render`): add the"
        " runner's user to both (`sudo usermod -aG video,render $USER`, then log in again)"
        " and check the nodes with `ls -ln /dev/kfd /dev/dri`"
    ),
    ("rocm", "podman"): (
        "the container gets the AMD GPU with `--device /dev/kfd --device /dev/dri`, and its"
        " user must be in the host's groups owning them (`video` and `render`): add the"
        " runner's user to both (`sudo usermod -aG video,render $USER`, then log in again);"
        " rootless Podman keeps them only with `--group-add keep-groups` and a runtime that"
        " supports it (crun, or runc 1.1 and newer)"
    ),
}

# How a refusal names each platform's device.
_PASSTHROUGH_DEVICE = {
    "cuda": "the NVIDIA GPU",
    "xpu": "the Intel GPU's render node",
    "rocm": "the AMD GPU (/dev/kfd and its render node)",
}


def check_passthrough(
    platform: str,
    engine: str,
    cmd: Sequence[str],
    engine_env: Mapping[str, str],
    probe: Probe,
) -> None:
    """The device reaches a container of the base image as the column's will get it, so
    a missing toolkit, CDI spec or device group costs seconds, not an image build."""
    code, last = probe.run([*_env_prefix(engine_env), *cmd])
    if code == 0:
        return
    device = _PASSTHROUGH_DEVICE[platform]
    fix = _PASSTHROUGH_FIX[(platform, engine)]
    raise PreflightError(
        f"The host sees {device}, but a container does not: `{' '.join(cmd)}` failed"
        f" ({last or f'exit {code}'}). {fix[:1].upper()}{fix[1:]}. Then run"
        f" `kvrig check host {platform}` and this command again; nothing was built."
        f" {alternatives(platform)}"
    )
