"""Parent death, on a helper process with an engine.

No engine process outlives a parent killed with SIGKILL: vLLM's own cleanup never runs then, the
backend's watchdog must end the engine. (Engine death, a core killed under a live parent, is in
test_fork_and_env, on its two engines; a clean `close()` is checked by the session fixture's
teardown; Ctrl-C runs vLLM's own finalizers.)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import alive_after

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class _Lines:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.buf = b""

    def wait_for(self, marker: bytes, timeout: float) -> str:
        """The rest of the next stdout line that starts with `marker`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            *lines, rest = self.buf.split(b"\n")
            for i, line in enumerate(lines):
                if line.startswith(marker):
                    self.buf = b"\n".join(lines[i + 1 :] + [rest])
                    return line[len(marker) :].decode()
            self.buf = rest
            if self.proc.poll() is not None:
                raise AssertionError(f"engine child exited early with {self.proc.returncode}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                self.buf += os.read(self.proc.stdout.fileno(), 65536)
        raise AssertionError(f"no {marker!r} from the engine child after {timeout}s")


@pytest.mark.engine
def test_no_engine_process_outlives_a_killed_parent(embedded_model_path: Path, tmp_path: Path) -> None:
    log = open(tmp_path / "child.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_engine_child.py"), str(embedded_model_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=str(ROOT),
        start_new_session=True,
    )
    out = _Lines(proc)
    pids: list[int] = []
    try:
        info = json.loads(out.wait_for(b"ENGINE-CHILD-READY ", timeout=400))
        pids = info["engine"]
        assert len(pids) >= 2, info  # engine core + worker
        assert sorted(alive_after(pids, timeout=0)) == sorted(pids)

        # The parent dies without any cleanup: the engine must not be left running.
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        left = alive_after(pids, timeout=30)
        assert not left, f"engine processes outlived a SIGKILLed parent: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in alive_after(pids, timeout=0):  # whatever failed, leave nothing behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
