"""Ends an engine's processes when the process that started them is gone.

The engine runs in child processes that outlive a parent killed by SIGKILL
(or by SIGTERM without a handler): vLLM's own cleanup never runs then. This
watchdog (`python -m ncp_local.engines.watchdog GRACE_S`) holds the read end
of a pipe whose only write end is in the parent; when the parent is gone the
pipe reads EOF (or the watchdog is re-parented) and it ends the engine
processes it was told about: SIGTERM, `GRACE_S` for vLLM's own shutdown, then
SIGKILL. It reads `pid:create_time` pairs on its first line, so a recycled
pid is never hit. It imports nothing of the rig beyond this module.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

MODULE = "ncp_local.engines.watchdog"  # run as `python -m`, in its own process


def start(procs: list[Any], grace_s: float = 10.0) -> subprocess.Popen[bytes] | None:
    """A watchdog for these processes (psutil.Process), or None when there are none."""
    if not procs:
        return None
    wd = subprocess.Popen(
        [sys.executable, "-m", MODULE, str(grace_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        # Its own session: a Ctrl-C aimed at the run must not kill the watchdog first.
        start_new_session=True,
    )
    assert wd.stdin is not None
    wd.stdin.write(" ".join(f"{p.pid}:{p.create_time()!r}" for p in procs).encode() + b"\n")
    wd.stdin.flush()
    return wd


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _targets(line: str) -> list[psutil.Process]:
    targets = []
    for item in line.split():
        pid, created = item.split(":")
        try:
            p = psutil.Process(int(pid))
            if abs(p.create_time() - float(created)) < 0.01:
                targets.append(p)
        except psutil.Error:
            pass
    return targets


def main(grace_s: float) -> None:
    try:
        import setproctitle  # optional: a readable name in ps and top

        setproctitle.setproctitle("ncp-local::engine-watchdog")
    except ImportError:
        pass
    parent = os.getppid()
    targets = _targets(sys.stdin.readline())
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        if os.getppid() != parent:
            break
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


if __name__ == "__main__":
    main(float(sys.argv[1]))
