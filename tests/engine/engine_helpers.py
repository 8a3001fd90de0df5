"""Small helpers shared by the engine tests."""

from __future__ import annotations

import socket


def alive_after(pids: list[int], timeout: float) -> list[int]:
    """Pids still running once `timeout` has passed (zombies count as gone)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    still = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                still.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return still


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
