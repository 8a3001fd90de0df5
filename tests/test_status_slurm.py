"""`mode=status` on a real 3-shard array job of the local Slurm cluster: one task SIGKILLed, one
SIGSTOPped; then the stopped one resumed and the killed one re-submitted (skipped without a controller)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cli_runner import CliResult, run_cli
from test_slurm import _line, _submit, _wait_for

OVERRIDES = (
    "engine=scripted",
    "engine.delay_s=0.1",
    "limit=6",
    "concurrency=1",
    "max_turns=10",
    "progress=false",
    "status.heartbeat_s=1",
)
FLOOR = "status.stall_floor_s=4"  # the turns here take about a second: the floor decides


def _run_args(dataset: Path) -> tuple[str, ...]:
    return ("dataset=ncp_bench", f"dataset.path={dataset}", *OVERRIDES)


def _status(cwd: Path, run_dir: Path, *extra: str) -> CliResult:
    out = run_cli("mode=status", f"runs=[{run_dir}]", FLOOR, *extra, cwd=cwd)
    assert out.returncode == 0, out.stderr
    print(out.stdout)  # the must-show outputs (docs/measurements/2026-12-05-run-status.md)
    return out


def _rows(cwd: Path, run_dir: Path) -> list[dict]:
    return json.loads(_status(cwd, run_dir, "status.format=json").stdout)["rows"]


def _beat(shard: Path) -> dict:
    try:
        return json.loads((shard / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _until(what, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.5)
    pytest.fail("timed out")


@pytest.mark.timeout(300)
def test_status_of_an_array_with_a_killed_and_a_stopped_task(
    slurm: None, official_dataset: Path, tmp_path: Path
) -> None:
    args = _run_args(official_dataset)
    sub = _submit("--shards", "3", "--python", sys.executable, "--", *args, cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_dir = Path(_line(sub.stdout, "run directory: ").split(": ", 1)[1])
    job = _line(sub.stdout, "submitted job ").split()[2].rstrip(":")
    shards = [run_dir / f"shard-{i:03d}-of-003" for i in range(3)]
    pids: dict[int, int] = {}
    try:
        # Task 0 is SIGKILLed at its first committed turn, task 1 SIGSTOPped at its; task 2 runs when a CPU is
        # free (the node has two, shared with whatever else runs on the cluster: it may wait in the queue).
        for i, sig in ((0, signal.SIGKILL), (1, signal.SIGSTOP)):
            beat = _until(lambda i=i: (b := _beat(shards[i])).get("turns_committed", 0) >= 1 and b, 120)
            assert beat["slurm"] == {"job_id": beat["slurm"]["job_id"], "array_job_id": job, "array_task_id": str(i)}
            pids[i] = beat["pid"]
            if i == 1:  # running, with an ETA and Slurm's word, before it is stopped
                row = _rows(tmp_path, run_dir)[1]
                assert row["state"] == "running" and row["eta_s"] is not None and row["slurm"]["state"] == "RUNNING"
            os.kill(pids[i], sig)
        # On this host /proc says stopped at once; on another node only the stall threshold says it.
        rows = _until(lambda: (r := _rows(tmp_path, run_dir))[1]["state"] in ("stopped", "stalled") and r, 60)
        assert rows[1]["slurm"]["state"] == "RUNNING"
        if rows[1]["state"] == "stopped":
            assert rows[1]["next"] == f"kill -CONT {pids[1]} resumes it where it was", rows[1]
        else:
            assert rows[1]["since_call_s"] > rows[1]["stall_s"] >= 4 and f"scancel {job}_1" in rows[1]["next"]
        assert rows[0]["state"] == "failed" and rows[0]["exit_code"] == 137, rows[0]
        assert rows[0]["line"].startswith(f"ncp: task {job}_0 exit 137"), rows[0]
        assert rows[2]["state"] in ("queued", "running", "done")
        _status(tmp_path, run_dir)

        # Resumed and re-submitted: the re-submission queues only the killed shard (the stopped one still runs).
        os.kill(pids[1], signal.SIGCONT)
        again = _submit("--shards", "3", "--python", sys.executable, "--", *args, cwd=tmp_path)
        assert again.returncode == 0 and "task(s) 0 of 3" in again.stdout, again.stdout + again.stderr
        job2 = _line(again.stdout, "submitted job ").split()[2].rstrip(":")
        rows = _until(lambda: (r := _rows(tmp_path, run_dir))[1]["state"] in ("running", "done") and r, 30)
        assert rows[0]["slurm"]["job"] == job2 and rows[0]["state"] in ("queued", "running", "done")
        _until(lambda: "running" in _status(tmp_path, run_dir).stdout.splitlines()[-1], 60)
        _wait_for(job, time.monotonic() + 120)
        _wait_for(job2, time.monotonic() + 120)
        rows = _rows(tmp_path, run_dir)
        assert [r["state"] for r in rows] == ["done"] * 3, rows
        assert rows[0]["slurm"]["job"] == job2 and rows[0]["slurm"]["exit_code"] == 0
        assert sum(r["episodes_finished"] for r in rows) == sum(r["episodes_total"] for r in rows) == 6
        _status(tmp_path, run_dir)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
