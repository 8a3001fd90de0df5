"""Every process below this one, ended as a whole: what a serving node's top process does before it
exits, so that its exit means the node has nothing left running (engines/vllm_serve.py).

vLLM's processes outlive the one that started them: measured on the two-node set-up, 5 kill runs, a
headless worker's stage process (`VLLM::Worker_PP1`) ended up to 0.9 s after the node's top process
in 4 of them (docs/measurements/2026-12-05-worker-tree.md); a worker left behind on a GPU node holds
its memory.
So the top process becomes the subreaper of its tree (an orphan is re-parented to it, not to init, and
stays in its `children`), waits for the tree to end, kills what is left after a grace, and waits again.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from dataclasses import dataclass

import psutil  # a vLLM dependency

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
KILL_WAIT_S = 5.0  # after SIGKILL: how long the kernel gets to end what was killed
_POLL_S = 0.1


@dataclass(frozen=True)
class Left:
    """A process still running after the grace (killed then): what a log line or a test names."""

    pid: int
    name: str
    cmdline: str

    def __str__(self) -> str:
        return f"{self.pid} {self.name} ({self.cmdline})"


def become_subreaper() -> bool:
    """Orphans of this process's tree are re-parented to it (Linux; False where the call is not there)."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def left(proc: psutil.Process) -> Left:
    try:
        return Left(proc.pid, proc.name(), " ".join(proc.cmdline()).strip()[:160])  # a set title is padded
    except psutil.Error:
        return Left(proc.pid, "?", "?")


def living(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes among `procs` still running (a zombie has ended: only its exit status is left)."""
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running: not a reused pid
                alive.append(p)
    return alive


def _reap(keep: int) -> None:
    """Collect the exit status of this process's ended children, but `keep`'s (its Popen collects that)."""
    for p in psutil.Process().children():
        if p.pid != keep:
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)


def descendants(known: dict[int, psutil.Process]) -> list[psutil.Process]:
    """This process's tree now, added to `known` (which keeps a process whose parent ended before it
    was re-parented here, where no subreaper is to be had)."""
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            known.setdefault(p.pid, p)
    return list(known.values())


def end_tree(child: subprocess.Popen[bytes], grace_s: float, known: dict[int, psutil.Process]) -> list[Left]:
    """Wait up to `grace_s` for `child` and every other process of this one's tree (and of `known`, the
    tree as last seen) to end, then SIGKILL what is left and wait for it (KILL_WAIT_S at most): the
    processes that had to be killed."""
    deadline = time.monotonic() + grace_s
    while True:
        child.poll()
        _reap(child.pid)
        alive = living(descendants(known))
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    killed = [left(p) for p in alive]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + KILL_WAIT_S
    while alive and time.monotonic() < deadline:
        child.poll()
        _reap(child.pid)
        alive = living(alive)
        time.sleep(_POLL_S)
    child.poll()
    return killed
