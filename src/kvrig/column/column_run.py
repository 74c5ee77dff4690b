"""A column run's state in one pytest process: which column, its cells, where results go,
and the warm vLLM parents its items fork from.

Kept apart from the hooks (kvrig.column.plugin) so that the items (kvrig.column.items)
and the hooks both read the run from here, and neither imports the other back.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvrig.column import run_order
from kvrig.define import column_choice, named_release
from kvrig.define.cells import Cell, expand, skipped_for_needs, with_needs_met
from kvrig.define.matrix import Matrix, MatrixError, load
from kvrig.define.paths import results_folder
from kvrig.provision import install, libcuda_stub
from kvrig.publish import results as results_mod
from kvrig.run.cell import STUB_ENV, STUB_SYMBOLS_ENV, cell_env
from kvrig.run.emulation import wheel
from kvrig.run.forkserver import MAX_SERVERS, Pool, env_key, preload_for
from kvrig.run.platform_parent import Shared


@dataclass
class ColumnRun:
    """This pytest process's view of the run: the matrix (parsed once), the column's
    cells, where results go, and (lazily) the warm parents its items fork from."""

    matrix: Matrix
    choice: column_choice.Choice
    cells: list[Cell]
    results: Path
    cold: bool
    # The release named on the command line in place of the pin (None: the pin, named or not).
    named: named_release.NamedRelease | None = None
    resumed: bool = False
    state: dict[str, Any] = field(default_factory=dict)
    # This process runs every cell in turn (no xdist workers): they run a parent at a time
    # (kvrig.column.run_order), and the pool keeps one parent.
    one_process: bool = False
    _pool: Pool | None = None

    @property
    def column(self) -> str:
        return self.choice.column

    @property
    def platform(self) -> str:
        return self.choice.platform

    @property
    def isa(self) -> str | None:
        return self.choice.isa

    @property
    def emulated(self) -> bool:
        return self.choice.emulated

    @property
    def device(self) -> str | None:
        """The GPU architecture an emulated device's column fakes (None: real hardware)."""
        return self.choice.device

    def pool(self) -> Pool:
        if self._pool is None:
            logs = self.results / "logs"
            self._pool = Pool(
                warm=not self.cold,
                log_dir=logs,
                preload=preload_for(self.platform, emulated=self.device is not None),
                # Under kvrig emulated or kvrig release diff, the platform's parent is shared.
                sharing=Shared.from_environment(sys.executable, logs) if self.device else None,
                max_servers=1 if self.one_process else MAX_SERVERS,
            )
        return self._pool

    def parent_key(self, cell: Cell) -> Hashable:
        """Which warm parent the cell forks from: the part of its environment it imports under."""
        return env_key(cell_env(cell, self.results / "cells" / cell.id))

    def in_run_order(self, cells: Sequence[Cell]) -> list[Cell]:
        """The cells in the order this process runs them (as the items are ordered)."""
        return run_order.run_order(
            cells, lambda c: c, self.parent_key if self.one_process else None
        )

    def prestart(self) -> None:
        """Starts the warm parent's vLLM import while pytest (and xdist) collect, rather
        than when the first cell asks for it."""
        done = {r.get("cell_id") for r in results_mod.read(self.results)} if self.resumed else set()
        # A resumed run whose every cell has its row (a finished run kept) starts no parent.
        to_run = [c for c in self.cells if c.expect.outcome != "skip" and c.id not in done]
        first = next(iter(self.in_run_order(to_run)), None)
        if first is not None and not self.cold:
            self.pool().prestart(cell_env(first, self.results / "cells" / first.id))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


COLUMN_KEY = pytest.StashKey[ColumnRun]()
"""Where the hooks leave the run on pytest's config, for the items to find."""


def column_facts(run: ColumnRun) -> dict[str, Any]:
    """What a resumed run must share with the one it resumes: the column, and which cells
    the environment could not run, so a module installed since lifts the first run's skips."""
    lacking = sorted(
        c.id for c in run.cells if c.expect.outcome == "skip" and skipped_for_needs(c.expect.reason)
    )
    return {"column": run.column, "isa": run.isa, "device": run.device, "lacking": lacking}


def from_config(config: pytest.Config, matrix_path: Path) -> ColumnRun:
    """The run the command line asks for, decided once per pytest process."""
    choice = column_choice.choose(
        config.getoption("--kvrig-platform"),
        config.getoption("--kvrig-isa"),
        config.getoption("--kvrig-emulate"),
        gpu_arch=config.getoption("--kvrig-gpu-arch"),
    )
    # A release named on the command line stands in for the pin, in memory only.
    matrix, named = named_release.for_column(
        load(matrix_path), choice.platform, bool(choice.device), config.getoption("--kvrig-vllm")
    )
    if choice.device:
        _prepare_emulation(config, matrix, choice.platform)
        cells = expand(matrix, choice.platform, gpu_arch=choice.device, device_emulated=True)
    else:
        # A real GPU's own architecture picks its per-architecture expectations.
        cells = expand(
            matrix, choice.platform, isa=choice.isa, emulated=choice.emulated, gpu_arch=choice.arch
        )
    # A model's cells need what its vLLM code imports (Qwen3.5 on CPU: torchvision).
    cells = with_needs_met(
        cells, lambda m: importlib.util.find_spec(m) is not None, install.missing_module_hint
    )
    if not cells:
        raise MatrixError(
            f"{matrix_path} has no cell for the {choice.platform} platform"
            f"{' to emulate' if choice.device else ''}: no case has an expectation under"
            f" `expect: {choice.platform}:`. Add one, or run another platform's column."
        )
    given = config.getoption("--kvrig-results")
    folder = results_folder(named_release.folder_name(choice.column, named))
    results = Path(given) if given else config.invocation_params.dir / folder
    return ColumnRun(
        matrix=matrix,
        choice=choice,
        cells=cells,
        results=results.resolve(),
        cold=bool(config.getoption("--kvrig-cold")),
        named=named,
    )


def _prepare_emulation(config: pytest.Config, matrix: Matrix, platform: str) -> None:
    """An emulated device's column runs on the matrix's CUDA wheel, with the stand-in
    driver built, before any cell starts (not for a collection, which starts none)."""
    if config.option.collectonly:
        return
    wheel.check_installed(matrix, platform)
    folder, symbols = libcuda_stub.ensure()
    # Inherited by xdist workers and every cell's environment (kvrig.run.cell).
    os.environ[STUB_ENV] = str(folder)
    os.environ[STUB_SYMBOLS_ENV] = str(symbols)
