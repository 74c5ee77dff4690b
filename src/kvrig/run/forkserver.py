"""A warm parent for cells: imports vLLM once, then forks one fresh process per cell.

`import vllm` costs about 8 s of CPU, more than a tiny engine's whole life, so each cell
pays it once per server. A child is still a process of its own, in a session of its own
(so the runner can kill everything it starts), with nothing of another cell: cells fork
from the server, which never builds an engine, loads vLLM's plugins or runs a torch
operation, so it holds no thread pool, platform state or plugin a child could inherit.

Only variables read after the fork (`LAZY_ENV`) may differ between the server and a cell;
a cell whose others differ gets a server of its own (`env_key`). Cold mode (`warm=False`)
execs `python -m kvrig.run.cell` instead. A server whose owner dies (even by SIGKILL) sees
its stdin close and kills its cells' sessions, so no engine outlives a killed run. The
protocol is kvrig.run.fork_loop's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from kvrig.facts import architectures
from kvrig.facts import backends as backend_facts
from kvrig.run import fork_loop
from kvrig.run.vllm_plugin import CRAFT_ENV, PROBE_ENV

# Where the columns of one run find the platform parents they share, and the command
# running them, whose end is theirs (kvrig.run.platform_parent): read by the owner's pool.
PARENTS_ENV = "KVRIG_PARENTS"
OWNER_ENV = "KVRIG_PARENTS_OWNER"
# Read by vLLM or the kvrig plugin only when an engine is built, i.e. after the fork.
LAZY_ENV = frozenset(
    {
        PARENTS_ENV,
        OWNER_ENV,
        CRAFT_ENV,
        PROBE_ENV,
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_CPU_OMP_THREADS_BIND",  # read by each CPU worker as it starts
        "KVRIG_TEST_FAULT",
        "PYTHONUNBUFFERED",
        "PYTEST_CURRENT_TEST",  # pytest changes it for every test; nothing in vLLM reads it
        # Read through vllm.envs (uncached until an engine core starts) by the KV-cache
        # layout's resolution only (resolve_kv_cache_layout, 0.33.0 and 0.34.0), as the
        # engine core plans: a cell that sets it needs no import of vLLM of its own.
        "VLLM_KV_CACHE_LAYOUT",
    }
)
OPTIONAL = "?"  # a preload that may fail: the cell then meets the same failure itself
MAX_SERVERS = 2  # per owner: each holds a vLLM import (about 0.5 GB)
# What a cell's process needs from vLLM; importing them starts no Python thread and no
# engine (BLAS libraries start their native pools at import; fork is made for those).
CPU_PRELOAD = (
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.attention.backends.cpu_attn",
)
PRELOAD = (
    "torch",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    *CPU_PRELOAD,
    "vllm.v1.attention.backends.registry",
    *architectures.preloaded("every"),
    "kvrig.define.models",
    "kvrig.run.vllm_plugin.crafted",
    "kvrig.run.vllm_plugin.probe",
    # The cell's own body (kvrig.run.fork_loop.child imports it after the fork): its
    # matrix, rules and provisioning modules are pure, and about 60 ms a cell to import.
    "kvrig.run.cell",
)
READY_TIMEOUT_S = 600.0
PR_SET_CHILD_SUBREAPER = 36


# An emulated device's cells build their model on the meta device and plan the KV cache
# themselves (kvrig.run.emulation.configure). Importing these resolves vLLM's platform in
# the server: the emulated one that KVRIG_EMULATE names, which is part of the server's key.
EMULATED_PRELOAD = (
    "vllm.engine.arg_utils",
    "vllm.model_executor.model_loader",
    "vllm.v1.worker.gpu.attn_utils",
    "vllm.v1.core.kv_cache_planning",
    *architectures.preloaded("emulated"),
    "kvrig.run.emulation.configure",
    "kvrig.run.emulation.meta",
    # What vLLM's configuration and model loader import as they run, in every cell
    # otherwise: the online quantization and expert-substitution modules and what they
    # import (optional: a release may not have them).
    *(
        f"{OPTIONAL}vllm.model_executor.{m}"
        for m in (
            "layers.quantization.online.base",
            "layers.quantization.online.fp8",
            "layers.quantization.online.moe_base",
            "layers.quantization.input_hadamard",
            "layers.fused_moe.oracle.mxfp4",
            "layers.fused_moe.oracle.int8",
            "models.expert_substitution",
        )
    ),
)
# Last: the model classes imported above registered with vLLM in this process, so no cell
# inspects one in a fresh interpreter (optional: a release without the registry's names
# leaves the inspection to vLLM).
REGISTERED = f"{OPTIONAL}kvrig.run.registered"
# The backends each platform's selector tries, which each of its cells imported as it ran
# otherwise (importing FlashInfer alone takes seconds; about 70 ms a ROCm cell for its own):
# optional, as a backend whose module fails to import on a platform is one vLLM skips
# there. Only the platform's own: another platform's backend module may ask for the device
# as it loads, and no cell of this one imports it (CUDA's FlashInfer in a ROCm or XPU
# parent was seconds of every import for nothing). ROCm's own-dtype backends are tried for
# every layer though no cell's KV cache is theirs (kvrig.rules.rocm), so kvrig keeps no
# record of their sizes.
PLATFORM_BACKENDS = {
    "cuda": (
        *backend_facts.modules("cuda"),
        # Sparse MLA backends CUDA's selector tries before it reaches the one kvrig restates.
        "mla.flashattn_mla_sparse",
        "mla.flashinfer_mla_sparse",
        "mla.flashinfer_mla_sparse_sm90",
    ),
    "xpu": backend_facts.modules("xpu"),
    "rocm": (*backend_facts.modules("rocm"), "ultraquant_attn", "rocm_octave_attn"),
}


# Not imported for an emulated device: its cells build no vllm.LLM (they call the engine's
# configuration steps themselves), and the front end's module adds about 0.7 s and 660
# modules to each platform's import that no cell uses.
FRONT_END = "vllm.entrypoints.llm"


def preload_for(platform: str, *, emulated: bool = False) -> tuple[str, ...]:
    """The preload of a platform's column: the CPU worker's modules only on CPU, the
    configuration steps' modules for an emulated device."""
    if platform == "cpu":
        # The CPU parent registers the model classes too: a fresh cache root (a new
        # machine, container or CPU class) otherwise costs each model's first cell an
        # import of vLLM for vLLM's inspection of its class.
        return (*PRELOAD, REGISTERED)
    base = tuple(m for m in PRELOAD if m not in CPU_PRELOAD)
    if not emulated:
        return base
    backends = PLATFORM_BACKENDS.get(platform, ())
    return (
        *(m for m in base if m != FRONT_END),
        *EMULATED_PRELOAD,
        *(f"{OPTIONAL}vllm.v1.attention.backends.{m}" for m in backends),
        REGISTERED,
    )


# What reads the emulated device as it is imported: vllm.kernels, which every model, the
# model loader and most attention backends import, sets oink_ops.OINK_AVAILABLE from the
# compute capability; the FlashAttention backend's metadata builder fixes its CUDA-graph
# support by the FlashAttention version the capability allows (and kvrig's registration of
# the model classes needs them imported). The modules a cell would import as it runs (the
# optional vllm.model_executor ones) are left to the device's parent too, so each is
# imported under the device its cells were. A parent that serves every architecture of a
# platform (kvrig.run.platform_parent) imports the rest of its preload and leaves these to
# each architecture's parent, forked from it once a device is chosen.
DEVICE_READING = (
    REGISTERED,
    f"{OPTIONAL}vllm.model_executor.",
    "vllm.model_executor.models.",
    "vllm.model_executor.model_loader",
    "vllm.v1.worker.gpu.attn_utils",
    f"{OPTIONAL}vllm.v1.attention.backends.flash_attn",
    f"{OPTIONAL}vllm.v1.attention.backends.flex_attention",
    f"{OPTIONAL}vllm.v1.attention.backends.mla.",
)


def before_a_device(preload: tuple[str, ...]) -> tuple[str, ...]:
    """The part of an emulated preload that a parent with no device chosen imports."""
    return tuple(m for m in preload if not m.startswith(DEVICE_READING))


def env_key(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """The part of an environment that must equal the server's for a child to use it."""
    return frozenset((k, v) for k, v in env.items() if k not in LAZY_ENV)


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """A cell's environment without its per-cell part: what the server imports under."""
    return {k: v for k, v in env.items() if k not in LAZY_ENV}


def _thread_count() -> int:
    from kvrig.run.procs import thread_count

    return thread_count()


# --- the server (its own process) ---------------------------------------------------------


def import_preload(modules: tuple[str, ...], absent: list[str] | None = None) -> list[str]:
    """The required modules that failed to import, each with its error. A vLLM module the
    release lacks is not one: each cell then meets its absence and names it
    (kvrig.run.vllm_plugin.symbols), instead of no cell running at all; it goes to
    `absent`, which the parent's log names."""
    missing = []
    for name in modules:
        optional = name.startswith(OPTIONAL)
        try:
            importlib.import_module(name.lstrip(OPTIONAL))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # an emulated device asked for too early is one too
            if gone_from_vllm(name.lstrip(OPTIONAL), exc):
                if absent is not None:
                    absent.append(name.lstrip(OPTIONAL))
            elif not optional:
                missing.append(f"{name} ({type(exc).__name__}: {exc})")
    return missing


def gone_from_vllm(name: str, exc: BaseException) -> bool:
    """Whether the import failed because the vLLM module (or a package above it) is gone
    from this release, rather than failing inside a module that is there."""
    if not isinstance(exc, ModuleNotFoundError) or not name.startswith("vllm."):
        return False
    lost = exc.name or ""
    return lost.startswith("vllm.") and (name == lost or name.startswith(f"{lost}."))


def serve(warm: bool, python: str, preload: tuple[str, ...] = PRELOAD) -> int:
    """The server's loop: fork a cell per request, report its end, reap orphans."""
    fork_loop.prctl(PR_SET_CHILD_SUBREAPER, 1)  # a cell's leaked children come back here
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when cells stop
    started = time.monotonic()
    absent: list[str] = []
    missing = import_preload(preload, absent) if warm else []
    if warm and "vllm" in preload and plugins_loaded():
        print("forkserver: vLLM's plugins were loaded at import", file=sys.stderr)
        return 3
    ready = {**ready_message(time.monotonic() - started, missing), "absent": absent}
    _announce(sys.stdout, ready)
    return fork_loop.Loop(warm, python, conns=[fork_loop.Conn(0, 1)]).run()


def plugins_loaded() -> bool:
    """Whether importing the preloads already registered vLLM's plugins (kvrig's among
    them), which every child would then inherit instead of loading under its own env."""
    import vllm.plugins

    import kvrig.run.vllm_plugin

    return bool(getattr(vllm.plugins, "plugins_loaded", False) or kvrig.run.vllm_plugin._done)


def ready_message(import_s: float, missing: list[str]) -> dict[str, Any]:
    """What the owner needs to decide whether this parent is fit to fork cells."""
    return {
        "ready": os.getpid(),
        "import_s": round(import_s, 3),
        "threads": _thread_count(),
        "missing": missing,
        "python_threads": [
            th.name for th in threading.enumerate() if th is not threading.main_thread()
        ],
        "device_reads": _device_reads(),
    }


def _device_reads() -> list[str]:
    """Where the imports asked an emulated device that was not chosen yet (a parent that
    serves every architecture of its platform: kvrig.run.emulation.chosen)."""
    chosen = sys.modules.get("kvrig.run.emulation.chosen")
    return chosen.unchosen_reads() if chosen is not None else []


def _announce(out: IO[str], ready: dict[str, Any]) -> None:
    """Tells the owner the parent is ready, and its log what it is made of."""
    print(
        f"forkserver: ready in {ready['import_s']} s, {ready['threads']} thread(s) of which"
        f" Python ones besides main: {ready['python_threads'] or 'none'}; preloads that"
        f" failed: {ready['missing'] or 'none'}; preloads this vLLM does not have (not"
        f" preloaded): {', '.join(ready.get('absent') or []) or 'none'}",
        file=sys.stderr,
        flush=True,
    )
    _say(out, ready)


def _say(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--cold" in args:
        return serve(False, sys.executable)
    given = [a.split("=", 1)[1] for a in args if a.startswith("--preload=")]
    preload = tuple(m for m in given[-1].split(",") if m) if given else PRELOAD
    return serve(True, sys.executable, preload)


# --- the owner's side ---------------------------------------------------------------------


def unfit(ready: Mapping[str, Any]) -> str | None:
    """Why a parent that reported ready must not fork cells: a preload that failed (its
    cells would import it afresh, or fail), or a Python thread (a forked cell inherits its
    locks, held, and not the thread)."""
    if ready.get("missing"):
        return f"could not import {'; '.join(ready['missing'])}"
    if ready.get("python_threads"):
        return f"holds Python threads after its imports ({', '.join(ready['python_threads'])})"
    if ready.get("device_reads"):
        return (
            "asked for the emulated device before one was chosen, so what vLLM made of the"
            f" answer would reach every architecture's cells ({'; '.join(ready['device_reads'])})"
        )
    return None


class ServerError(RuntimeError):
    """The server could not start or stopped answering."""


class Unshared(ServerError):
    """A parent shared by a platform's architectures turned out unfit to serve them (it
    asked for the device before one was chosen): its cells get a parent of their own."""


class CellParent:
    """The owner's side of a warm parent's channel: asks for cells, hears how they ended.
    A parent of the owner's own (ForkServer) and a platform's parent shared by several
    columns (kvrig.run.platform_parent) speak the same protocol (kvrig.run.fork_loop)."""

    key: frozenset[tuple[str, str]]
    import_s: float | None = None
    threads: int | None = None
    log: Path | None = None

    def __init__(self) -> None:
        self._conn: fork_loop.Conn | None = None
        self._exits: dict[int, int] = {}

    def launch(self) -> CellParent:
        raise NotImplementedError

    def wait_ready(self) -> CellParent:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def start(self) -> CellParent:
        """Starts the server and waits until it has imported what it preloads."""
        return self.launch().wait_ready()

    def matches(self, env: Mapping[str, str]) -> bool:
        return env_key(env) == self.key

    def _accept_ready(self, msg: dict[str, Any] | None, what: str) -> None:
        """Takes the parent's ready message, or refuses a parent that is unfit to fork."""
        if msg is None or "ready" not in msg:
            self.close()
            raise ServerError(
                f"{what} did not start"
                + (f"; see {self.log}" if self.log else "")
                + ". Run the column with --cold to start each cell in a fresh interpreter."
            )
        self.import_s = msg.get("import_s")
        self.threads = msg.get("threads")
        why = unfit(msg)
        if why:
            self.close()
            raise ServerError(
                f"{what} {why}"
                + (f" (see {self.log})" if self.log else "")
                + ". Run the column with --cold to start each cell in a fresh interpreter."
            )

    def spawn(self, workdir: Path, env: Mapping[str, str], log: Path) -> int:
        """Starts a cell's process; returns its pid (also its session id)."""
        self.wait_ready()
        assert self._conn is not None
        request = {"workdir": str(workdir), "env": dict(env), "log": str(log)}
        try:
            self._conn.send(request)
        except OSError as exc:
            raise ServerError("the warm cell parent is gone") from exc
        while True:
            msg = self._conn.read(60.0)
            if msg is None:
                raise ServerError("the warm cell parent did not answer")
            if "pid" in msg:
                return int(msg["pid"])
            self._note(msg)

    def poll(self, pid: int, timeout: float) -> int | None:
        """The cell's returncode once its process has ended, else None after timeout."""
        if pid in self._exits:
            return self._exits.pop(pid)
        msg = self._conn.read(timeout) if self._conn is not None else None
        if msg is not None:
            self._note(msg)
        if pid in self._exits:
            return self._exits.pop(pid)
        if not self.alive():
            # The server died: its cell was killed with it (PDEATHSIG).
            return -signal.SIGKILL
        return None

    def _note(self, msg: dict[str, Any]) -> None:
        if "exit" in msg:
            self._exits[int(msg["exit"])] = int(msg["status"])


class ForkServer(CellParent):
    """One server process, owned by one runner process (e.g. one pytest-xdist worker)."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        warm: bool = True,
        python: str = sys.executable,
        log: Path | None = None,
        preload: tuple[str, ...] = PRELOAD,
    ) -> None:
        super().__init__()
        self.key = env_key(env)
        self.warm = warm
        self.preload = preload
        self.python = python
        self.log = log
        self._ready = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._env = server_env(env)

    def launch(self) -> ForkServer:
        """Starts the server without waiting for it: its import then overlaps whatever
        the owner does meanwhile (pytest collecting, the first cell's set-up)."""
        mode = f"--preload={','.join(self.preload)}" if self.warm else "--cold"
        args = [self.python, "-m", "kvrig.run.forkserver", mode]
        err: Any = subprocess.DEVNULL
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            err = open(self.log, "ab")  # noqa: SIM115
        try:
            # A session of its own: a Ctrl-C in the terminal reaches the owner, which
            # stops the cells itself, not the server mid-fork.
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self._env,
                start_new_session=True,
            )
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._conn = fork_loop.Conn(self._proc.stdout.fileno(), self._proc.stdin.fileno())
        return self

    def wait_ready(self) -> ForkServer:
        if not self._ready:
            assert self._conn is not None
            self._accept_ready(self._conn.read(READY_TIMEOUT_S), "the warm cell parent")
            self._ready = True
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Ends the server; it kills whatever cell session it still has."""
        if self._proc is None:
            return
        with contextlib.suppress(OSError):
            if self._proc.stdin:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        self._proc = None


class Sharing(Protocol):
    """Where a runner finds a parent shared by the columns of a run (a platform's parent:
    kvrig.run.platform_parent), for the cells whose environment one can serve."""

    def parent_for(self, env: Mapping[str, str]) -> CellParent | None: ...


class Pool:
    """The servers of one runner process, one per import-time environment, replaced when
    one has died; with a Sharing, the parent a run's columns share where one can serve."""

    def __init__(
        self,
        *,
        warm: bool = True,
        python: str = sys.executable,
        log_dir: Path | None = None,
        preload: tuple[str, ...] = PRELOAD,
        sharing: Sharing | None = None,
        max_servers: int = MAX_SERVERS,
    ) -> None:
        self.warm = warm
        # 1 where the owner runs its cells a parent at a time (kvrig.column.run_order): a
        # parent it left is not wanted again, so it goes when the next one is asked for.
        self.max_servers = max(1, max_servers)
        self.python = python
        self.log_dir = log_dir
        self.preload = preload
        self.sharing = sharing if warm else None
        self._servers: list[CellParent] = []

    def prestart(self, env: Mapping[str, str]) -> None:
        """Launches the server cells of this environment will need, without waiting."""
        if not any(s.matches(env) for s in self._servers):
            self._add(env, wait=False)

    def get(self, env: Mapping[str, str]) -> CellParent:
        for server in list(self._servers):
            if not server.alive():
                server.close()
                self._servers.remove(server)
            elif server.matches(env):
                try:
                    return server.wait_ready()
                except Unshared:
                    self._servers.remove(server)
        return self._add(env, wait=True)

    def _add(self, env: Mapping[str, str], wait: bool) -> CellParent:
        while len(self._servers) >= self.max_servers:
            self._servers.pop(0).close()
        server = self.sharing.parent_for(env) if self.sharing is not None else None
        if server is None:
            server = self._own(env)
        self._servers.append(server)
        server.launch()
        if wait:
            try:
                server.wait_ready()
            except Unshared:
                self._servers.remove(server)
                return self._add(env, wait)
            except ServerError:
                self._servers.remove(server)
                raise
        return server

    def _own(self, env: Mapping[str, str]) -> ForkServer:
        n = len(self._servers)
        log = self.log_dir / f"forkserver-{os.getpid()}-{n}.log" if self.log_dir else None
        return ForkServer(env, warm=self.warm, python=self.python, log=log, preload=self.preload)

    @property
    def servers(self) -> list[CellParent]:
        return list(self._servers)

    def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
