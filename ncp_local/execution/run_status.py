"""Where each run, shard and sweep point stands, from what its directory holds (`mode=status`).

Sources, all files: the heartbeat (`status.json`, execution/heartbeat.py), `DONE`, `results/`,
`checkpoints/`, the manifest, the submission record (`submit.json`) with its task logs, and, where
Slurm's commands answer, squeue and sacct (execution/slurm_tasks.py). No engine, no model library.

The states, decided in this order (`classify`):
- done: the heartbeat's final state says so, or DONE is there;
- failed / stopped: the heartbeat's final state (with its exit code and line);
- failed: a heartbeat with no final state whose process is gone (its pid, on this host), or stale (no
  rewrite for `stale_after` = 3 heartbeat intervals + 10 s) while Slurm does not show its task
  running; or a task that Slurm (or its log) says ended without DONE;
- stalled: the process is there (fresh heartbeat, a live pid, or Slurm shows the task running) but no
  turn was committed and no call completed for longer than the stall threshold (`stall_threshold`:
  `status.stall_s`, else max(`status.stall_floor_s`, `status.stall_factor` x the 90th percentile of the
  run's recent turn durations)); engine loading is not a stall;
- running: the process is there and working;
- queued: no heartbeat yet and nothing played (or Slurm shows the task pending);
- stopped: no heartbeat, work on disk, no DONE, nothing running it (a run from before heartbeats,
  or one stopped before its first).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import RunConfig
from ..errors import InputError
from ..rundir.layout import (
    CHECKPOINTS,
    DONE,
    ENGINE_LOG,
    MANIFEST,
    RESULTS,
    STATUS,
    SUBMIT_STATE,
    shard_dirs,
    shard_name,
    turns_recorded,
)
from ..rundir.sweep_index import read_index
from ..rundir.turn_log import checkpoint_paths
from .heartbeat import Beat
from .slurm_tasks import Task, submitted_shards, tasks_of

STATES = ("queued", "running", "stalled", "done", "failed", "stopped")
DOC_KIND = "ncp-status"
DOC_VERSION = 1
QUANTILE = 0.9
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
    host: str | None = None
    pid: int | None = None
    slurm: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        # Seconds to a tenth, rates to four places: a status, not a measurement.
        return {
            k: round(v, 4 if k.endswith("_per_s") else 1) if isinstance(v, float) else v
            for k, v in asdict(self).items()
        }


@dataclass
class Total:
    rows: int = 0
    states: dict[str, int] = field(default_factory=dict)
    episodes_finished: int = 0
    episodes_total: int = 0
    turns_committed: int = 0
    turns_possible: int = 0
    calls_per_s: float = 0.0
    tokens_per_s: float = 0.0
    eta_s: float | None = None
    eta_excludes: int = 0  # rows with work left that no rate covers (stalled, failed, stopped, queued)


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


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


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


def read_beat(part: Path) -> Beat | None:
    try:
        return Beat.model_validate(json.loads((part / STATUS).read_bytes()))
    except (OSError, ValueError, ValidationError):
        return None


def _count(part: Path, folder: str) -> int:
    if folder == CHECKPOINTS:
        return len(checkpoint_paths(part / folder))
    try:
        return sum(1 for n in os.listdir(part / folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return 0


def _turns_on_disk(part: Path) -> int:
    """Committed turns from the files (no heartbeat to say): every result's and checkpoint's."""
    results = sorted((part / RESULTS).glob("*.json")) if (part / RESULTS).is_dir() else []
    return sum(turns_recorded(p) for p in [*results, *checkpoint_paths(part / CHECKPOINTS).values()])


def _planned(part: Path) -> int | None:
    """Episodes the manifest says this directory plays (its specs x trials; a shard: its share)."""
    try:
        m = json.loads((part / MANIFEST).read_bytes())
        specs = len(m["dataset"]["specs"])
        trials = int(((m.get("config") or {}).get("trials") or {}).get("count") or 1)
        shard = (m.get("config") or {}).get("shard") or {}
        count, index = int(shard.get("count") or 1), int(shard.get("index") or 0)
    except (OSError, ValueError, KeyError, TypeError):
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


def _slurm_said(task: Task | None) -> dict[str, Any] | None:
    return task.as_dict() if task is not None else None


def classify(
    part: Path, kind: str, name: str, now: float, t: Thresholds, task: Task | None = None, note: str | None = None
) -> Row:
    """One run (or shard) directory's row at wall-clock time `now`; `task`: its Slurm array task, if any."""
    row = Row(kind=kind, name=name, path=str(part), state="queued", slurm=_slurm_said(task))
    row.episodes_finished = _count(part, RESULTS)
    beat = read_beat(part) if part.is_dir() else None
    done_marker = (part / DONE).exists()
    slurm_state = task.state if task is not None else None
    slurm_running = slurm_state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
    slurm_pending = slurm_state in ("PENDING", "REQUEUED", "REQUEUE_HOLD")
    # The line that ended a task: the rig's last `error:` line, else the job script's exit line (a SIGKILL's 137).
    task_line = (task.last_error or task.end_line) if task is not None else None
    if beat is None:
        row.episodes_total = _planned(part)
        row.turns_committed = _turns_on_disk(part) if part.is_dir() else 0
        played = row.episodes_finished or _count(part, CHECKPOINTS)
        if done_marker:
            row.state = "done"
        elif slurm_pending:
            row.state, row.line = "queued", f"pending ({task.reason})" if task and task.reason else "pending"
        elif slurm_running:
            row.state, row.line = "running", "started: no heartbeat yet (loading)"
        elif task is not None and (task.exit_code is not None or slurm_state in _SLURM_ENDED):
            row.state, row.exit_code = "failed", task.exit_code
            row.line = task_line or f"Slurm: {slurm_state or 'ended'} before its first heartbeat"
        elif played:
            row.state, row.line = "stopped", note or "not running (no heartbeat; its own command resumes it)"
        else:
            row.state, row.line = "queued", note
        return row
    # A heartbeat: its figures.
    row.episodes_total, row.turns_committed, row.turns_possible = (
        beat.episodes_total,
        beat.turns_committed,
        beat.turns_possible,
    )
    # The heartbeat's own count, consistent with its turns (results written since show at its next beat).
    row.episodes_finished = beat.episodes_finished
    row.host, row.pid = beat.host, beat.pid
    updated = _ts(beat.updated_at) or now
    row.heartbeat_age_s = max(0.0, now - updated)
    last_turn, last_call = _ts(beat.last_turn_at), _ts(beat.last_call_at)
    row.since_turn_s = now - last_turn if last_turn is not None else None
    row.since_call_s = now - last_call if last_call is not None else None
    row.stall_s = stall_threshold(beat.turn_seconds, t)
    if beat.state != "running":
        # A final state; unless Slurm has started the task again (requeued, re-submitted) since.
        if slurm_running and beat.state != "done":
            row.state, row.line = "running", f"restarted by Slurm after {beat.state}: no new heartbeat yet"
        elif slurm_pending and beat.state != "done":
            row.state, row.line = (
                "queued",
                f"requeued after {beat.state}" + (f" ({task.reason})" if task and task.reason else ""),
            )
        else:
            row.state = "done" if beat.state == "done" else beat.state
            row.exit_code, row.line = beat.exit_code, beat.error
        return row
    stale = row.heartbeat_age_s > stale_after(beat.every_s)
    proc = pid_state(beat.pid, beat.host)
    # The process that wrote it is gone, but Slurm has the task again (re-submitted, requeued): a new attempt.
    again = task is not None and task.job != beat.slurm.get("array_job_id", beat.slurm.get("job_id"))
    if (proc == "gone" or stale) and (slurm_pending or (slurm_running and again)):
        row.state = "queued" if slurm_pending else "running"
        row.line = "re-submitted" + (f", pending ({task.reason})" if slurm_pending and task and task.reason else "")
        row.line += "; no heartbeat of its own yet" if not slurm_pending else ""
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
        return row
    # The process is there: working, loading, or stalled.
    if beat.playing_since is None:
        row.state, row.line = (
            "running",
            f"loading engines for {row.heartbeat_age_s + (updated - (_ts(beat.started_at) or updated)):.0f} s",
        )
        return row
    activity = max(x for x in (last_turn, last_call, _ts(beat.playing_since), _ts(beat.started_at)) if x is not None)
    idle = now - activity
    if idle > row.stall_s:
        row.state = "stalled"
        why = f"no committed turn or completed call for {idle:.0f} s (threshold {row.stall_s:.0f} s)"
        if proc == "stopped":
            why += f"; process {beat.pid} is stopped (SIGSTOP)"
        elif stale:
            why += f"; heartbeat {row.heartbeat_age_s:.0f} s old"
        row.line = why
        return row
    row.state = "running"
    row.calls_per_s, row.tokens_per_s, row.turns_per_s = beat.calls_per_s, beat.tokens_per_s, beat.turns_per_s
    left = max(0, (beat.turns_possible or 0) - (beat.turns_committed or 0))
    row.eta_s = left / beat.turns_per_s if beat.turns_per_s > 0 else (0.0 if left == 0 else None)
    if stale:
        row.line = f"heartbeat {row.heartbeat_age_s:.0f} s old"
    return row


# ---- what a runs= entry is -----------------------------------------------------------


def _is_run(d: Path) -> bool:
    return (d / MANIFEST).is_file() or (d / RESULTS).is_dir() or (d / STATUS).is_file()


def _shard_rows(root: Path, now: float, t: Thresholds, slurm: bool, label: str) -> list[Row]:
    layouts = shard_dirs(root)
    count = submitted_shards(root) or (max(layouts) if layouts else 0)
    found = layouts.get(count, {})
    tasks = tasks_of(root, count, slurm)
    return [
        classify(
            found.get(i, root / shard_name(i, count)), "shard", f"{label} {shard_name(i, count)}", now, t, tasks.get(i)
        )
        for i in range(count)
    ]


def _sweep_rows(root: Path, now: float, t: Thresholds, slurm: bool) -> list[Row]:
    rows = read_index(root)
    shared = set.intersection(*(set(r.overrides) for r in rows)) if rows else set()
    count = submitted_shards(root) or 1
    tasks = tasks_of(root, count, slurm)
    out: list[Row] = []
    for r in rows:
        own = " ".join(o for o in r.overrides if o not in shared)
        name = f"#{r.job}" + (f" {own}" if own else "")
        if r.shard_dir:
            index = int(Path(r.shard_dir).name.split("-")[1]) if Path(r.shard_dir).name.startswith("shard-") else 0
            name += f" {Path(r.shard_dir).name}"
        else:
            index = 0
        part = Path(r.shard_dir or r.run_dir or root / f"point-{r.job}")
        if not r.run_dir:
            row = Row(kind="point", name=name, path=str(root), state="failed" if r.status == "failed" else "queued")
            row.exit_code, row.line = r.exit_code, r.error or None
            out.append(row)
            continue
        note = {"failed": r.error, "pending": "waiting for its group's engines"}.get(r.status)
        row = classify(part, "point", name, now, t, tasks.get(index) if count > 1 else None, note=note or None)
        if row.state in ("queued", "stopped") and r.status == "failed":
            row.state, row.exit_code, row.line = "failed", r.exit_code, r.error or row.line
        out.append(row)
    return out


GLOB_CHARS = set("*?[")


def status_rows(entries: list[str], t: Thresholds, now: float, slurm: bool = True) -> list[Row]:
    """Rows for each `runs=` entry: a run directory (one row), a sharded run (a row per shard), a sweep
    folder (a row per point and shard), a glob (each matching directory). Anything else: an InputError."""
    out: list[Row] = []
    for entry in entries:
        if GLOB_CHARS & set(entry):
            root = Path(entry).expanduser()
            anchor = Path(root.anchor) if root.is_absolute() else Path(".")
            pattern = str(root.relative_to(root.anchor)) if root.is_absolute() else str(root)
            found = sorted(str(p) for p in anchor.glob(pattern) if p.is_dir())
            if not found:
                raise InputError(entry, "runs", "no directory matches this pattern")
            for f in found:
                out += rows_for(f, t, now, slurm)
        else:
            out += rows_for(entry, t, now, slurm)
    return out


def rows_for(entry: str, t: Thresholds, now: float, slurm: bool = True) -> list[Row]:
    root = Path(entry).expanduser()
    if not root.is_dir():
        raise InputError(root, "runs", "no such directory" if not root.exists() else "not a directory")
    if any(root.glob("index*.json")) and not (root / RESULTS).is_dir():
        return _sweep_rows(root, now, t, slurm)
    if shard_dirs(root) or (root / SUBMIT_STATE).is_file():
        return _shard_rows(root, now, t, slurm, root.name)
    if _is_run(root):
        return [classify(root, "run", root.name, now, t)]
    raise InputError(
        root, "runs", "not a run directory, a sharded run or a sweep folder (no manifest, results/, shards or index)"
    )


def total(rows: list[Row]) -> Total:
    tot = Total(rows=len(rows))
    etas: list[float] = []
    left_rated = 0
    for r in rows:
        tot.states[r.state] = tot.states.get(r.state, 0) + 1
        tot.episodes_finished += r.episodes_finished
        tot.episodes_total += r.episodes_total or 0
        tot.turns_committed += r.turns_committed or 0
        tot.turns_possible += r.turns_possible or 0
        tot.calls_per_s += r.calls_per_s or 0.0
        tot.tokens_per_s += r.tokens_per_s or 0.0
        if r.eta_s is not None:
            etas.append(r.eta_s)
            left_rated += max(0, (r.turns_possible or 0) - (r.turns_committed or 0))
        elif r.state != "done" and (r.episodes_total is None or r.episodes_finished < r.episodes_total):
            tot.eta_excludes += 1
    if etas:
        # Rows run side by side (shards) or share engines (a sweep's points): the slowest row, or all the
        # rated work at the summed rate, whichever is longer.
        rate = sum(r.turns_per_s or 0.0 for r in rows if r.eta_s is not None)
        tot.eta_s = max(max(etas), left_rated / rate if rate > 0 else 0.0)
    tot.calls_per_s, tot.tokens_per_s = round(tot.calls_per_s, 3), round(tot.tokens_per_s, 1)
    return tot


def document(rows: list[Row], now: float) -> dict[str, Any]:
    """The JSON form (`status.format=json`), documented in docs/reference/status.md."""
    return {
        "kind": DOC_KIND,
        "version": DOC_VERSION,
        "generated_at": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"),
        "rows": [r.as_dict() for r in rows],
        "total": asdict(total(rows)),
    }
