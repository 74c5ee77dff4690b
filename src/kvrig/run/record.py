"""The record of one cell: what the engine did, as facts, before anyone judges them.

Records are written by kvrig.run.runner the moment a cell ends and read back by verdicts,
reports and the gate, so they are plain JSON with a schema that tolerates missing parts
(a cell that crashed has no block size to report).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ran: the engine started and generate() returned; configured: an emulated device's cell
# went through vLLM's whole configuration phase (kvrig.run.emulation), nothing generated;
# error: an exception ended the cell; crashed: the process died on a signal or without a
# record; timeout/memory: the runner ended it; skipped: the matrix said not to run it.
Outcome = Literal["ran", "configured", "error", "crashed", "timeout", "memory", "skipped"]


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    message: str
    function: str | None = None
    # The process that raised it: "front end" (in-process engines too) or "worker".
    process: Literal["worker", "front end"] = "front end"
    # Where the record read it (kvrig.run.collect): "probe:<pid>", the probe's own event in
    # that process; "log" or "log:<pid>", text a child printed (the pid its line names);
    # "summary:<pid>", the front end's summary. A worker's word is only the first: log text
    # says nothing of whether the worker's probe saw the KV cache sized before it. None in
    # a record that keeps no sources.
    source: str | None = None
    frames: list[str] = Field(default_factory=list)
    # The vLLM name kvrig's own code reached for and the release lacks (a MissingVllmSymbol,
    # kvrig.run.vllm_plugin.symbols): kvrig does not fit the release, vLLM did not fail.
    missing_vllm_symbol: str | None = None

    def source_pid(self) -> str | None:
        """The pid of the process the source names ("probe:20", "log:5"), or None."""
        _, _, pid = (self.source or "").partition(":")
        return pid or None

    def one_line(self) -> str:
        msg = self.message.strip().splitlines()[0] if self.message.strip() else ""
        where = f" from {self.function}" if self.function else ""
        return f"{self.type}{where}: {msg}"


class KVGroup(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    block_size: int
    page_size_bytes: int
    real_page_size_bytes: int | None = None
    layers: list[str] = Field(default_factory=list)
    backends: list[str] = Field(default_factory=list)
    kernel_block_size: int | None = None


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cell_id: str
    platform: str
    # The results column (the platform, or cpu-<class> for an emulated class), the CPU
    # class whose rules the cell follows, and whether the rig emulated it; the host's own
    # flags and class are in `host`.
    column: str | None = None
    isa: str | None = None
    emulated: bool = False
    # The GPU architecture the cell followed, and whether the device was emulated; then
    # `emulation` says what vLLM was given instead of a device (kvrig.run.emulation).
    gpu_arch: str | None = None
    device_emulated: bool = False
    emulation: dict[str, Any] | None = None
    model: str
    case: str
    family: str
    outcome: Outcome
    multiprocessing: bool = False
    # Block sizes: the worker's before/after alignment, and the engine core's afterwards.
    block_size_before: int | None = None
    user_specified_block_size: bool | None = None
    worker_block_size: int | None = None
    engine_block_size: int | None = None
    # With pipeline parallelism, each stage's worker block (stage 0 first): each stage
    # sizes from its own layers; the engine core takes the smallest of its groups.
    stage_block_sizes: list[int | None] = Field(default_factory=list)
    mamba_page_size_padded: int | None = None
    # In mamba_cache_mode "align" the mamba block follows the attention block.
    mamba_block_size: int | None = None
    mamba_cache_mode: str | None = None
    # The lines vLLM logged while it aligned the size ("Setting attention block size ...",
    # "Padding mamba page size ...", XPU's "[XPU]Setting ..."), as they read in the log.
    alignment_log: list[str] = Field(default_factory=list)
    backends: list[str] = Field(default_factory=list)
    backends_accept: dict[str, bool] = Field(default_factory=dict)
    backend_kernel_sizes: dict[str, list[str]] = Field(default_factory=dict)
    layer_backends: dict[str, str] = Field(default_factory=dict)
    kv_cache_groups: list[KVGroup] = Field(default_factory=list)
    kernel_block_sizes: list[int] = Field(default_factory=list)
    # What the worker's vLLM saw of the CPU (torch's probes, the kernel library loaded,
    # the SSM state dtype it settled on): the proof that an emulated class is what ran.
    isa_view: dict[str, Any] | None = None
    # The places the probe wrapped, in any of the cell's processes, and whether it saw the
    # KV cache sized: without both, "before KV-cache sizing" would be a guess.
    probe_hooks: list[str] = Field(default_factory=list)
    kv_cache_sized_seen: bool = False
    # The hooks each process reported (by pid), and the processes that chose the block
    # size and sized the KV cache: a hook counts only in the process whose event it wraps.
    probe_hooks_by_pid: dict[str, list[str]] = Field(default_factory=dict)
    # Hooks the probe could not install, each with the vLLM name this release lacks.
    probe_missing: dict[str, str] = Field(default_factory=dict)
    sizing_pid: int | None = None
    kv_sized_pid: int | None = None
    # The cell's own process (the front end), so that a worker is known as any other pid.
    frontend_pid: int | None = None
    # Where each fact was read, by field: "probe:<pid>", "summary:<pid>" or "log" (as for
    # ErrorInfo.source). A fact is only as good as the process that gave it.
    sources: dict[str, str] = Field(default_factory=dict)
    # Errors: the root cause (from the process that raised it) and what the caller saw.
    error: ErrorInfo | None = None
    frontend_error: ErrorInfo | None = None
    kv_cache_sized_before_error: bool | None = None
    tokens_generated: int = 0
    timings: dict[str, float] = Field(default_factory=dict)
    exit_code: int | None = None
    signal: str | None = None
    peak_rss_mb: float | None = None
    vllm_version: str | None = None
    vllm_commit: str | None = None
    # The overlay the cell ran under (kvrig.provision.overlay: base wheel, source commit
    # or patch sha256, files overlaid), and where the front end's vllm was imported from.
    vllm_overlay: dict[str, Any] | None = None
    vllm_file: str | None = None
    # The requirements the environment's install overrode (`kvrig setup vllm --override`,
    # a platform's pin_overrides; kvrig.provision.stamp): not the release's own environment.
    vllm_overrides: list[str] = Field(default_factory=list)
    torch_version: str | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    log: str | None = None
    skip_reason: str | None = None
    note: str | None = None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Record:
        return cls.model_validate(json.loads(path.read_text()))
