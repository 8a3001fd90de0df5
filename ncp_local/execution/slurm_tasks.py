"""What Slurm says about a submission's array tasks, for `mode=status` (execution/run_status.py).

The submitter records each job it queued in the run directory's `submit.json` (launch/slurm.py,
`queue`); this reads that record, asks `squeue` (tasks pending or running: state, the reason a task
waits, its node) and `sacct` (tasks that ended: state, exit code, node) about those jobs, and reads
each task's log (`slurm/<job>_<task>.out`: how often it restarted, how it ended). Every source is
optional: without Slurm's commands on PATH, or without accounting (`sacct` then has nothing), the
answer is whatever the files say. Read-only, bounded by a timeout; never raises for Slurm's sake.

It lives below `modes` (the layers in pyproject.toml) so that `mode=status` can use it; the
submitter's own calls (sbatch, the queued tasks a re-submission skips) stay in launch/slurm.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rundir.layout import SLURM_LOGS, SUBMIT_STATE

TIMEOUT_S = 15.0
# The job script's own lines (slurm/ncp_array.sbatch): its start (with Slurm's restart count) and its end.
_START = re.compile(r"^ncp: task (\S+) on (\S+) \(restart (\d+)\)")
_EXIT = re.compile(r"^ncp: task (\S+) exit (\d+)")


@dataclass
class Task:
    """One array task as Slurm and its log tell it (fields None where no source says)."""

    job: str
    task: int
    state: str | None = None  # Slurm's: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str | None = None  # why it is pending (squeue's %r)
    node: str | None = None
    exit_code: int | None = None  # the job script's exit (its log, else sacct)
    restarts: int = 0  # requeued this often (its log's restart count)
    log: Path | None = None
    last_error: str | None = None  # the log's last `error:` line
    end_line: str | None = None  # the job script's `ncp: task J exit N at T` line, once it ended
    source: str = "files"  # squeue, sacct or files

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "task": self.task,
            "state": self.state,
            "reason": self.reason,
            "node": self.node,
            "exit_code": self.exit_code,
            "restarts": self.restarts,
            "log": str(self.log) if self.log else None,
            "source": self.source,
        }


def submitted_jobs(root: Path) -> list[dict[str, Any]]:
    """The jobs `submit.json` in `root` records (oldest first); [] without one or when unreadable."""
    try:
        state = json.loads((Path(root) / SUBMIT_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    jobs = state.get("jobs") if isinstance(state, dict) else None
    return [j for j in jobs or () if isinstance(j, dict) and isinstance(j.get("job"), str)]


def submitted_shards(root: Path) -> int | None:
    try:
        state = json.loads((Path(root) / SUBMIT_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    n = state.get("shards") if isinstance(state, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def latest_job(jobs: list[dict[str, Any]], task: int) -> str | None:
    """The last job that was given array task `task` (a re-submission queues only the unfinished tasks)."""
    for j in reversed(jobs):
        if task in (j.get("tasks") or ()):
            return str(j["job"])
    return None


@dataclass
class LogSays:
    restarts: int = 0
    code: int | None = None  # the last attempt's exit; None while it runs
    node: str | None = None
    error: str | None = None  # the last `error:` line
    end: str | None = None  # the last attempt's exit line


def read_log(path: Path) -> LogSays:
    """What a task log (slurm/ncp_array.sbatch's lines and the rig's) says of the task's last attempt."""
    said = LogSays()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return said
    for line in text.splitlines():
        if m := _START.match(line):
            # A new attempt: its end is not known yet.
            said.restarts, said.node, said.code, said.end = int(m.group(3)), m.group(2), None, None
        elif m := _EXIT.match(line):
            said.code, said.end = int(m.group(2)), line.strip()
        elif line.startswith("error:"):
            said.error = line.strip()
    return said


def _ask(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _split_id(job_task: str) -> tuple[str, int] | None:
    job, _, task = job_task.partition("_")
    return (job, int(task)) if task.isdigit() else None


def from_squeue(jobs: list[str]) -> dict[tuple[str, int], Task]:
    """Pending and running tasks of these jobs (squeue -r lists each array task on its own line)."""
    out: dict[tuple[str, int], Task] = {}
    # One call per job: squeue refuses the whole list when one id is no longer known.
    for job in jobs:
        text = _ask(["squeue", "-h", "-r", "-j", job, "-o", "%i|%T|%r|%N"])
        for line in (text or "").splitlines():
            parts = line.strip().split("|")
            key = _split_id(parts[0]) if len(parts) == 4 else None
            if key is not None:
                state, reason, node = parts[1], parts[2], parts[3]
                out[key] = Task(
                    key[0],
                    key[1],
                    state=state,
                    reason=reason if reason not in ("None", "") else None,
                    node=node or None,
                    source="squeue",
                )
    return out


def from_sacct(jobs: list[str]) -> dict[tuple[str, int], Task]:
    """Ended tasks of these jobs, where accounting is on (else {})."""
    if not jobs:
        return {}
    text = _ask(["sacct", "-n", "-P", "-X", "-j", ",".join(jobs), "-o", "JobID,State,ExitCode,NodeList"])
    out: dict[tuple[str, int], Task] = {}
    for line in (text or "").splitlines():
        parts = line.strip().split("|")
        key = _split_id(parts[0]) if len(parts) == 4 else None
        if key is not None:
            code = parts[2].partition(":")[0]
            out[key] = Task(
                key[0],
                key[1],
                state=parts[1].split()[0] if parts[1] else None,  # "CANCELLED by 123" -> CANCELLED
                exit_code=int(code) if code.isdigit() else None,
                node=parts[3] or None,
                source="sacct",
            )
    return out


def tasks_of(root: Path, count: int, slurm: bool = True) -> dict[int, Task]:
    """Array task index -> what is known of its latest job, for the submission recorded in `root`
    (a sharded run's directory or a sweep folder); {} when nothing was submitted from there."""
    jobs = submitted_jobs(root)
    if not jobs:
        return {}
    latest = {i: job for i in range(count) if (job := latest_job(jobs, i)) is not None}
    ids = sorted(set(latest.values()))
    queued = from_squeue(ids) if slurm else {}
    ended = from_sacct(ids) if slurm else {}
    out: dict[int, Task] = {}
    for i, job in latest.items():
        t = queued.get((job, i)) or ended.get((job, i)) or Task(job, i)
        log = Path(root) / SLURM_LOGS / f"{job}_{i}.out"
        if log.is_file():
            said = read_log(log)
            t.log, t.restarts, t.last_error = log, said.restarts, said.error
            t.node = t.node or said.node
            if t.state not in ("RUNNING", "PENDING") and said.code is not None:
                t.exit_code, t.end_line = said.code, said.end  # the job script's own record of its end
        out[i] = t
    return out
