"""Ends an engine's processes when the process that started them is gone.

The engine runs in child processes that outlive a parent killed by SIGKILL
(or by SIGTERM without a handler): vLLM's own cleanup never runs then. This
watchdog (`python -m ncp_local.engines.watchdog GRACE_S`) reads a pipe whose
only write end is in the parent. It ends the engine processes it was told
about (SIGTERM, `GRACE_S` for vLLM's own shutdown, then SIGKILL) when the
parent says `stop` (a clean close), when the pipe reads EOF (the parent is
gone), or when it is re-parented (the parent is gone, even if some process
still holds a copy of the write end). It reads `pid:create_time` pairs on its
first line, so a recycled pid is never hit. It imports nothing of the rig
beyond this module.

Fork safety: on CUDA vLLM forks its engine processes, and a forked child
inherits every fd of the parent, close-on-exec or not (there is no exec). A
second engine's processes would then hold the first engine's write end, and
the first watchdog would never read EOF. So the write ends are tracked here
and closed in every forked child (`os.register_at_fork`), and a clean close
sends `stop` instead of relying on EOF alone.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

MODULE = "ncp_local.engines.watchdog"  # run as `python -m`, in its own process
STOP = b"stop\n"

# This process's open watchdog pipe fds: each write end, and a read end until
# the watchdog has it. A forked child gets a copy of each; `_close_inherited_fds`
# closes them there. The lock is held across a fork (`_before_fork`), so a pipe
# is never forked between its creation and its registration here.
_PIPE_FDS: set[int] = set()
_FDS_LOCK = threading.RLock()


def _before_fork() -> None:
    _FDS_LOCK.acquire()


def _after_fork_in_parent() -> None:
    _FDS_LOCK.release()


def _close_inherited_fds() -> None:
    """In a forked child: close its copies of the parent's watchdog pipes.

    The child never uses them; holding a write end would keep that watchdog
    from reading EOF when the parent dies.
    """
    global _FDS_LOCK
    _FDS_LOCK = threading.RLock()  # the parent's is held (by `_before_fork`)
    for fd in tuple(_PIPE_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _PIPE_FDS.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_close_inherited_fds)


def open_pipe_fds() -> frozenset[int]:
    """The watchdog pipe fds this process holds (none in a forked child)."""
    with _FDS_LOCK:
        return frozenset(_PIPE_FDS)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close_tracked(fd: int, last: bytes = b"") -> None:
    """Write `last` to a tracked fd, then close it; nothing if it is not tracked
    (a forked child's copy of a Watchdog: closed there already, the number may be reused)."""
    with _FDS_LOCK:  # no fork in between: no child keeps an untracked copy
        if fd not in _PIPE_FDS:
            return
        _PIPE_FDS.discard(fd)
        try:
            if last:
                write_all(fd, last)
        except OSError:  # the watchdog is gone already
            pass
        finally:
            os.close(fd)


class Watchdog:
    """A running watchdog: its process and the write end of its pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int) -> None:
        self.proc = proc
        self._fd: int | None = write_fd

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pipe_fd(self) -> int | None:
        """The write end (None once stopped), for tests that look for stray copies."""
        return self._fd

    def _close_pipe(self, message: bytes) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _close_tracked(fd, message)

    def stop(self, timeout: float = 30.0) -> bool:
        """Tell the watchdog the engine closed cleanly and wait for it (blocking).

        It reaps whatever of the engine is left, then exits. True when it exited
        by itself within `timeout`; otherwise it is killed and False returned.
        """
        self._close_pipe(STOP)
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False


def start(procs: list[Any], grace_s: float = 10.0) -> Watchdog | None:
    """A watchdog for these processes (psutil.Process), or None when there are none."""
    if not procs:
        return None
    line = " ".join(f"{p.pid}:{p.create_time()!r}" for p in procs).encode() + b"\n"
    # os.pipe's fds are close-on-exec: the watchdog gets the read end as its
    # stdin only, later exec'd children get neither; forked ones are handled above.
    with _FDS_LOCK:
        read_fd, write_fd = os.pipe()
        _PIPE_FDS.update((read_fd, write_fd))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, str(grace_s)],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            # Its own session: a Ctrl-C aimed at the run must not kill the watchdog first.
            start_new_session=True,
        )
    except BaseException:
        _close_tracked(write_fd)
        raise
    finally:
        _close_tracked(read_fd)
    wd = Watchdog(proc, write_fd)
    write_all(write_fd, line)
    return wd


# ---- the watchdog process --------------------------------------------------


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _targets(line: bytes) -> list[psutil.Process]:
    targets = []
    for item in line.decode().split():
        pid, created = item.split(":")
        try:
            p = psutil.Process(int(pid))
            if abs(p.create_time() - float(created)) < 0.01:
                targets.append(p)
        except psutil.Error:
            pass
    return targets


def _first_line(fd: int) -> tuple[bytes, bytes]:
    """The first line from fd (raw reads: nothing sits in a buffer select cannot see), and the rest."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 4096)
        if not chunk:
            return buf, b""
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return line, rest


def _wait_for_end(fd: int, parent: int, buf: bytes) -> None:
    """Until the parent says stop, its pipe reads EOF, or the parent is gone."""
    while STOP.strip() not in buf:
        if os.getppid() != parent:
            return
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return
            buf += chunk


def _end(targets: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM what is left, `grace_s` for it to exit, then SIGKILL."""
    alive = [p for p in targets if _running(p)]
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_running(p) for p in alive):
        time.sleep(0.2)
    alive = [p for p in alive if _running(p)]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def main(grace_s: float) -> None:
    try:
        import setproctitle  # optional: a readable name in ps and top

        setproctitle.setproctitle("ncp-local::engine-watchdog")
    except ImportError:
        pass
    parent = os.getppid()
    fd = sys.stdin.fileno()
    line, rest = _first_line(fd)
    targets = _targets(line)
    _wait_for_end(fd, parent, rest)
    _end(targets, grace_s)


if __name__ == "__main__":
    main(float(sys.argv[1]))
