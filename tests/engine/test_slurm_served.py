"""`slurm/submit.py --serve auditor` on the one-node Slurm (scripts/start_slurm.sh; skipped when no
controller answers): a server job runs the embedded model on vLLM's server, a 2-task array starts
after it, each task reaches the server through the endpoint file in the run directory, and a last
job cancels the server when the array has ended. The merge equals a single-process run of the same
config against the same server.

Cheap on the node's 2 CPUs: the server takes 1 (its default), narrator and player are scripted (the
auditor is the only model, on the server), one turn of one spec per task.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import alive_after, free_port, small_overrides
from test_slurm import _line, _results, _run, _submit, _wait_for

OVERRIDES = (
    "narrator.engine=scripted",
    "player.engine=scripted",
    "max_turns=1",
    "limit=2",
    "progress=false",
    "seed=0",
    *small_overrides("auditor"),
)
SERVED = "smollm2-135m-instruct"  # the model file's name: what submit.py serves it as
WAIT_S = 900


def _server_pids(job: str) -> list[int]:
    """Processes of the server job (by the job id Slurm puts in their environment)."""
    import psutil

    pids = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SLURM_JOB_ID") == job:
                pids.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return pids


def _state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60)
    return next((w.split("=", 1)[1] for w in out.stdout.split() if w.startswith("JobState=")), "PURGED")


@pytest.mark.served
@pytest.mark.slow  # 138 s of CI's 25 minutes (2026-12-07); what shows it in make test: test-times.md
@pytest.mark.timeout(2700)
def test_a_served_auditor_for_a_two_task_array_equals_one_process(
    slurm: None, embedded_model_path: Path, tmp_path: Path
) -> None:
    cwd = tmp_path / "array"
    cwd.mkdir()
    sub = _submit(
        "--shards",
        "2",
        "--serve",
        "auditor",
        "--serve-gpus",
        "0",
        "--serve-port",
        str(free_port()),
        "--python",
        sys.executable,
        "--",
        *OVERRIDES,
        cwd=cwd,
    )
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_dir = Path(_line(sub.stdout, "run directory: ").split(": ", 1)[1])
    words = _line(sub.stdout, "submitted server job ").split()
    server, array = words[3], words[words.index("array") + 2].rstrip(":")
    stop = _line(sub.stdout, "the server is cancelled when the array ends").split("(job ")[1].rstrip(")")
    endpoint = run_dir / "endpoint-auditor"
    try:
        # The single-process run shares the server: the cancellation waits for it (held, then released).
        subprocess.run(["scontrol", "hold", stop], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + WAIT_S
        while not endpoint.exists():
            assert _state(server) in ("PENDING", "RUNNING"), "\n".join(
                p.read_text()[-3000:] for p in (run_dir / "slurm").glob("serve-*.out")
            )
            assert time.monotonic() < deadline, "the server job wrote no endpoint file in time"
            time.sleep(2)
        url = endpoint.read_text().strip()
        assert url.startswith("http://") and url.endswith("/v1"), url
        single = _run(
            *OVERRIDES,
            "auditor.engine=openai",
            f"auditor.endpoint.file={endpoint}",
            f"auditor.endpoint.model={SERVED}",
            f"out_dir={tmp_path / 'single'}",
            cwd=tmp_path,
        )
        assert single.returncode == 0, single.stderr[-3000:]
        _wait_for(array, time.monotonic() + WAIT_S)
        subprocess.run(["scontrol", "release", stop], check=True, capture_output=True, timeout=60)
        _wait_for(stop, time.monotonic() + 120)
        _wait_for(server, time.monotonic() + 120)

        logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted((run_dir / "slurm").glob("*.out")))
        for i in range(2):
            assert (run_dir / f"shard-{i:03d}-of-002" / "DONE").exists(), logs
            manifest = json.loads((run_dir / f"shard-{i:03d}-of-002" / "manifest.json").read_text())
            # Each task reached the server through the endpoint file (the node's address, the port asked for).
            assert manifest["models"]["auditor"]["engine"] == "openai", manifest["models"]
            assert manifest["models"]["auditor"]["endpoint"]["base_url"] == url
        assert logs.count("exit 0") == 2, logs
        # The server was cancelled by the last job, its endpoint file removed, none of its processes left.
        assert not endpoint.exists(), logs
        assert "ncp: serving at http://" in logs, logs
        assert not alive_after(_server_pids(server), timeout=30), "server processes left after the cancellation"

        merged = _run(
            *OVERRIDES,
            "auditor.engine=openai",
            f"auditor.endpoint.model={SERVED}",
            "mode=merge",
            f"out_dir={run_dir}",
            cwd=cwd,
        )
        assert merged.returncode == 0, merged.stderr
        assert _results(run_dir / "merged") == _results(tmp_path / "single")
        assert len(_results(run_dir / "merged")) == 2
    finally:
        subprocess.run(["scancel", stop, array, server], capture_output=True, timeout=60)
        for pid in alive_after(_server_pids(server), timeout=30):
            subprocess.run(["kill", "-9", str(pid)], capture_output=True, timeout=10)
