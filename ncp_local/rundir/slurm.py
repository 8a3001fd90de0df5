"""What a Slurm submission recorded and what Slurm says of its array tasks: the one reader of both.

The submitter records each job it queued in the run directory's `submit.json` (launch/slurm.py,
`queue`); `read_submit` reads that record for the submitter (a re-submission) and for `mode=status`
alike, as untrusted input: at most `MAX_BYTES`, a shard count up to `MAX_SHARDS`, job ids that are
Slurm's (digits), task indexes inside the shard count; a record that is not one is `Damaged`, with
why. `from_squeue` asks squeue (tasks pending or running: state, the reason a task waits, its node),
`from_sacct` asks sacct (tasks that ended: state, exit code, node), and `read_log` reads each task's
log (`slurm/<job>_<task>.out`: how often it restarted, how it ended). Every source is optional:
without Slurm's commands on PATH, or without accounting (`sacct` then has nothing), the answer is
whatever the files say. Read-only and bounded: each call has a timeout, all of one reading share
`BUDGET_S`, and at most `MAX_JOBS` jobs are asked about; never raises for Slurm's sake.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from .heartbeat import Damaged, parse_record, read_capped
from .layout import SLURM_LOGS, SUBMIT_STATE

_log = logging.getLogger(__name__)
TIMEOUT_S = 15.0
# All of one status reading's calls to Slurm together: a hung squeue is waited for once, not per job.
BUDGET_S = 30.0
# A submission is one array job, re-submitted a few times: more distinct jobs than this are not asked about.
MAX_JOBS = 32
# No run is split into more shards than it has specs; this is far above any, and bounds what a record can claim.
MAX_SHARDS = 10_000
# Each re-submission records one job: a record of more than this many is not a submission's.
MAX_JOBS_RECORDED = 10_000
MAX_BYTES = 16_000_000
# A task log is read from its tail: the job script's lines of the last attempt are there.
LOG_TAIL = 64_000
# The job script's own lines (slurm/ncp_array.sbatch): its start (with Slurm's restart count) and its end.
_START = re.compile(r"^ncp: task (\S+) on (\S+) \(restart (\d+)\)")
_EXIT = re.compile(r"^ncp: task (\S+) exit (\d+)")
_JOB_ID = r"^\d{1,20}$"


class SubmittedJob(BaseModel):
    """One sbatch call of the submission: its job id and the array tasks it was given."""

    model_config = ConfigDict(extra="allow")
    job: str = Field(pattern=_JOB_ID)
    tasks: list[Annotated[int, Field(ge=0, lt=MAX_SHARDS)]] = []


class SubmitRecord(BaseModel):
    """`submit.json`: the run's identity, its shard count and every job queued for it (oldest first)."""

    model_config = ConfigDict(extra="allow")
    identity: str
    shards: int = Field(ge=1, le=MAX_SHARDS, strict=True)
    jobs: list[SubmittedJob] = Field([], max_length=MAX_JOBS_RECORDED)


def read_submit(root: Path) -> SubmitRecord | Damaged | None:
    """The submission recorded in `root` (a sharded run's directory or a sweep folder); None without one."""
    data = read_capped(Path(root) / SUBMIT_STATE, MAX_BYTES)
    if not isinstance(data, bytes):
        return data
    rec = parse_record(data, SubmitRecord)
    if isinstance(rec, Damaged):
        return rec
    if any(t >= rec.shards for j in rec.jobs for t in j.tasks):
        return Damaged(f"a job's task index is not below its {rec.shards} shards")
    return rec


def _record(root: Path) -> SubmitRecord | None:
    rec = read_submit(root)
    return rec if isinstance(rec, SubmitRecord) else None


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


def submitted_jobs(root: Path) -> list[SubmittedJob]:
    """The jobs `submit.json` in `root` records (oldest first); [] without one or when damaged."""
    rec = _record(root)
    return list(rec.jobs) if rec else []


def submitted_shards(root: Path) -> int | None:
    rec = _record(root)
    return rec.shards if rec else None


def latest_jobs(jobs: list[SubmittedJob], count: int) -> dict[int, str]:
    """Array task -> the last job that was given it (a re-submission queues only the unfinished tasks)."""
    return {t: j.job for j in jobs for t in j.tasks if t < count}


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
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL))
            text = f.read().decode("utf-8", "replace")
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


def deadline(budget_s: float | None = None) -> float:
    """When a reading's calls to Slurm must have answered (time.monotonic); `BUDGET_S` from now by default."""
    return time.monotonic() + (BUDGET_S if budget_s is None else budget_s)


def _ask(cmd: list[str], until: float) -> tuple[str | None, str | None]:
    """(the command's stdout, None), or (None, why it said nothing): not on PATH, timed out (each call
    within `TIMEOUT_S`, all before `until`), or its own error line (sacct without accounting: "Slurm
    accounting storage is disabled", exit 1)."""
    if shutil.which(cmd[0]) is None:
        return None, f"{cmd[0]}: not on PATH"
    wait = min(TIMEOUT_S, until - time.monotonic())
    if wait <= 0:
        return None, f"{cmd[0]}: not asked (Slurm's answers took {BUDGET_S:.0f} s already)"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=wait)
    except subprocess.TimeoutExpired:
        return None, f"{cmd[0]}: no answer within {wait:.0f} s"
    except OSError as exc:
        return None, f"{cmd[0]}: cannot run ({exc})"
    if out.returncode != 0:
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()
        return None, f"{cmd[0]}: exit {out.returncode}" + (f": {said[0][:200]}" if said else "")
    return out.stdout, None


def _split_id(job_task: str) -> tuple[str, int] | None:
    job, _, task = job_task.partition("_")
    return (job, int(task)) if task.isdigit() else None


@dataclass
class SqueueSaid:
    """What squeue said of some jobs: their pending and running tasks, and why it said nothing of some."""

    tasks: dict[tuple[str, int], Task] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # why a job's tasks are not known (no answer)


def from_squeue(jobs: list[str], until: float | None = None) -> SqueueSaid:
    """Pending and running tasks of these jobs (squeue -r lists each array task on its own line)."""
    said = SqueueSaid()
    until = deadline() if until is None else until
    # One call per job: squeue refuses the whole list when one id is no longer known (exit 1: nothing queued).
    for job in jobs:
        text, why = _ask(["squeue", "-h", "-r", "-j", job, "-o", "%i|%T|%r|%N"], until)
        if text is None and why is not None and ": exit " not in why:
            said.unknown.append(why)  # not on PATH, or no answer: nothing is known of this job or the next
            break
        for line in (text or "").splitlines():
            parts = line.strip().split("|")
            key = _split_id(parts[0]) if len(parts) == 4 else None
            if key is not None:
                state, reason, node = parts[1], parts[2], parts[3]
                said.tasks[key] = Task(
                    key[0],
                    key[1],
                    state=state,
                    reason=reason if reason not in ("None", "") else None,
                    node=node or None,
                    source="squeue",
                )
    return said


# sacct's fields, in the order asked (`--format`), and its output as the rig asks for it: one line per job
# allocation (`--allocations`, no steps), no header, fields split by "|" (`--parsable2`: none at the end).
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList")
SACCT = ["sacct", "--noheader", "--parsable2", "--allocations", "--format=" + ",".join(SACCT_FIELDS)]
# Slurm's job states (sacct(1), JOB STATE CODES); a state outside them is kept as given, with a note.
STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "CONFIGURING", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
        "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
    }
)  # fmt: skip
# An array job's id: `<job>_<task>` for a task Slurm has started, `<job>_[<ranges>]` (`1,3,5-9`, and a `%N`
# throttle) for tasks still pending as one record.
_ARRAY_ID = re.compile(r"^(\d+)_(?:(\d+)|\[([\d,\-]+)(?:%\d+)?\])$")


@dataclass
class SacctSaid:
    """What sacct said of some jobs: the array tasks its lines name, and why anything else was left out."""

    tasks: dict[tuple[str, int], Task] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # why sacct said nothing, or why a line was ignored


def _task_ids(ranges: str) -> list[int] | None:
    """`1,3,5-9` as task indexes; None when it is not such a list."""
    out: list[int] = []
    for part in ranges.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            return None
        out += range(int(first), int(last) + 1) if dash else [int(first)]
    return out


def _exit_code(text: str) -> int | None:
    """sacct's ExitCode `<exit>:<signal>` as a shell gives it: the exit, or 128 + the signal that ended it."""
    code, colon, signal = text.partition(":")
    if not code.isdigit() or (colon and not signal.isdigit()):
        return None
    return 128 + int(signal) if colon and int(signal) else int(code)


def parse_sacct(text: str) -> SacctSaid:
    """sacct's lines (`SACCT`'s fields) as array tasks; a line that names none is left out with a note."""
    said = SacctSaid()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != len(SACCT_FIELDS):
            said.notes.append(f"sacct line {number}: {len(parts)} fields, not {len(SACCT_FIELDS)}: {line[:120]!r}")
            continue
        job_id, state_text, code_text, nodes = parts
        m = _ARRAY_ID.match(job_id)
        ids = ([int(m.group(2))] if m.group(2) else _task_ids(m.group(3))) if m else None
        if m is None or not ids:
            what = "a job step" if "." in job_id else "not an array task"
            said.notes.append(f"sacct line {number}: {job_id!r} is {what}: ignored")
            continue
        # "CANCELLED by 1234" (the uid that cancelled it): the state is the first word.
        state = state_text.split()[0].upper() if state_text.split() else None
        if state is not None and state not in STATES:
            said.notes.append(f"sacct line {number}: state {state_text!r} is not one of Slurm's: kept as given")
        code = _exit_code(code_text) if code_text else None
        if code_text and code is None:
            said.notes.append(f"sacct line {number}: exit code {code_text!r} is not <exit>:<signal>: left unknown")
        node = nodes if nodes and nodes not in ("None assigned", "(null)") else None
        for task in ids:
            # A later line of the same task (a requeued one) is its latest.
            said.tasks[(m.group(1), task)] = Task(
                m.group(1),
                task,
                state=state,
                # The 0:0 sacct shows for a task not ended, or ended by Slurm (a timeout, a node's failure, a
                # preemption), is no exit of the task's own: unknown, the state says how it ended.
                exit_code=None if code == 0 and state != "COMPLETED" else code,
                node=node,
                source="sacct",
            )
    return said


def from_sacct(jobs: list[str], until: float | None = None) -> SacctSaid:
    """The tasks of these jobs as Slurm's accounting has them (ended, and pending or running); nothing, with
    the reason, where sacct is missing or fails (no accounting storage: the files alone answer)."""
    if not jobs:
        return SacctSaid()
    text, why = _ask([*SACCT, "--jobs=" + ",".join(jobs)], deadline() if until is None else until)
    if text is None:
        return SacctSaid(notes=[why or "sacct: no answer"])
    return parse_sacct(text)


def tasks_of(root: Path, count: int, slurm: bool = True, record: SubmitRecord | None = None) -> dict[int, Task]:
    """Array task index -> what is known of its latest job, for the submission recorded in `root`
    (a sharded run's directory or a sweep folder; `record`: its submit.json, if already read); {} when
    nothing was submitted from there."""
    jobs = list(record.jobs) if record is not None else submitted_jobs(root)
    if not jobs:
        return {}
    latest = latest_jobs(jobs, count)
    # The newest jobs only (a record claiming thousands of re-submissions is not asked about job by job).
    ids = sorted(set(latest.values()), key=int)[-MAX_JOBS:]
    latest = {i: job for i, job in sorted(latest.items()) if job in ids}
    until = deadline()
    queued = from_squeue(ids, until).tasks if slurm else {}
    accounted = from_sacct(ids, until) if slurm else SacctSaid()
    for note in accounted.notes:
        _log.info("mode=status: %s", note)  # logged (stderr, or the mode's log): the files answer instead
    ended = accounted.tasks
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
