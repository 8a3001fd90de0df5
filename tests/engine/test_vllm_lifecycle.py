"""Engine death and parent death, on a helper process with two engines.

- An engine whose process dies makes `generate` raise EngineDead (not hang).
- No engine process outlives a parent killed with SIGKILL: vLLM's own
  cleanup never runs then, the backend's watchdog must end the engine.
  (A clean `close()` is checked by the session fixture's teardown; Ctrl-C
  runs vLLM's own finalizers.)
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
def test_engine_death_and_parent_death(embedded_model_path: Path, tmp_path: Path) -> None:
    log = open(tmp_path / "child.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_engine_child.py"), str(embedded_model_path)],
        stdin=subprocess.PIPE,
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
        a, b = info["a"], info["b"]
        pids = a + b
        assert len(a) >= 2 and len(b) >= 2, info  # engine core + worker each
        assert sorted(alive_after(pids, timeout=0)) == sorted(pids)

        # Engine B's core dies (as under the OOM killer): its next request fails fast.
        os.kill(b[0], signal.SIGKILL)
        proc.stdin.write(b"generate\n")
        proc.stdin.flush()
        result = out.wait_for(b"ENGINE-CHILD-RESULT ", timeout=90)
        assert result.startswith("EngineDead"), result

        # The parent dies without any cleanup: engine A must not be left running.
        assert sorted(alive_after(a, timeout=0)) == sorted(a), "engine A should still be up"
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
