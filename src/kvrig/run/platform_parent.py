"""One warm parent per emulated platform and release, shared by that platform's columns.

Six emulated CUDA columns run the same vLLM platform code with another compute capability,
so a run of several columns imports vLLM once per platform, not once per column. The
platform's parent imports vLLM with no device chosen, since whatever vLLM makes of a
device answer at import would reach every architecture; a device read there is refused
(kvrig.run.emulation.chosen), and that parent serves nobody. The modules that read the
device as they load (kvrig.run.forkserver's DEVICE_READING) are imported by an
architecture's parent, forked from the platform's once its device is chosen:

    column --socket--> platform parent (per platform, release and environment)
                         `-- fork --> architecture parent (cuda:9.0) <--socket-- column
                                        `-- fork --> cell, cell, ...

Each platform's parent is forked from the run's root parent (kvrig.run.root_parent), which
imported vLLM's libraries once, or, where there is none, started as an interpreter of its
own. The parents go when the orchestrating command does (KVRIG_PARENTS_OWNER, even a
SIGKILLed one), each killing its cells' sessions on the way out. ROCm's platform parent
imports none of vLLM: rocm.py reads the gfx target once at import into `_GCN_ARCH` and
module constants, before nearly any other module loads, so each gfx target's parent
imports vLLM itself (docs/emulated.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrig.run import fork_loop
from kvrig.run.emulation import EMULATE_ENV
from kvrig.run.forkserver import (
    OWNER_ENV,
    PARENTS_ENV,
    PR_SET_CHILD_SUBREAPER,
    READY_TIMEOUT_S,
    CellParent,
    ServerError,
    Unshared,
    before_a_device,
    env_key,
    import_preload,
    plugins_loaded,
    preload_for,
    ready_message,
    server_env,
    unfit,
)
from kvrig.run.neutral import NEUTRAL, root_env

SHARED_PLATFORMS = ("cuda", "xpu", "rocm")
# ROCm's platform code reads the gfx target as vLLM resolves its platform, before nearly
# any of vLLM's own modules loads (docs/emulated.md): its platform's parent imports none of
# vLLM, each gfx target's parent all of it.
NO_VLLM_BEFORE_A_DEVICE = ("rocm",)
ARCH_ATTEMPTS = 5  # an architecture's parent that was going is asked for again


# --- the platform's parent and its architectures' parents (their own processes) -----------


@dataclass
class _Arch:
    pid: int
    path: Path


class PlatformParent:
    """Imports what reads no device, then forks an architecture's parent per device asked
    for, answering each column with where that one listens."""

    def __init__(
        self,
        path: Path,
        owner: int,
        arch_preload: tuple[str, ...],
        *,
        listener: socket.socket | None = None,
        forked_from: int | None = None,
    ) -> None:
        self.path, self.owner, self.arch_preload = path, owner, arch_preload
        # Bound before the import (by the column that started it, when given): columns
        # queue on it, then wait.
        self.listener = listener if listener is not None else _listen(path)
        self.forked_from = forked_from  # the root parent's pid, when forked from one
        self.lifeline_r, self.lifeline_w = os.pipe()
        self.archs: dict[str, _Arch] = {}
        self.conns: list[fork_loop.Conn] = []
        self.ready: dict[str, Any] = {}
        self.owner_fd = watch_owner(owner)

    def run(self, preload: tuple[str, ...]) -> int:
        fork_loop.prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when cells stop
        if owner_gone(self.owner, None, []):
            return 0  # a run already over (a column that outlived it): import nothing
        started = time.monotonic()
        self.ready = _ready(preload, started, f"platform {os.environ.get(EMULATE_ENV)}")
        self.ready["forked_from"] = self.forked_from
        try:
            while self._turn():
                self._reap()
        finally:
            self.listener.close()
            self.path.unlink(missing_ok=True)
            os.close(self.lifeline_w)  # every architecture's parent ends its cells and goes
        return 0

    def _turn(self) -> bool:
        watched: list[Any] = [self.listener, *self.conns]
        watched += [self.owner_fd] if self.owner_fd is not None else []
        readable, _, _ = select.select(watched, [], [], 0.5)
        if owner_gone(self.owner, self.owner_fd, readable):
            return False
        if self.listener in readable:
            sock, _ = self.listener.accept()
            conn = fork_loop.Conn(sock.fileno(), owner=sock)
            self.conns.append(conn)
            with contextlib.suppress(OSError):
                conn.send(self.ready)
        for conn in [c for c in readable if isinstance(c, fork_loop.Conn)]:
            if not self._serve(conn):
                return False
        return True

    def _serve(self, conn: fork_loop.Conn) -> bool:
        """Answers a column's requests; False when one says stop."""
        for request in conn.messages():
            if request.get("stop"):
                return False
            if "arch" in request:
                with contextlib.suppress(OSError):
                    conn.send(self._arch(request["arch"]))
        if conn.closed:
            self.conns.remove(conn)
            conn.close()
        return True

    def _arch(self, spec: str) -> dict[str, Any]:
        if unfit(self.ready):
            return {"error": unfit(self.ready)}
        arch = self.archs.get(spec)
        if arch is None or not _running(arch.pid):
            arch = self.archs[spec] = self._fork_arch(spec)
        return {"arch": spec, "socket": str(arch.path), "pid": arch.pid}

    def _fork_arch(self, spec: str) -> _Arch:
        path = self.path.with_name(f"{self.path.stem}.{spec.replace(':', '-')}")
        listener = _listen(path)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            inherited = [self.listener.fileno(), self.lifeline_w, *(c.rfd for c in self.conns)]
            inherited += [self.owner_fd] if self.owner_fd is not None else []
            _arch_parent(spec, path, listener, self.lifeline_r, self.arch_preload, inherited)
        listener.close()
        return _Arch(pid, path)

    def _reap(self) -> None:
        """Reaps ended children (an architecture's parent, an orphan come to its
        subreaper); an architecture whose parent ended gets a new one when next asked."""
        for pid, _ in fork_loop.ended_children():
            for spec, arch in list(self.archs.items()):
                if arch.pid == pid:
                    del self.archs[spec]


def _running(pid: int) -> bool:
    """Whether a child is still running (one that ended is reaped here)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _arch_parent(
    spec: str,
    path: Path,
    listener: socket.socket,
    lifeline: int,
    preload: tuple[str, ...],
    inherited: list[int],
) -> None:
    """An architecture's parent, right after its fork: takes on the device, imports what
    reads it, then forks that architecture's cells until the platform's parent is gone."""
    code = 70
    try:
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        fork_loop.prctl(PR_SET_CHILD_SUBREAPER, 1)
        os.environ[EMULATE_ENV] = spec
        ready = {**_ready(preload, time.monotonic(), spec), "arch": spec}
        loop = fork_loop.Loop(True, sys.executable, listener=listener, lifeline=lifeline)
        loop.ready = ready
        code = loop.run()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        path.unlink(missing_ok=True)
        sys.stderr.flush()
        os._exit(code)


def _ready(preload: tuple[str, ...], started: float, who: str) -> dict[str, Any]:
    """Imports the preload and says what this parent is made of, in its log too."""
    absent: list[str] = []
    missing = import_preload(preload, absent)
    ready = {**ready_message(time.monotonic() - started, missing), "absent": absent}
    if "vllm" in preload and plugins_loaded():
        ready["missing"] = [*missing, "vLLM's plugins were loaded at import"]
    print(
        f"warm parent ({who}): ready in {ready['import_s']} s, {ready['threads']}"
        f" thread(s); Python threads besides main: {ready['python_threads'] or 'none'};"
        f" preloads that failed: {ready['missing'] or 'none'}; preloads this vLLM does not"
        f" have (not preloaded): {', '.join(absent) or 'none'}; device asked before one was"
        f" chosen: {ready['device_reads'] or 'never'}",
        file=sys.stderr,
        flush=True,
    )
    return ready


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    sock.bind(str(path))
    sock.listen(64)
    return sock


def watch_owner(owner: int) -> int | None:
    """A descriptor that becomes readable when the owner ends (Linux's pidfd), or None
    where there is none: the owner is then polled."""
    try:
        return os.pidfd_open(owner)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def owner_gone(owner: int, fd: int | None, readable: list[Any]) -> bool:
    if fd is not None:
        return fd in readable
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv))
    path, owner = Path(args["--listen"]), int(args["--owner"])
    preload = tuple(m for m in args["--preload"].split(",") if m)
    arch_preload = tuple(m for m in args["--arch-preload"].split(",") if m)
    fd = args.get("--listen-fd")
    listener = socket.socket(fileno=int(fd)) if fd else None
    code = PlatformParent(path, owner, arch_preload, listener=listener).run(preload)
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown of a vLLM import: seconds, for nothing


# --- the owner's side ---------------------------------------------------------------------


def platform_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a platform's parent imports under: a cell's environment without its per-cell
    part, naming the platform alone."""
    out = server_env(env)
    out[EMULATE_ENV] = out[EMULATE_ENV].split(":", 1)[0]
    return out


def shareable(env: Mapping[str, str]) -> bool:
    """Whether a cell with this environment may fork from its platform's shared parent."""
    spec = env.get(EMULATE_ENV, "")
    return ":" in spec and spec.split(":", 1)[0] in SHARED_PLATFORMS


class Shared:
    """The platforms' parents a column shares with the other columns of its run (found in
    the folder the run names), and which of them turned out unfit to share."""

    def __init__(
        self,
        folder: Path,
        owner: int,
        python: str,
        log_dir: Path | None,
        preload: tuple[str, ...] | None = None,
        *,
        roots: bool = True,
        root_preload: tuple[str, ...] | None = None,
        vllm_before_a_device: bool = True,
    ) -> None:
        self.folder, self.owner, self.python, self.log_dir = folder, owner, python, log_dir
        self.preload = preload  # the platform's emulated preload unless given
        # Whether the platforms' parents fork from the run's root (kvrig.run.root_parent),
        # which imports root_preload (vLLM's libraries unless given).
        self.roots, self.root_preload = roots, root_preload
        # False: every platform's architecture parents import all of vLLM themselves, as
        # ROCm's always do; each is then a parent of its own, forked from the root.
        self.vllm_before_a_device = vllm_before_a_device
        self.refused: set[Path] = set()

    @classmethod
    def from_environment(cls, python: str, log_dir: Path | None) -> Shared | None:
        """The sharing the orchestrating command set up, if any (a lone column has none)."""
        folder, owner = os.environ.get(PARENTS_ENV), os.environ.get(OWNER_ENV)
        if not folder or not owner or not owner.isdigit():
            return None
        return cls(Path(folder), int(owner), python, log_dir)

    def socket_for(self, env: Mapping[str, str]) -> Path:
        """One platform parent per interpreter and import-time environment."""
        return self.folder / f"{_digest([self.python, sorted(platform_env(env).items())])}.sock"

    def parent_for(self, env: Mapping[str, str]) -> CellParent | None:
        """The shared parent for a cell, or None: the platform is not shared, its parent
        turned out unfit, or the run that shares it is over (a column that outlived it
        finishes on a parent of its own)."""
        if not shareable(env) or self.socket_for(env) in self.refused:
            return None
        if owner_gone(self.owner, None, []):
            return None
        return SharedParent(env, self)

    def unshared(self, parent: SharedParent, why: str) -> None:
        """Remembers a platform parent that turned out unfit, and says so in the log."""
        self.refused.add(parent.path)
        print(
            f"kvrig: the {parent.spec.split(':')[0]} platform's shared parent {why}; this"
            " column's cells get a parent of their own",
            file=sys.stderr,
            flush=True,
        )

    def start(self, env: Mapping[str, str]) -> None:
        """Starts the platform's parent unless one answers; under a lock, so that columns
        starting at once start one between them. Its socket is bound here, before whoever
        runs it has imported anything: columns queue on it at once."""
        path = self.socket_for(env)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _answers(path):
                return
            with _listen(path) as listener:
                request = self._request(path, env)
                if not self._from_root(env, request, listener):
                    self._launch(request, listener)

    def _request(self, path: Path, env: Mapping[str, str]) -> dict[str, Any]:
        """What the platform's parent is made of, whoever starts it."""
        platform = env[EMULATE_ENV].split(":", 1)[0]
        preload = self.preload or preload_for(platform, emulated=True)
        later = platform in NO_VLLM_BEFORE_A_DEVICE or not self.vllm_before_a_device
        own = () if later else before_a_device(preload)
        log = self._log()
        return {
            "listen": str(path), "owner": self.owner, "preload": list(own),
            "arch_preload": list(preload), "env": platform_env(env),
            "log": str(log) if log else None, "extra": self.root_preload is None,
        }  # fmt: skip

    def _from_root(
        self, env: Mapping[str, str], request: dict[str, Any], listener: socket.socket
    ) -> bool:
        """Hands the platform's parent to the run's root parent (started if none answers):
        False where there is no root to ask."""
        if not self.roots:
            return False
        own = root_env(request["env"])
        root = self.folder.parent / f"root-{_digest([self.python, sorted(own.items())])}"
        sock = root.with_suffix(".sock")
        with open(root.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _answers(sock):
                with _listen(sock) as root_listener:
                    self._spawn(
                        ["kvrig.run.root_parent", f"--listen={sock}",
                         f"--listen-fd={root_listener.fileno()}", f"--owner={self.owner}",
                         f"--preload={','.join(self.root_preload or NEUTRAL)}"],
                        own, root_listener, self._root_log(),
                    )  # fmt: skip
        try:
            fork_loop.send_once(str(sock), {"fork": request}, [listener.fileno()])
        except OSError:
            return False
        return True

    def _launch(self, request: dict[str, Any], listener: socket.socket) -> None:
        args = [
            "kvrig.run.platform_parent", f"--listen={request['listen']}",
            f"--listen-fd={listener.fileno()}", f"--owner={self.owner}",
            f"--preload={','.join(request['preload'])}",
            f"--arch-preload={','.join(request['arch_preload'])}",
        ]  # fmt: skip
        log = request["log"]
        self._spawn(args, request["env"], listener, Path(log) if log else None)

    def _spawn(
        self, args: list[str], env: Mapping[str, str], listener: socket.socket, log: Path | None
    ) -> None:
        """Starts a parent as an interpreter of its own, on the socket bound for it."""
        err: Any = subprocess.DEVNULL
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            err = open(log, "ab")  # noqa: SIM115
        try:
            subprocess.Popen(
                [self.python, "-m", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=dict(env),
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # outlives this column: the next one uses it too
            )
        finally:
            if err is not subprocess.DEVNULL:
                err.close()

    def _log(self) -> Path | None:
        return self.log_dir / f"platform-parent-{os.getpid()}.log" if self.log_dir else None

    def _root_log(self) -> Path | None:
        return self.log_dir / f"root-parent-{os.getpid()}.log" if self.log_dir else None


# The processes a run's columns start outside their own trees: a root parent, and a
# platform's parent (one forked from a root keeps the root's command line).
SERVING_MODULES = ("kvrig.run.platform_parent", "kvrig.run.root_parent")


def serving(owner: int) -> list[int]:
    """The root and platform parents serving the run of `owner`: started by its columns,
    they leave its process tree when the column that started them ends (the benchmark
    counts them, and the processes forked from them)."""
    import psutil

    flag = f"--owner={owner}"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if flag in cmdline and any(m in cmdline for m in SERVING_MODULES):
            found.append(proc.pid)
    return found


def _digest(what: Any) -> str:
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def _answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
        return True
    except OSError:
        return False


def _connect(path: Path) -> fork_loop.Conn:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        raise ServerError(f"the warm parent at {path} does not answer ({exc})") from None
    return fork_loop.Conn(sock.fileno(), owner=sock)


class SharedParent(CellParent):
    """A column's channel to its architecture's parent, found through the platform's."""

    def __init__(self, env: Mapping[str, str], shared: Shared) -> None:
        super().__init__()
        self.key = env_key(env)
        self.spec = env[EMULATE_ENV]
        self.shared = shared
        self.path = shared.socket_for(env)
        self.log = shared._log()
        self._env = dict(env)
        self._platform: fork_loop.Conn | None = None
        self.platform_pid: int | None = None
        self.forked_from: int | None = None  # the root parent the platform's was forked from
        self._pid: int | None = None
        self._ready = False

    def launch(self) -> SharedParent:
        """Starts the platform's parent if none answers and asks it for this device's,
        without waiting for either to import."""
        self.shared.start(self._env)
        self._platform = _connect(self.path)
        self._platform.send({"arch": self.spec})
        return self

    def wait_ready(self) -> SharedParent:
        if self._ready:
            return self
        if self._platform is None:
            self.launch()
        assert self._platform is not None
        ready = self._platform.read(READY_TIMEOUT_S)
        if ready is not None and ready.get("device_reads"):
            why = unfit(ready) or "is unfit"
            self.shared.unshared(self, why)
            self.close()
            raise Unshared(why)
        self._accept_ready(ready, f"the {self.spec.split(':')[0]} platform's warm parent")
        self.platform_pid = int(ready["ready"]) if ready else None
        self.forked_from = ready.get("forked_from") if ready else None
        arch_ready = self._arch_channel(self._platform)
        self._platform.close()
        self._platform = None
        self._accept_ready(arch_ready, f"the {self.spec} warm parent")
        self._ready = True
        return self

    def _arch_channel(self, platform: fork_loop.Conn) -> dict[str, Any] | None:
        """Connects to the architecture's parent the platform's names and returns its ready
        message; asks again when that one was going (its last column had just left)."""
        for _ in range(ARCH_ATTEMPTS):
            where = platform.read(60.0)
            if where is None or "socket" not in where:
                raise ServerError(f"the platform's warm parent gave no parent for {self.spec}")
            self._pid = int(where["pid"])
            with contextlib.suppress(ServerError):
                self._conn = _connect(Path(where["socket"]))
                ready = self._conn.read(READY_TIMEOUT_S)
                if ready is not None:
                    return ready
                self._conn.close()
            time.sleep(0.2)
            platform.send({"arch": self.spec})
        raise ServerError(f"the {self.spec} warm parent went, {ARCH_ATTEMPTS} times")

    @property
    def pid(self) -> int | None:
        return self._pid

    def alive(self) -> bool:
        return self._conn is None or not self._conn.closed

    def close(self) -> None:
        """Leaves the parents to the other columns; the run stops them (Parents)."""
        for conn in (self._platform, self._conn):
            if conn is not None:
                conn.close()
        self._platform = self._conn = None


# --- the orchestrating command's side -----------------------------------------------------


class Parents:
    """Where the columns of one run find their platforms' parents: a folder per group of
    columns (a platform of a release), whose parents are stopped when its last column is
    done, so at most a few imports of vLLM are held at once."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvrig-parents-"))
        self._groups: dict[str, Path] = {}
        self._lock = threading.Lock()

    def env(self, group: str) -> dict[str, str]:
        """What a column of the group runs with, beside its own environment."""
        with self._lock:
            folder = self._groups.setdefault(group, self.folder / f"g{len(self._groups)}")
        return {PARENTS_ENV: str(folder), OWNER_ENV: str(os.getpid())}

    def stop(self, group: str) -> None:
        """Stops the group's platform parents (their architectures' parents go with them)."""
        folder = self._groups.get(group)
        for path in sorted(folder.glob("*.sock")) if folder and folder.is_dir() else []:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5.0)
                sock.connect(str(path))
                sock.sendall(b'{"stop": true}\n')

    def close(self) -> None:
        for group in list(self._groups):
            self.stop(group)
        for root in sorted(self.folder.glob("root-*.sock")):
            with contextlib.suppress(OSError):
                fork_loop.send_once(str(root), {"stop": True}, [])
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Parents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def parents_for(groups: list[str] | None) -> Iterator[Parents | None]:
    """Shared parents for a run whose columns are grouped, none for one that is not."""
    if groups is None:
        yield None
        return
    with Parents() as parents:
        yield parents


if __name__ == "__main__":
    sys.exit(main())
