"""The options of a column run, declared once for the three command lines that take them.

`kvrig column` spells them `--isa`, kvrig's pytest plugin `--kvrig-isa` (pytest's options
share one namespace, so a plugin's carry its name), and `kvrig container` takes the ones
that mean something for a column in its container and hands them on to the `kvrig column`
inside. One table keeps the three from drifting apart: a new option, or a changed help
text, is written here and every command line has it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvrig.define.vllm_names import PLATFORMS
from kvrig.host import isa

CLI = "cli"  # kvrig column
PYTEST = "pytest"  # kvrig's pytest plugin
CONTAINER = "container"  # kvrig container (the host's side of a column in its container)
PYTEST_PREFIX = "--kvrig-"


@dataclass(frozen=True)
class ColumnOption:
    """One option: its name (`--NAME`, pytest's `--kvrig-NAME`), its help, its kind."""

    name: str
    help: str
    flag: bool = False
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    default: str | None = None
    where: frozenset[str] = frozenset({CLI, PYTEST, CONTAINER})

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def spelled(self, consumer: str) -> str:
        return f"{PYTEST_PREFIX}{self.name}" if consumer == PYTEST else f"--{self.name}"

    def keywords(self) -> dict[str, Any]:
        """What argparse's add_argument and pytest's addoption both take."""
        if self.flag:
            return {"action": "store_true", "help": self.help}
        out: dict[str, Any] = {"default": self.default, "help": self.help}
        if self.metavar:
            out["metavar"] = self.metavar
        if self.choices:
            out["choices"] = self.choices
        return out


_NOT_IN_A_CONTAINER = frozenset({CLI, PYTEST})
# vLLM's overlays are built before pytest starts (by kvrig column, or into the image).
_NOT_FOR_PYTEST = frozenset({CLI, CONTAINER})

OPTIONS: tuple[ColumnOption, ...] = (
    # kvrig container takes the platform as its first argument, and every container is one.
    ColumnOption("platform", "default: this host's", choices=PLATFORMS, where=_NOT_IN_A_CONTAINER),
    ColumnOption("isa", isa.ARG_HELP, default=isa.NATIVE),
    ColumnOption(
        "emulate",
        "decide the cuda, xpu or rocm cells with vLLM's own platform code for this GPU"
        " architecture, on this host (cuda: 8.0, 8.6, 8.9, 9.0, 10.0, 12.0; xpu: bmg; rocm:"
        " gfx942, gfx950, gfx1201):"
        " configuration only, into results/<platform>-<arch>-emulated (kvrig container:"
        " in the platform's image, no device passed in)",
        metavar="ARCH",
    ),
    ColumnOption(
        "gpu-arch",
        "the CUDA or ROCm GPU's architecture the column is for (9.0 or sm90, gfx942: a CI"
        " runner's label); refused unless the GPU is one, which names the column (cuda-sm90,"
        " rocm-gfx942). Default: the GPU's own",
        metavar="ARCH",
    ),
    ColumnOption(
        "vllm",
        "the vLLM release to run instead of the one matrix.yaml pins (a version such as"
        " 0.33.0, or a wheel file): its rules judge, its results go to"
        " results/<column>-vllm-<version>, and on a host it runs in an environment kvrig makes"
        " for it when this one holds another (kvrig container: that release's image)",
        metavar="RELEASE",
    ),
    ColumnOption("results", "default: results/<column>", metavar="DIR"),
    ColumnOption(
        "cold",
        "a fresh interpreter per cell instead of forking a warm vLLM parent (slower)",
        flag=True,
    ),
    ColumnOption(
        "rerun",
        "run every cell again even if the last run was cut short (default: resume it)",
        flag=True,
    ),
    ColumnOption(
        "keep-finished",
        "take a finished run of this same matrix, selection, column and software as it is:"
        " its cells are judged again from their records, none is run (default: a finished"
        " run starts over)",
        flag=True,
    ),
    ColumnOption("shard", "run shard I of N of the column (e.g. 2/3), for CI jobs", metavar="I/N"),
    ColumnOption(
        "vllm-source",
        "run the Python of this vLLM checkout over the platform's released kernels",
        metavar="PATH",
        where=_NOT_FOR_PYTEST,
    ),
    ColumnOption(
        "vllm-patch",
        "run the platform's vLLM with this diff applied to a copy of its Python",
        metavar="FILE",
        where=_NOT_FOR_PYTEST,
    ),
)


def options(consumer: str) -> list[ColumnOption]:
    return [o for o in OPTIONS if consumer in o.where]


def declare(add: Callable[..., object], consumer: str) -> None:
    """Declares the consumer's options with `add`: argparse's add_argument, or the
    addoption of pytest's option group."""
    for option in options(consumer):
        add(option.spelled(consumer), dest=_dest(option, consumer), **option.keywords())


def _dest(option: ColumnOption, consumer: str) -> str:
    # pytest reads its options back by their spelling (config.getoption("--kvrig-isa")).
    return f"kvrig_{option.dest}" if consumer == PYTEST else option.dest


def command_line(values: Mapping[str, Any], consumer: str) -> list[str]:
    """The given options as the consumer's command line (options at their default, unset
    or off are left out): how kvrig column hands its options to pytest, and kvrig
    container its options to the kvrig column in the container."""
    out: list[str] = []
    for option in options(consumer):
        value = values.get(option.dest)
        if value is None or value is False or (value == option.default and not option.flag):
            continue
        spelled = option.spelled(consumer)
        out += [spelled] if option.flag else [f"{spelled}={value}"]
    return out
