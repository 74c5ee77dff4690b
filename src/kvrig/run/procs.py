"""Processes of a cell, through psutil: its session, their memory, and killing them all.

A cell runs in a session of its own, so every process it started (vLLM's engine core
and workers, a leaked child that was re-parented) is found by its session id, not by
walking parent links that a re-parented orphan has lost.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator

import psutil

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError)


def _live(procs: Iterable[psutil.Process]) -> Iterator[psutil.Process]:
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                yield proc
        except _GONE:
            continue


def session_pids(sid: int) -> list[int]:
    pids = []
    for proc in _live(psutil.process_iter()):
        try:
            if os.getsid(proc.pid) == sid:
                pids.append(proc.pid)
        except OSError:
            continue
    return pids


def tree_pids(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [p.pid for p in _live([root, *root.children(recursive=True)])]
    except _GONE:
        return []


def alive(pid: int) -> bool:
    """Running (or sleeping), not gone and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False


def with_env(name: str, value: str) -> list[int]:
    """Live processes (other than this one) whose environment has name=value."""
    found = []
    for proc in _live(psutil.process_iter()):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(name) == value:
                found.append(proc.pid)
        except _GONE:
            continue
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session, until none is left (bounded)."""
    for _ in range(50):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(*_GONE):
                psutil.Process(pid).kill()
        time.sleep(0.1)


def rss_mb(pids: Iterable[int]) -> float:
    """Resident memory summed (pages shared by forked processes count once per process,
    which errs on the safe side for a memory ceiling)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(*_GONE):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def pss_mb(pids: Iterable[int]) -> float:
    """Proportional memory: a page shared by n processes counts 1/n in each."""
    total = 0
    for pid in pids:
        with contextlib.suppress(*_GONE):
            total += psutil.Process(pid).memory_full_info().pss
    return total / 2**20


def thread_count(pid: int | None = None) -> int:
    try:
        return psutil.Process(pid).num_threads()
    except _GONE:
        return 1
