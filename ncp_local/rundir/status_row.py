"""One run or shard directory's row for `mode=status`: where it stands, from what it holds (`classify`).

Sources, all files and all untrusted: the heartbeat (rundir/heartbeat.py), `DONE`, `results/`,
`checkpoints/` (counted through `layout.checkpointed`), the manifest, the submission record and task
logs, and, where Slurm's commands answer, squeue and sacct (rundir/slurm.py). No engine, no model
library. "Finished" is results on disk in every row.

The states, decided in this order (`classify`):
- done: the heartbeat's final state says so, or DONE is there;
- failed / stopped: the heartbeat's final state (with its exit code and line);
- failed: a heartbeat with no final state whose process is gone (its pid, on this host), or stale (no
  rewrite for `stale_after` = 3 heartbeat intervals + 10 s) while Slurm does not show its task
  running; or a task that Slurm (or its log) says failed before its first heartbeat;
- stopped: its process, on this host, is stopped (SIGSTOP: /proc says it at once);
- stalled: the process is there (fresh heartbeat, a live pid, or Slurm shows the task running) but no
  turn was committed and no call completed for longer than the stall threshold (`stall_threshold`:
  `status.stall_s`, else max(`status.stall_floor_s`, `status.stall_factor` x the 90th percentile of the
  run's recent turn durations)); engine loading is not a stall;
- running: the process is there and working;
- queued: no heartbeat yet and nothing played (or Slurm shows the task pending);
- stopped: no heartbeat, work on disk, no DONE, nothing running it (a run from before heartbeats, one
  stopped before its first, a task Slurm calls COMPLETED that left neither).
A heartbeat that cannot be read is named in the row's line and the files decide; a sweep index or
submission record that cannot be read, with nothing else to say, is a `damaged` row. Every row that
is neither running nor done says what to do next (`Row.next`).
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from . import heartbeat
from .heartbeat import Beat, Damaged, ts
from .layout import (
    DONE,
    ENGINE_LOG,
    MANIFEST,
    RESULTS,
    STATUS,
    checkpointed,
    turns_recorded,
)
from .slurm import Task

# `damaged`: a record that says where a run or sweep is (a sweep index, a submission record) cannot be read,
# and nothing else says it.
STATES = ("queued", "running", "stalled", "done", "failed", "stopped", "damaged")
QUANTILE = 0.9
# A heartbeat written later than this after the reading's own clock is not one (clocks of a cluster agree to
# within seconds): a heartbeat from the future would never go stale.
FUTURE_S = 300.0
_RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
_PENDING = ("PENDING", "REQUEUED", "REQUEUE_HOLD")
_SLURM_ENDED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


@dataclass(frozen=True)
class Thresholds:
    stall_s: float | None = None
    stall_factor: float = 5.0
    stall_floor_s: float = 120.0

    @classmethod
    def of(cls, cfg: RunConfig) -> Thresholds:
        return cls(cfg.status.stall_s, cfg.status.stall_factor, cfg.status.stall_floor_s)


@dataclass
class Row:
    """One run, shard or sweep point (the JSON document's `rows`, docs/reference/status.md)."""

    kind: str  # run, shard, point
    name: str
    path: str
    state: str
    episodes_finished: int = 0
    episodes_total: int | None = None
    turns_committed: int | None = None
    turns_possible: int | None = None
    calls_per_s: float | None = None
    tokens_per_s: float | None = None
    turns_per_s: float | None = None
    since_turn_s: float | None = None  # since the last committed turn
    since_call_s: float | None = None
    eta_s: float | None = None
    stall_s: float | None = None  # the threshold this row was judged by
    heartbeat_age_s: float | None = None
    exit_code: int | None = None
    line: str | None = None  # what ended it, or why it is stalled or waiting
    next: str | None = None  # what to do next (rows neither running nor done)
    host: str | None = None
    pid: int | None = None
    slurm: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        # Seconds to a tenth, rates to four places: a status, not a measurement.
        return {
            k: round(v, 4 if k.endswith("_per_s") else 1) if isinstance(v, float) else v
            for k, v in asdict(self).items()
        }


def quantile(values: list[float], q: float = QUANTILE) -> float | None:
    """The q-quantile by nearest rank (no interpolation: one of the observed durations)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def stall_threshold(turn_seconds: list[float], t: Thresholds) -> float:
    if t.stall_s is not None:
        return t.stall_s
    q = quantile(turn_seconds)
    return max(t.stall_floor_s, t.stall_factor * q) if q is not None else t.stall_floor_s


def stale_after(every_s: float) -> float:
    """A heartbeat older than this has missed three rewrites (and a shared file system's lag)."""
    return 3 * every_s + 10.0


def pid_state(pid: int, host: str) -> str | None:
    """'gone', 'stopped' (SIGSTOP, T), 'alive', or None when it cannot be known (another host)."""
    if host != socket.gethostname() or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "alive"  # someone else's process holds the pid: ours is gone, but say nothing we cannot see
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat.rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "alive"
    if state == "Z":
        return "gone"
    return "stopped" if state in ("T", "t") else "alive"


def _results(part: Path) -> int:
    """Finished episodes: results on disk (what `finished` means in every row)."""
    try:
        return sum(1 for n in os.listdir(part / RESULTS) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return 0


def _turns_on_disk(part: Path, started: dict[str, int]) -> int:
    """Committed turns from the files (no heartbeat to say): every result's and checkpoint's."""
    done = sum(turns_recorded(p) for p in (part / RESULTS).glob("*.json")) if (part / RESULTS).is_dir() else 0
    return done + sum(started.values())


def _planned(part: Path) -> int | None:
    """Episodes the manifest says this directory plays (its specs x trials; a shard: its share)."""
    try:
        m = json.loads((part / MANIFEST).read_bytes())
        specs = len(m["dataset"]["specs"])
        trials = int(((m.get("config") or {}).get("trials") or {}).get("count") or 1)
        shard = (m.get("config") or {}).get("shard") or {}
        count, index = int(shard.get("count") or 1), int(shard.get("index") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if trials < 1 or count < 1 or not 0 <= index < count:
        return None
    total = specs * trials
    return len(range(index, total, count)) if count > 1 else total


def _last_line(path: Path, words: tuple[str, ...] = ("error", "Error", "Traceback")) -> str | None:
    """The last line of a log that says something went wrong (its tail only: logs grow large)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64_000))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if any(w in line for w in words):
            return line.strip()[:300]
    return None


def _resume(task: Task | None, kind: str) -> str:
    if task is not None:
        return "re-submit: the same slurm/submit.py command queues only the unfinished shards"
    whose = "the sweep's command" if kind == "point" else "its command"
    return f"re-run {whose}: it resumes from the checkpoints (finished episodes are kept)"


def _wait(task: Task | None) -> str:
    return f"wait: Slurm starts it (squeue -r -j {task.job})" if task is not None else "wait"


def _from_files(row: Row, part: Path, task: Task | None, note: str | None, damaged: str | None) -> Row:
    """A row without a (readable) heartbeat: the results, checkpoints, DONE and Slurm say it."""
    started = checkpointed(part)
    row.episodes_total = _planned(part)
    row.turns_committed = _turns_on_disk(part, started)
    played = row.episodes_finished or len(started)
    state = task.state if task is not None else None
    say = f"{STATUS} damaged ({damaged}); from the files: " if damaged else ""
    if (part / DONE).exists():
        row.state = "done"
        row.line = say.rstrip(": ").replace("; from the files", "") or None
    elif state in _PENDING and task is not None:
        row.state, row.line = "queued", say + (f"pending ({task.reason})" if task.reason else "pending")
        row.next = _wait(task)
    elif state in _RUNNING:
        row.state, row.line = "running", say + "started: no heartbeat yet (loading)"
    elif task is not None and (task.exit_code is not None or state in _SLURM_ENDED or state == "COMPLETED"):
        code = task.exit_code
        if state == "COMPLETED" or (state is None and code == 0):
            # Slurm's success, but the run never said so: no DONE, no heartbeat (status.heartbeat_s=0?).
            row.state, row.exit_code = "stopped", code if code is not None else 0
            row.line = say + f"Slurm: task ended (exit {code if code is not None else 0}) without DONE or a heartbeat"
        else:
            row.state, row.exit_code = "failed", code
            line = task.last_error or task.end_line or f"Slurm: {state or 'ended'} before its first heartbeat"
            row.line = say + line
        row.next = (f"read {task.log}; " if task.log else "") + _resume(task, row.kind)
    elif played:
        row.state = "stopped"
        row.line = say + (note or "not running (no heartbeat)")
        row.next = _resume(task, row.kind)
    else:
        row.state, row.line = "queued", (say + (note or "nothing played yet")) if (say or note) else None
        if task is not None:  # submitted, and Slurm's commands do not say where it is
            row.next = f"squeue -r -j {task.job} shows it; if it is not there: " + _resume(task, row.kind)
        else:
            row.next = "wait: it starts with its sweep's engines" if note else "start it with its command"
    return row


def classify(
    part: Path, kind: str, name: str, now: float, t: Thresholds, task: Task | None = None, note: str | None = None
) -> Row:
    """One run (or shard) directory's row at wall-clock time `now`; `task`: its Slurm array task, if any."""
    row = Row(kind=kind, name=name, path=str(part), state="queued", slurm=task.as_dict() if task else None)
    row.episodes_finished = _results(part)
    beat = heartbeat.read(part) if part.is_dir() else None
    if isinstance(beat, Beat) and (ts(beat.updated_at) or 0.0) > now + FUTURE_S:
        beat = Damaged(f"updated_at {beat.updated_at} is in the future")
    if not isinstance(beat, Beat):
        return _from_files(row, part, task, note, beat.why if isinstance(beat, Damaged) else None)
    slurm_state = task.state if task is not None else None
    slurm_running, slurm_pending = slurm_state in _RUNNING, slurm_state in _PENDING
    # The line that ended a task: the rig's last `error:` line, else the job script's exit line (a SIGKILL's 137).
    task_line = (task.last_error or task.end_line) if task is not None else None
    where = f"scancel {task.job}_{task.task}" if task is not None else f"kill {beat.pid}"
    row.episodes_total, row.turns_committed, row.turns_possible = (
        beat.episodes_total,
        beat.turns_committed,
        beat.turns_possible,
    )
    row.host, row.pid = beat.host, beat.pid
    updated = ts(beat.updated_at) or now
    row.heartbeat_age_s = max(0.0, now - updated)
    last_turn, last_call = ts(beat.last_turn_at), ts(beat.last_call_at)
    row.since_turn_s = now - last_turn if last_turn is not None else None
    row.since_call_s = now - last_call if last_call is not None else None
    row.stall_s = stall_threshold(beat.turn_seconds, t)
    if beat.state != "running":
        # A final state; unless Slurm has started the task again (requeued, re-submitted) since.
        if slurm_running and beat.state != "done":
            row.state, row.line = "running", f"restarted by Slurm after {beat.state}: no new heartbeat yet"
        elif slurm_pending and beat.state != "done":
            row.state = "queued"
            row.line = f"requeued after {beat.state}" + (f" ({task.reason})" if task and task.reason else "")
            row.next = _wait(task)
        else:
            row.state = beat.state
            row.exit_code, row.line = beat.exit_code, beat.error
            if row.state != "done":
                log = task.log if task is not None and task.log else part / ENGINE_LOG
                row.next = f"read {log}; " + _resume(task, row.kind)
        return row
    stale = row.heartbeat_age_s > stale_after(beat.every_s)
    proc = pid_state(beat.pid, beat.host)
    # The process that wrote it is gone, but Slurm has the task again (re-submitted, requeued): a new attempt.
    again = task is not None and task.job != beat.slurm.get("array_job_id", beat.slurm.get("job_id"))
    if (proc == "gone" or stale) and (slurm_pending or (slurm_running and again)):
        row.state = "queued" if slurm_pending else "running"
        row.line = "re-submitted" + (f", pending ({task.reason})" if slurm_pending and task and task.reason else "")
        row.line += "; no heartbeat of its own yet" if not slurm_pending else ""
        row.next = _wait(task) if slurm_pending else None
        return row
    if proc == "gone" or (stale and proc is None and not slurm_running):
        row.state = "failed"
        row.exit_code = task.exit_code if task is not None else None
        how = f"process {beat.pid} on {beat.host} is gone" if proc == "gone" else "its heartbeat is stale"
        row.line = (
            task_line
            or _last_line(part / ENGINE_LOG)
            or f"{how}: no final state (killed?); last heartbeat {row.heartbeat_age_s:.0f} s ago"
        )
        log = task.log if task is not None and task.log else part / ENGINE_LOG
        row.next = f"read {log}; " + _resume(task, row.kind)
        return row
    if proc == "stopped":
        # SIGSTOP (Ctrl-Z, a debugger): /proc says it at once, whatever the heartbeat's age.
        row.state, row.line = "stopped", f"process {beat.pid} is stopped (SIGSTOP or Ctrl-Z), not ended"
        row.next = f"kill -CONT {beat.pid} resumes it where it was"
        return row
    # The process is there: working, loading, or stalled.
    if beat.playing_since is None:
        loading = row.heartbeat_age_s + (updated - (ts(beat.started_at) or updated))
        row.state, row.line = "running", f"loading engines for {loading:.0f} s"
        return row
    moments = (last_turn, last_call, ts(beat.playing_since), ts(beat.started_at))
    activity = max((x for x in moments if x is not None), default=updated)
    idle = now - activity
    if idle > row.stall_s:
        row.state = "stalled"
        why = f"no committed turn or completed call for {idle:.0f} s (threshold {row.stall_s:.0f} s)"
        if stale:
            why += f"; heartbeat {row.heartbeat_age_s:.0f} s old"
        row.line = why
        log = task.log if task is not None and task.log else part / ENGINE_LOG
        row.next = f"read {log}; if it stays stalled: {where}, then " + _resume(task, row.kind)
        return row
    row.state = "running"
    row.calls_per_s, row.tokens_per_s, row.turns_per_s = beat.calls_per_s, beat.tokens_per_s, beat.turns_per_s
    left = max(0, (beat.turns_possible or 0) - (beat.turns_committed or 0))
    row.eta_s = left / beat.turns_per_s if beat.turns_per_s > 0 else (0.0 if left == 0 else None)
    if stale:
        row.line = f"heartbeat {row.heartbeat_age_s:.0f} s old"
    return row
