"""A warm parent's loop: fork a cell per request, report each cell's end to whoever asked.

One loop serves both kinds of warm parent (kvrig.run.forkserver): a column's own, whose
one connection is its stdin and stdout, and an architecture's parent shared by several
columns (kvrig.run.platform_parent), which accepts a connection per column on a Unix
socket. Each cell's end goes back on the connection that asked for it; a connection that
closes (its column is gone, even by SIGKILL) has the session of every cell it started
killed, so no engine outlives the run that wanted it.

Messages are one JSON object a line: {"workdir", "env", "log"} asks for a cell, {"pid"}
answers at once, {"exit": pid, "status": returncode} when the cell's process ends (a
negative returncode is the signal that ended it).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any


class Conn:
    """One end of a line-JSON channel over file descriptors (a pipe pair or a socket),
    with a buffer of its own: two messages may arrive in one read, and a buffered file
    would hide the second from select."""

    def __init__(self, rfd: int, wfd: int | None = None, owner: Any = None) -> None:
        self.rfd = rfd
        self.wfd = rfd if wfd is None else wfd
        self.owner = owner  # what keeps the descriptors open (a socket), if anything
        self.buf = b""
        self.closed = False

    def fileno(self) -> int:
        return self.rfd

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data) :]

    def messages(self) -> list[dict[str, Any]]:
        """The messages that have arrived (one read, which select said would not block);
        marks the channel closed at its end."""
        chunk = self._read_some()
        if not chunk:
            self.closed = True
        self.buf += chunk
        return list(self._complete())

    def _read_some(self) -> bytes:
        """What has arrived; nothing at the end, or when the other end went away with a
        message of ours unread (a column that only checked the parent answers)."""
        try:
            return os.read(self.rfd, 65536)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def _complete(self) -> Any:
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # stray output on the channel is not a message

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None after timeout or once the other end is gone."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self._complete():
                return message
            if self.closed:
                return None
            ready, _, _ = select.select([self.rfd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = self._read_some()
            if not chunk:
                self.closed = True
            self.buf += chunk

    def close(self) -> None:
        if self.owner is not None:
            self.owner.close()
        else:
            for fd in {self.rfd, self.wfd}:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.closed = True


def child(request: dict[str, Any], warm: bool, python: str, inherited: list[int]) -> None:
    """The cell's process, right after fork; never returns. `inherited` are the parent's
    own descriptors (its sockets, its lifeline), closed here so that a cell holds no
    channel of the parent open."""
    try:
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()
        # The parent dies only when its run is gone; the cell then goes with it.
        die_with_parent()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        env = request["env"]
        if not warm:
            os.execve(python, [python, "-m", "kvrig.run.cell", request["workdir"]], env)
        os.environ.clear()
        os.environ.update(env)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from kvrig.run import cell

        cell.main([request["workdir"]])  # ends with os._exit
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    os._exit(70)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Asks the kernel to SIGKILL this process when its parent dies (Linux)."""
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def ended_children() -> Iterator[tuple[int, int]]:
    """Each child that has ended, reaped, with its wait status; none left waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def kill_sessions(sids: set[int]) -> None:
    from kvrig.run.procs import kill_session

    for sid in sids:
        kill_session(sid)


def exit_watch(pid: int) -> int | None:
    """A descriptor that becomes readable when the child `pid` ends (Linux's pidfd), or
    None where there is none: the loop then finds the end at its next timeout."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class Cells:
    """The cells a parent has forked, each with the connection that asked for it, and the
    sessions each connection's owner may not have ended yet."""

    def __init__(self) -> None:
        self.running: dict[int, Conn] = {}
        self.sessions: dict[Conn, set[int]] = {}
        # A descriptor per running cell that select wakes on when it ends, so its end is
        # reported at once rather than at the loop's next timeout (SIGCHLD wakes no select).
        self.exits: dict[int, int] = {}

    def started(self, pid: int, conn: Conn) -> None:
        self.running[pid] = conn
        self.sessions.setdefault(conn, set()).add(pid)
        fd = exit_watch(pid)
        if fd is not None:
            self.exits[pid] = fd

    def forget_ended(self, conn: Conn) -> None:
        """The owner has ended the sessions of its cells that are over; forget them, so a
        session id the system hands out again is never killed by mistake."""
        mine = self.sessions.get(conn, set())
        mine.intersection_update(p for p, c in self.running.items() if c is conn)

    def gone(self, conn: Conn) -> None:
        """A connection closed: the sessions of every cell it started are killed."""
        kill_sessions(self.sessions.pop(conn, set()))
        for pid in [p for p, c in self.running.items() if c is conn]:
            del self.running[pid]

    def reap(self) -> None:
        """Reaps every child that has ended, cells and the orphans they left (which come
        here as to their subreaper), and reports each cell's end to its connection."""
        for pid, status in ended_children():
            fd = self.exits.pop(pid, None)
            if fd is not None:
                os.close(fd)
            conn = self.running.pop(pid, None)
            if conn is not None and not conn.closed:
                with contextlib.suppress(OSError):
                    conn.send({"exit": pid, "status": os.waitstatus_to_exitcode(status)})

    def kill_all(self) -> None:
        kill_sessions({s for sids in self.sessions.values() for s in sids})


class Loop:
    """Forks cells for its connections until its run is gone: for a column's own parent,
    when its one connection closes; for a shared one, when its lifeline closes or the last
    column it served has gone."""

    def __init__(
        self,
        warm: bool,
        python: str,
        *,
        conns: list[Conn] | None = None,
        listener: socket.socket | None = None,
        lifeline: int | None = None,
        ready: dict[str, Any] | None = None,
    ) -> None:
        self.warm, self.python = warm, python
        self.conns = list(conns or [])
        self.listener, self.lifeline, self.ready = listener, lifeline, ready
        self.cells = Cells()
        # A shared parent goes once every column it served has gone (an architecture's
        # columns of one run come one at a time: an idle parent only holds memory).
        self.served = False

    def run(self) -> int:
        try:
            while self._turn():
                self.cells.reap()
            return 0
        finally:
            self.cells.kill_all()

    def _turn(self) -> bool:
        """One wait for something to do; False once the run is gone."""
        watched: list[Any] = [*self.conns, *self.cells.exits.values()]
        watched += [self.listener] if self.listener is not None else []
        watched += [self.lifeline] if self.lifeline is not None else []
        readable, _, _ = select.select(watched, [], [], 0.1)
        if self.lifeline is not None and self.lifeline in readable:
            return False  # the platform's parent is gone, or said stop
        if self.listener is not None and self.listener in readable:
            self._accept()
        for conn in [c for c in readable if isinstance(c, Conn)]:
            self._serve(conn)
        if self.listener is None:
            return bool(self.conns)
        if self.served and not self.conns and not self._waiting():
            self.listener.close()  # idle: refuse newcomers, who ask the platform's again
            return False
        return True

    def _waiting(self) -> bool:
        """Whether a column is knocking (a connection not accepted yet)."""
        readable, _, _ = select.select([self.listener], [], [], 0)
        return bool(readable)

    def _accept(self) -> None:
        sock, _ = self.listener.accept()  # type: ignore[union-attr]
        conn = Conn(sock.fileno(), owner=sock)
        self.conns.append(conn)
        self.served = True
        with contextlib.suppress(OSError):
            conn.send(self.ready or {})

    def _serve(self, conn: Conn) -> None:
        for request in conn.messages():
            self._fork(conn, request)
        if conn.closed:
            self.cells.gone(conn)
            self.conns.remove(conn)
            conn.close()

    def _fork(self, conn: Conn, request: dict[str, Any]) -> None:
        self.cells.forget_ended(conn)
        sys.stdout.flush()
        # The parent's objects out of the cell's garbage collections: a collection writes
        # to every object it scans, which copies each page of the parent's heap into the
        # cell (copy on write) instead of sharing it.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            child(request, self.warm, self.python, self._own_fds())
        self.cells.started(pid, conn)
        with contextlib.suppress(OSError):  # a column gone: its end is read next
            conn.send({"pid": pid})

    def _own_fds(self) -> list[int]:
        """The descriptors of this parent's channels (not 0-2: the cell replaces those)."""
        fds = [fd for c in self.conns for fd in (c.rfd, c.wfd)]
        fds += list(self.cells.exits.values())
        fds += [self.listener.fileno()] if self.listener is not None else []
        fds += [self.lifeline] if self.lifeline is not None else []
        return sorted({fd for fd in fds if fd > 2})


# --- a request handed over once: one JSON line, descriptors beside it ----------------------

MAX_MESSAGE = 1 << 20


def send_once(path: str, message: dict[str, Any], fds: list[int]) -> None:
    """Sends one request, and descriptors, to the parent listening at `path`: it reads it
    once it has imported (kvrig.run.root_parent), the descriptors held open in flight."""
    data = (json.dumps(message) + "\n").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        socket.send_fds(sock, [data], fds)


def receive_once(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request and descriptors `send_once` sent; an empty request if it was cut off."""
    conn.settimeout(10.0)
    chunks: list[bytes] = []
    fds: list[int] = []
    with contextlib.suppress(OSError):
        while not chunks or not chunks[-1].endswith(b"\n"):
            data, got, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 4)
            fds += list(got)
            if not data:
                break
            chunks.append(data)
    try:
        return json.loads(b"".join(chunks) or b"{}"), fds
    except ValueError:
        return {}, fds
