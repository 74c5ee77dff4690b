"""The root of a run's emulated parents: vLLM's libraries imported once, every platform's
parent forked from it.

    column --socket--> root (per interpreter and environment: torch, transformers, ...;
                        |    no vLLM, no device, no variable of vLLM's)
                        `-- fork --> platform parent (cuda; rocm; rocm with AITER on; xpu)
                                      `-- fork --> architecture parent --> cells

A column that starts a platform's parent (kvrig.run.platform_parent.Shared) binds that
parent's socket itself and hands it to the root with its request, so other columns can
queue on it at once, while the root is still importing. The root forks a child per
request, which imports the platform's own libraries (FlashInfer on CUDA and ROCm) under
the root's watch, stops watching, takes the platform parent's environment and becomes it.
Where the watch saw anything (kvrig.run.neutral), the child instead starts the platform's
parent as an interpreter of its own, on the same socket, as a run did before there was a
root, and the log says why. The root goes when the run's owner does or when told to stop;
the platform parents it forked watch the owner themselves.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from kvrig.run import fork_loop, neutral
from kvrig.run.forkserver import import_preload
from kvrig.run.platform_parent import PlatformParent, owner_gone, watch_owner


class RootParent:
    def __init__(self, listener: socket.socket, path: Path, owner: int) -> None:
        self.listener, self.path, self.owner = listener, path, owner
        self.owner_fd = watch_owner(owner)
        self.watch = neutral.Watch()
        self.findings: list[str] = []

    def run(self, preload: tuple[str, ...]) -> int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when parents stop
        if owner_gone(self.owner, None, []):
            return 0
        started = time.monotonic()
        self._import(preload)
        print(
            f"root parent: {len(preload)} libraries imported in"
            f" {time.monotonic() - started:.1f} s; seen while they loaded:"
            f" {'; '.join(self.findings) or 'nothing'}"
            + (
                "; each platform's parent starts an interpreter of its own" if self.findings else ""
            ),
            file=sys.stderr,
            flush=True,
        )
        gc.freeze()  # each child's collections then copy none of these pages
        try:
            while self._turn():
                for _ in fork_loop.ended_children():
                    pass  # a platform's parent that ended: nothing of it is kept
        finally:
            self.listener.close()
            self.path.unlink(missing_ok=True)
        return 0

    def _import(self, preload: tuple[str, ...]) -> None:
        self.watch.start()
        first, rest = preload[:1], preload[1:]
        missing = import_preload(first)
        self.watch.guard_torch()
        missing += import_preload(rest)
        self.findings = [*self.watch.findings(), *(f"could not import {m}" for m in missing)]

    def _turn(self) -> bool:
        watched: list[Any] = [self.listener]
        watched += [self.owner_fd] if self.owner_fd is not None else []
        readable, _, _ = select.select(watched, [], [], 0.5)
        if owner_gone(self.owner, self.owner_fd, readable):
            return False
        if self.listener in readable:
            conn, _ = self.listener.accept()
            with conn:
                request, fds = fork_loop.receive_once(conn)
            if request.get("stop"):
                return False
            if fds and "fork" in request:
                self._fork(request["fork"], fds[0])
            for fd in fds:
                os.close(fd)
        return True

    def _fork(self, request: dict[str, Any], listener_fd: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            inherited = [self.listener.fileno()]
            inherited += [self.owner_fd] if self.owner_fd is not None else []
            _platform_child(request, listener_fd, inherited, self.watch, self.findings)


def _platform_child(
    request: dict[str, Any],
    listener_fd: int,
    inherited: list[int],
    watch: neutral.Watch,
    findings: list[str],
) -> None:
    """A platform's parent, right after its fork from the root; never returns."""
    code = 70
    try:
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()
        _log_to(request.get("log"))
        platform = request["env"].get("KVRIG_EMULATE", "")
        seen = list(findings)
        if not seen:
            extra = neutral.PLATFORM_NEUTRAL.get(platform, ()) if request.get("extra") else ()
            missing = import_preload(tuple(extra))
            seen = [*watch.findings(), *(f"could not import {m}" for m in missing)]
        if seen:
            print(f"root parent: {platform}'s parent starts afresh: {'; '.join(seen)}",
                  file=sys.stderr, flush=True)  # fmt: skip
            _exec_platform_parent(request, listener_fd)
        watch.stop()
        os.environ.clear()
        os.environ.update(request["env"])
        listener = socket.socket(fileno=listener_fd)
        parent = PlatformParent(
            Path(request["listen"]), int(request["owner"]), tuple(request["arch_preload"]),
            listener=listener, forked_from=os.getppid(),
        )  # fmt: skip
        code = parent.run(tuple(request["preload"]))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _exec_platform_parent(request: dict[str, Any], listener_fd: int) -> None:
    """The platform's parent as an interpreter of its own, on the socket it was given."""
    os.set_inheritable(listener_fd, True)
    python = sys.executable
    args = [python, "-m", "kvrig.run.platform_parent", *platform_args(request, listener_fd)]
    os.execve(python, args, request["env"])


def platform_args(request: dict[str, Any], listener_fd: int) -> list[str]:
    return [
        f"--listen={request['listen']}", f"--listen-fd={listener_fd}",
        f"--owner={request['owner']}", f"--preload={','.join(request['preload'])}",
        f"--arch-preload={','.join(request['arch_preload'])}",
    ]  # fmt: skip


def _log_to(path: str | None) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 2)
        os.close(log)
    os.close(null)


def main(argv: list[str] | None = None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv))
    listener = socket.socket(fileno=int(args["--listen-fd"]))
    preload = tuple(m for m in args["--preload"].split(",") if m)
    code = RootParent(listener, Path(args["--listen"]), int(args["--owner"])).run(preload)
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
