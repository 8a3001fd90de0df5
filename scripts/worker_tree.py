"""When does each process of a headless worker's tree end once its head's node is gone?

Drives the two-node set-up of tests/engine/test_multinode_served.py (slurm/serve.sbatch, vLLM's
multi-node pipeline parallel, the two nodes played by this machine) `--runs` times: start the job,
keep the server busy with completions, SIGKILL node rank 0's whole session (its node gone), then poll
every process of node rank 1's tree (its top process, the `VLLM::Worker_PP1` stage worker, vLLM's
helpers) and the job script, and print when each ended, in seconds after the kill (`-`: still alive
after `--watch-s`). One JSON line a run goes to `--out` as well. `--kill-job` kills the job script
with the head, so that only the worker's own watch of its head stops it.

    .venv/bin/python scripts/worker_tree.py --runs 5 --out /tmp/tree.jsonl

Slow: a server start is about 2 minutes on 2 busy cores. Needs the embedded model (make model).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "engine"), str(ROOT / "tests"), str(ROOT)]


def _busy(url: str, name: str, stop: threading.Event) -> None:
    """Completions one after another until `stop` (or the server is gone): the stages have work in flight."""
    body = json.dumps({"model": name, "prompt": "Once upon a time", "max_tokens": 64}).encode()
    while not stop.is_set():
        req = urllib.request.Request(f"{url}/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
        except OSError:
            return


def one_run(model: Path, work: Path, watch_s: float, kill_job: bool = False) -> dict:
    import psutil

    from served import SERVED_NAME
    from test_multinode_served import TwoNodeServer

    server = TwoNodeServer(model, work)
    try:
        started_s = server.start()
        head, worker = server.nodes()
        top = psutil.Process(worker)
        tree = [top, *top.children(recursive=True)]
        procs = {p.pid: {"name": p.name(), "cmdline": " ".join(p.cmdline())[:120], "end_s": None} for p in tree}
        stop = threading.Event()
        load = [threading.Thread(target=_busy, args=(server.url, SERVED_NAME, stop), daemon=True) for _ in range(2)]
        for t in load:
            t.start()
        time.sleep(3)  # requests in flight through both stages
        t0 = time.monotonic()
        assert server.job is not None
        if kill_job:  # the job script gone first: only the worker's own watch of its head is left to stop it
            server.job.kill()
        os.killpg(head, signal.SIGKILL)
        stop.set()
        job_s = None
        while time.monotonic() - t0 < watch_s:
            now = round(time.monotonic() - t0, 2)
            for p in tree:
                rec = procs[p.pid]
                if rec["end_s"] is None:
                    try:
                        gone = p.status() == psutil.STATUS_ZOMBIE
                    except psutil.NoSuchProcess:
                        gone = True
                    if gone:
                        rec["end_s"] = now
            if job_s is None and server.job.poll() is not None:
                job_s = now
            if job_s is not None and all(r["end_s"] is not None for r in procs.values()):
                break
            time.sleep(0.05)
        return {"started_s": round(started_s), "job_exit_s": job_s, "processes": procs, "log": str(server.log)}
    finally:
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--watch-s", type=float, default=60.0, help="how long to watch after the kill")
    parser.add_argument("--out", type=Path, help="append one JSON line a run here")
    parser.add_argument("--kill-job", action="store_true", help="SIGKILL the job script with the head")
    args = parser.parse_args()
    from ncp_local.engines.embedded import ensure_embedded_model

    model = ensure_embedded_model()
    base = Path(tempfile.mkdtemp(prefix="worker-tree-"))
    for i in range(1, args.runs + 1):
        work = base / f"run-{i}"
        work.mkdir()
        row = one_run(model, work, args.watch_s, args.kill_job)
        ends = ", ".join(
            f"{r['name']} ({pid}) {'-' if r['end_s'] is None else r['end_s']}" for pid, r in row["processes"].items()
        )
        print(f"run {i}: started in {row['started_s']} s; after the kill: {ends}; job {row['job_exit_s']}", flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps({"run": i, **row}) + "\n")


if __name__ == "__main__":
    main()
