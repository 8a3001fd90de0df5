"""A serving node's own conduct (ncp_local/engines/vllm_serve.py), with fake processes and dry runs:
every headless worker (vLLM's multi-node mode and its multi-node data parallel) runs under a supervisor
that watches its head and, when the head is lost, the job stops it, or the worker ends, ends the
worker's whole process tree before it exits itself; and the CPU build's thread binding is made by the
entry on the node that serves, from that process's own cores, not by the submitter.
The same on the real two-node server: tests/engine/test_multinode_served.py (slow)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from ncp_local.engines import vllm_serve
from ncp_local.engines.cpu_binding import THREADS_BIND
from ncp_local.engines.serve import serve_env
from ncp_local.engines.settings import ModelSettings
from ncp_local.engines.vllm_process import engine_env
from ncp_local.exits import EXIT_ENGINE_DEAD, EXIT_SIGNAL
from test_slurm_serve import _sbatch

ROOT = Path(__file__).resolve().parent.parent

# A worker's tree as vLLM's can be: a top process that ends at once on SIGTERM, a stage process that
# ignores SIGTERM (busy, or already past its handler), and a helper nobody signals (vLLM's resource
# tracker); the top writes the three pids, then waits (or, with `exit`, ends by itself at once).
FAKE_WORKER = """
import os, signal, subprocess, sys, time
sleep = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
stage = subprocess.Popen(sleep)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(0.5)  # both past their start (the stage's SIGTERM ignored)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {stage.pid} {helper.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
if sys.argv[2:] == ["exit"]:
    sys.exit(7)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(600)
"""
# The supervisor as the entry runs it, with a fake worker for vLLM and a short grace.
SUPERVISOR = """
import sys
from ncp_local.engines import vllm_serve
vllm_serve.POLL_S = 0.2
head = vllm_serve.Head("127.0.0.1", (int(sys.argv[1]),))
sys.exit(vllm_serve.supervise(head, [sys.executable, sys.argv[2], *sys.argv[3:]], grace_s=1.0))
"""


class FakeHead:
    """A port that answers (the head's HTTP server) until closed (the head's node gone)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)  # never accepted: the kernel completes each probe's connection
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def _supervised(tmp_path: Path, head: FakeHead, *worker_args: str) -> tuple[subprocess.Popen[str], list[int]]:
    """The supervisor started over the fake worker, and the worker tree's pids once it is up."""
    fake = tmp_path / "worker.py"
    fake.write_text(FAKE_WORKER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(head.port), str(fake), str(pids_file), *worker_args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not pids_file.exists():
        assert sup.poll() is None and time.monotonic() < deadline, sup.stderr.read() if sup.stderr else ""
        time.sleep(0.05)
    return sup, [int(p) for p in pids_file.read_text().split()]


def _running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _ended(sup: subprocess.Popen[str], pids: list[int]) -> tuple[int, str, float]:
    """The supervisor's exit code and log once it has ended (and how long that took): at that moment,
    no process of its worker's tree may be running."""
    t0 = time.monotonic()
    try:
        _, err = sup.communicate(timeout=30)
    finally:
        for pid in _running(pids):  # a failure leaves nothing behind
            os.kill(pid, signal.SIGKILL)
    assert not _running(pids), f"the supervisor ended before its tree: {_running(pids)} still running"
    return sup.returncode, err, time.monotonic() - t0


def test_a_lost_head_ends_the_whole_worker_tree_before_the_supervisor(tmp_path: Path) -> None:
    head = FakeHead()
    sup, pids = _supervised(tmp_path, head)
    time.sleep(0.5)  # the head has answered
    assert sup.poll() is None and len(_running(pids)) == 3
    head.close()
    code, err, took = _ended(sup, pids)
    assert code == EXIT_ENGINE_DEAD, err
    assert "ncp: the head at 127.0.0.1 is gone; this worker stops" in err
    # The stage ignored SIGTERM, and the helper was never signalled: both killed after the grace, by name.
    (killed,) = [line for line in err.splitlines() if line.startswith("ncp: still running")]
    assert sorted(int(p) for p in re.findall(r"(?:: |; )(\d+) ", killed)) == sorted(pids[1:])
    assert took < 10  # two refused polls, the grace (1 s here), the kill


def test_the_jobs_sigterm_ends_the_whole_worker_tree_within_the_grace(tmp_path: Path) -> None:
    head = FakeHead()
    sup, pids = _supervised(tmp_path, head)
    sup.send_signal(signal.SIGTERM)
    code, err, took = _ended(sup, pids)
    assert code == EXIT_SIGNAL["SIGTERM"], err
    assert "is gone" not in err and "ncp: still running 1 s after the stop, killed: " in err
    assert took < 8
    head.close()


def test_a_worker_that_ends_by_itself_leaves_no_orphan(tmp_path: Path) -> None:
    """Its children outlive it (re-parented to the supervisor, the subreaper): ended too; its own code kept."""
    head = FakeHead()
    sup, pids = _supervised(tmp_path, head, "exit")
    code, err, _ = _ended(sup, pids)
    assert code == 7, err
    head.close()


def test_every_headless_worker_watches_its_head_data_parallel_included(tmp_path: Path) -> None:
    """The command lines serve.sbatch writes: the multi-node pipeline's second node and data parallel's
    second replica are supervised workers, each watching the head's ports that stay open while it
    serves; the heads (and a one-node server) are not."""

    def head_of(across: str, rank: int) -> vllm_serve.Head | None:
        line = shlex.split(_sbatch(tmp_path, across)[rank])
        return vllm_serve.worker_head(line[line.index("ncp_local.engines.vllm_serve") + 1 :])

    assert head_of("pipeline", 1) == vllm_serve.Head("gpu-a", (29501, 8000))
    # Data parallel: its HTTP server only (the RPC port is the start-up handshake, closed once all joined).
    assert head_of("data", 1) == vllm_serve.Head("gpu-a", (8000,))
    assert head_of("pipeline", 0) is None and head_of("data", 0) is None
    assert vllm_serve.worker_head(["/m", "--headless", "-dpr", "2", "-dpa", "10.0.0.1", "--port", "9"]) == (
        vllm_serve.Head("10.0.0.1", (9,))
    )
    assert vllm_serve.worker_head(["/m", "--port", "9"]) is None


def test_the_entry_leaves_the_nodes_environment_alone() -> None:
    """The in-process engine's module sets VLLM_HOST_IP to loopback when imported; the entry must not
    take it (a multi-node server's nodes would advertise 127.0.0.1 to each other)."""
    probe = "import os, ncp_local.engines.vllm_serve as m; print(os.environ.get('VLLM_HOST_IP'))"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "None"


def test_the_entry_puts_a_headless_worker_under_its_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["/m", "--headless", "--data-parallel-start-rank", "1", "--data-parallel-address", "gpu-a"]
    calls: list[tuple[vllm_serve.Head, list[str]]] = []

    def supervise(head: vllm_serve.Head, command: list[str], **_: Any) -> int:
        calls.append((head, command))
        return EXIT_ENGINE_DEAD

    monkeypatch.setattr(vllm_serve, "supervise", supervise)
    monkeypatch.delenv(vllm_serve.SUPERVISED, raising=False)
    with pytest.raises(SystemExit) as stopped:
        vllm_serve.main(argv)
    assert stopped.value.code == EXIT_ENGINE_DEAD
    # The worker itself: the same entry, the same arguments; it knows it is supervised by its environment.
    assert calls == [(vllm_serve.Head("gpu-a", (8000,)), [sys.executable, "-m", "ncp_local.engines.vllm_serve", *argv])]


def test_the_submitter_sends_no_thread_binding_the_node_makes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The submitting machine's cores say nothing of the node's: the server's environment leaves the
    binding out, where the in-process engine (which runs where it starts) still makes it."""
    two = ModelSettings(name="m", path="/m", tensor_parallel_size=2)
    monkeypatch.delenv(THREADS_BIND, raising=False)
    assert THREADS_BIND in engine_env(two, on_cpu=True)
    assert THREADS_BIND not in serve_env(two, on_cpu=True)


@pytest.mark.engine_libs
@pytest.mark.parametrize(
    ("flags", "bind"),
    [
        (["--tensor-parallel-size", "2"], "4,5|6,7"),
        # Data parallel across nodes: this node's replica, tensor parallel 2.
        (["--tensor-parallel-size", "2", "--data-parallel-size", "2", "--data-parallel-size-local", "1"], "4,5|6,7"),
        # vLLM's multi-node pipeline parallel: one stage a node, one worker here (vLLM binds it).
        (["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--headless"], None),
        (["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--nnodes", "2"], "4,5|6,7"),
    ],
)
def test_the_thread_binding_is_made_on_the_serving_node(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], bind: str | None
) -> None:
    """The entry, as it runs on the node (its workers not yet spawned), binds from its own cores."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the thread binding is the CPU build's")
    seen: list[str | None] = []
    monkeypatch.setattr(ServeSubcommand, "validate", lambda self, args: None)
    monkeypatch.setattr(ServeSubcommand, "cmd", staticmethod(lambda args: seen.append(os.environ.get(THREADS_BIND))))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 6, 5, 4})  # the node's cores
    monkeypatch.setenv(vllm_serve.SUPERVISED, "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.setenv(THREADS_BIND, "unset")
    monkeypatch.delenv(THREADS_BIND)
    vllm_serve.main(["/models/m", *flags])
    assert seen == [bind]
    # A binding given to the node (the job script's stand-in nodes) is kept.
    monkeypatch.setenv(THREADS_BIND, "1")
    vllm_serve.main(["/models/m", *flags])
    assert seen[-1] == "1"
