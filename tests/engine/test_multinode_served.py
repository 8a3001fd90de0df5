"""vLLM's own multi-node mode, run for real: slurm/serve.sbatch serving the embedded model over two nodes
(pipeline parallel, a stage a node: node rank 0 serving HTTP, node rank 1 `--headless`), the two nodes
played by this machine (NCP_LOCAL_NODES=1: each node's command runs here in a session of its own, bound
to a core of its own, where a cluster runs a job step on each node), through the rig's entry into vLLM's
serve (ncp_local/engines/vllm_serve.py) and the server arguments `slurm/submit.py --serve` writes.

The rig plays the reference episode against it with every role served; the head's node dies (SIGKILL
to its session) once turn 0 is committed: every process of the worker's node is gone within 10 s (not
only its top process), the rig ends with the engine's exit code and one line; a new server, the same
command, and the results equal the all-in-process run's. Then SIGTERM to the job (Slurm's preemption):
every process ends within the job's grace, nothing is left listening. Slow (two server starts of about
2 minutes each on 2 cores, beside the session's reference sweep): docs/measurements/2026-12-04-multinode.md
and 2026-12-05-worker-tree.md have what it measured.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import FITS, ReferenceSweep, free_port
from ncp_local.exits import EXIT_ENGINE_DEAD, EXIT_SIGNAL
from ncp_local.launch.slurm import script_env
from served import KV_CACHE_BYTES, SERVED_NAME, START_TIMEOUT_S
from test_mixed_engines import _cmd, _opened, _remote, _results

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 20  # slurm/serve.sbatch's NCP_STOP_GRACE_S default
# The head's node killed: every process of the worker's node gone within this (the serving guide's bound;
# measured 6 to 7 s: docs/measurements/2026-12-05-worker-tree.md).
WORKER_GONE_S = 10


class TwoNodeServer:
    """slurm/serve.sbatch over two stand-in nodes on this machine."""

    def __init__(self, model_path: Path, work: Path) -> None:
        from omegaconf import OmegaConf

        from ncp_local import config as config_mod
        from ncp_local.engines.serve import serve_args, serve_env
        from ncp_local.engines.vllm_args import engine_config

        raw = OmegaConf.to_container(config_mod.compose([]), resolve=True)
        model = engine_config(config_mod.validate(raw).auditor.model)  # type: ignore[arg-type]
        model = model.model_copy(update={"kv_cache_memory_bytes": KV_CACHE_BYTES})
        self.port, self.master_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.work = work
        self.endpoint = work / "endpoint"
        args = serve_args(
            model,
            model_path,
            served_name=SERVED_NAME,
            host="127.0.0.1",
            port=self.port,
            on_cpu=True,
            pipeline_parallel=2,
        )
        (work / "serve.args").write_text("\n".join(args) + "\n")
        self.env = dict(
            os.environ,
            **serve_env(model, on_cpu=True),
            **script_env(),
            VLLM_HOST_IP="127.0.0.1",
            NCP_VLLM=f"{sys.executable} -m ncp_local.engines.vllm_serve",
            NCP_SERVE_ARGS=str(work / "serve.args"),
            NCP_ENDPOINT_FILE=str(self.endpoint),
            NCP_SERVE_PORT=str(self.port),
            NCP_MASTER_PORT=str(self.master_port),
            NCP_NODES="127.0.0.1 127.0.0.1",
            NCP_LOCAL_NODES="1",
            NCP_NODE_CPUS="0 1",
            NCP_SERVE_WAIT_S=str(START_TIMEOUT_S),
        )
        self.job: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> float:
        """The job started and serving (its endpoint file written): the seconds it took."""
        self.starts += 1
        self.log = self.work / f"job-{self.starts}.log"
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self.job = subprocess.Popen(
                ["bash", str(ROOT / "slurm" / "serve.sbatch")],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        while not self.endpoint.exists():
            assert self.job.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() - t0 < START_TIMEOUT_S + 60, self.log.read_text()[-3000:]
            time.sleep(0.5)
        return time.monotonic() - t0

    def nodes(self) -> tuple[int, int]:
        """The pids of node rank 0's and node rank 1's server (each its own session's leader)."""
        import psutil

        assert self.job is not None
        ranks = {}
        for child in psutil.Process(self.job.pid).children():
            line = child.cmdline()
            ranks[int(line[line.index("--node-rank") + 1])] = child.pid
        return ranks[0], ranks[1]

    def cleanup(self) -> None:
        """Whatever a failed test left: every process of the job's sessions."""
        if self.job is None:
            return
        import psutil

        left = []
        try:
            left = [self.job.pid, *(p.pid for p in psutil.Process(self.job.pid).children())]
        except psutil.NoSuchProcess:
            pass
        for pid in left:
            for kill in (os.killpg, os.kill):  # its session, else the process alone
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.job.wait(30)


def _tree_gone_within(tree: list, limit_s: float) -> tuple[dict[str, float], list[str]]:
    """When each process of `tree` (psutil.Process objects) ended, in seconds from now ("name pid": s;
    a zombie has ended), and the processes still running after limit_s (pid, name, command line)."""
    from ncp_local.engines.process_tree import left, living

    names = {p.pid: f"{left(p).name} {p.pid}" for p in tree}
    ends: dict[str, float] = {}
    t0 = time.monotonic()
    while True:
        alive = living(tree)
        now = round(time.monotonic() - t0, 1)
        ends.update({names[p.pid]: now for p in tree if p not in alive and names[p.pid] not in ends})
        if not alive:
            return ends, []
        if now > limit_s:
            return ends, [str(left(p)) for p in alive]
        time.sleep(0.1)


def _tree(pids: tuple[int, ...]) -> list:
    """Each process and every process below it, as psutil.Process objects (which know a reused pid)."""
    import psutil

    procs = [psutil.Process(pid) for pid in pids]
    return [*procs, *(c for p in procs for c in p.children(recursive=True))]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.served
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_node_pipeline_server_plays_resumes_and_stops_cleanly(
    embedded_model_path: Path, reference_sweep: ReferenceSweep, tmp_path: Path
) -> None:
    expected = {f"{FITS}.json": _results(reference_sweep.point("baseline"))[f"{FITS}.json"]}
    server = TwoNodeServer(embedded_model_path, tmp_path)
    run = tmp_path / "run"
    try:
        started_s = server.start()
        head, worker = server.nodes()
        proc = subprocess.Popen(
            _cmd(reference_sweep.dataset, run, *_remote(server.url, ("narrator", "player", "auditor"))),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 900
        while not _opened(run):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        worker_tree = _tree((worker,))  # its supervisor, vLLM's worker, its stage's process, vLLM's helpers
        os.killpg(head, signal.SIGKILL)  # the head's node is gone
        # Every process of the worker's node gone within the bound, not only its top process.
        worker_ends, left = _tree_gone_within(worker_tree, WORKER_GONE_S)
        assert not left, f"left after {WORKER_GONE_S} s: {left}\n" + server.log.read_text()[-3000:]
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == EXIT_ENGINE_DEAD, err[-3000:]
        (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
        assert line.startswith("error: engine died: endpoint ") and line.endswith("re-run the same command to resume")
        server.job.wait(GRACE_S + 10)  # type: ignore[union-attr]
        assert not server.endpoint.exists() and not _listening(server.port) and not _listening(server.master_port)

        again_s = server.start()
        resumed = subprocess.run(
            _cmd(reference_sweep.dataset, run, *_remote(server.url, ("narrator", "player", "auditor"))),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _results(run) == expected

        # Slurm's preemption: SIGTERM to the job; every process gone within its grace, nothing listening.
        tree = _tree(server.nodes())
        t0 = time.monotonic()
        server.job.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.job.wait(GRACE_S + 10) == EXIT_SIGNAL["SIGTERM"]  # type: ignore[union-attr]
        stop_s = time.monotonic() - t0
        _, left = _tree_gone_within(tree, 0)
        assert not left, f"left after the job's stop: {left}"
        assert not _listening(server.port) and not _listening(server.master_port)
        manifest = json.loads((run / "manifest.json").read_text())
        assert len(manifest["resumes"]) == 1
        print(
            f"started in {started_s:.0f} s and {again_s:.0f} s; the worker's processes gone after its head's: "
            f"{', '.join(f'{k} {v} s' for k, v in worker_ends.items())}; "
            f"stopped by SIGTERM in {stop_s:.1f} s"
        )
    finally:
        server.cleanup()
