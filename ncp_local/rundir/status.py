"""Where each run, shard and sweep point stands, from what its directory holds (`mode=status`).

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

import datetime as dt
import json
import math
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import InputError
from . import heartbeat
from .heartbeat import Beat, Damaged, ts
from .layout import (
    DONE,
    ENGINE_LOG,
    MANIFEST,
    RESULTS,
    STATUS,
    SUBMIT_STATE,
    checkpointed,
    shard_dirs,
    shard_name,
    turns_recorded,
)
from .slurm import SubmitRecord, Task, read_submit, tasks_of
from .sweep_index import POINT_LINK, read_sweep

# `damaged`: a record that says where a run or sweep is (a sweep index, a submission record) cannot be read,
# and nothing else says it.
STATES = ("queued", "running", "stalled", "done", "failed", "stopped", "damaged")
DOC_KIND = "ncp-status"
DOC_VERSION = 1
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
        row.next = f"wait: Slurm starts it (squeue -r -j {task.job})"
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
        row.next = (
            "wait: it starts with its sweep's engines" if note else "start it with its command: nothing has played"
        )
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


# ---- what a runs= entry is -----------------------------------------------------------


def _is_run(d: Path) -> bool:
    return (d / MANIFEST).is_file() or (d / RESULTS).is_dir() or (d / STATUS).is_file()


def _damaged(kind: str, name: str, path: Path, what: str, why: str, fix: str) -> Row:
    return Row(kind=kind, name=name, path=str(path), state="damaged", line=f"{what} damaged: {why}", next=fix)


def _shard_rows(root: Path, now: float, t: Thresholds, slurm: bool, label: str) -> list[Row]:
    layouts = shard_dirs(root)
    rec = read_submit(root)
    out: list[Row] = []
    if isinstance(rec, Damaged):
        fix = f"move {root / SUBMIT_STATE} aside; the shards on disk are read"
        out.append(_damaged("run", label, root, SUBMIT_STATE, rec.why, fix))
    count = rec.shards if isinstance(rec, SubmitRecord) else (max(layouts) if layouts else 0)
    found = layouts.get(count, {})
    tasks = tasks_of(root, count, slurm)
    return out + [
        classify(
            found.get(i, root / shard_name(i, count)), "shard", f"{label} {shard_name(i, count)}", now, t, tasks.get(i)
        )
        for i in range(count)
    ]


_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")


def _sweep_rows(root: Path, now: float, t: Thresholds, slurm: bool) -> list[Row]:
    try:
        indexes = read_sweep(root)
    except InputError as exc:
        return [_damaged("sweep", root.name, root, "sweep index", str(exc), "move the index aside; the runs are read")]
    if not indexes:
        return [Row(kind="sweep", name=root.name, path=str(root), state="queued", line="no point has started yet")]
    rows = [r for index in indexes for r in index.points]
    # The process that writes the index: a point it has not finished is its to play, while it lives.
    alive = {pid_state(i.pid, i.host) if i.pid and i.host else None for i in indexes}
    gone = alive == {"gone"}
    shared = set.intersection(*(set(r.overrides) for r in rows)) if rows else set()
    rec = read_submit(root)
    count = rec.shards if isinstance(rec, SubmitRecord) else 1
    tasks = tasks_of(root, count, slurm)
    out: list[Row] = []
    for r in rows:
        own = " ".join(o for o in r.overrides if o not in shared)
        name = f"#{r.job}" + (f" {own}" if own else "")
        m = _SHARD_DIR.match(Path(r.shard_dir).name) if r.shard_dir else None
        index = int(m.group(1)) if m else 0
        if r.shard_dir:
            name += f" {Path(r.shard_dir).name}"
        if not r.run_dir:
            row = Row(kind="point", name=name, path=str(root), state="failed" if r.status == "failed" else "queued")
            row.exit_code, row.line = r.exit_code, r.error or None
            if r.status == "failed":
                row.next = "fix what its line says, then re-run the sweep's command"
            elif gone:
                row.state, row.line = "stopped", "the sweep's process is gone before this point started"
                row.next = "re-run the sweep's command: finished points are not run again"
            elif alive == {"stopped"}:
                row.line = "waiting: the sweep's process is stopped (SIGSTOP or Ctrl-Z)"
            else:
                row.line = "waiting for its turn (the points play one after the other)"
                row.next = "wait: the sweep plays it after the points before it"
            out.append(row)
            continue
        part = Path(r.shard_dir or r.run_dir)
        if r.status in ("done", "failed", "stopped") and not part.is_dir():
            fix = "re-run the sweep's command to play it again, or restore the directory"
            out.append(_damaged("point", name, part, "run directory", "not found (moved or deleted?)", fix))
            continue
        note = {"failed": r.error, "pending": "waiting for its group's engines"}.get(r.status)
        row = classify(part, "point", name, now, t, tasks.get(index) if count > 1 else None, note=note or None)
        if row.state in ("queued", "stopped") and r.status == "failed":
            row.state, row.exit_code, row.line = "failed", r.exit_code, r.error or row.line
            row.next = f"read {part / ENGINE_LOG}; re-run the sweep's command: finished points are not run again"
        elif count == 1 and row.heartbeat_age_s is None and (row.state, r.status) in _STARTING:
            # Its run has no heartbeat yet: the sweep's process is checking it or loading its engines.
            if gone:
                row.state = "failed"
                row.line = "the sweep's process is gone (killed?) before this point's first heartbeat"
                row.next = "re-run the sweep's command: it resumes from the checkpoints"
            else:
                row.state, row.line, row.next = "running", "starting: no heartbeat yet", None
        out.append(row)
    return out


_STARTING = {("queued", "running"), ("stopped", "running")}
GLOB_CHARS = set("*?[")


def status_rows(entries: list[str], t: Thresholds, now: float, slurm: bool = True) -> list[Row]:
    """Rows for each `runs=` entry: a run directory (one row), a sharded run (a row per shard), a sweep
    folder (a row per point and shard), a glob (each matching directory that is one of these; a folder it
    matches that is none is left out). A named entry that is none of these: an InputError."""
    out: list[Row] = []
    for entry in entries:
        if GLOB_CHARS & set(entry):
            root = Path(entry).expanduser()
            anchor = Path(root.anchor) if root.is_absolute() else Path(".")
            pattern = str(root.relative_to(root.anchor)) if root.is_absolute() else str(root)
            try:
                found = sorted(str(p) for p in anchor.glob(pattern) if p.is_dir())
            except (ValueError, OSError) as exc:
                raise InputError(entry, "runs", f"not a pattern this can read ({exc})") from None
            rows = [r for f in found if (what := _what(Path(f))) for r in _rows(Path(f), what, t, now, slurm)]
            if not rows:
                raise InputError(entry, "runs", "no run directory, sharded run or sweep folder matches this pattern")
            out += rows
        else:
            out += rows_for(entry, t, now, slurm)
    return out


def _what(root: Path) -> str | None:
    """What a directory is: a sweep folder, a sharded run, a run; None when none of these."""
    if not (root / RESULTS).is_dir() and (any(root.glob("index*.json")) or _point_folders(root)):
        return "sweep"
    if shard_dirs(root) or (root / SUBMIT_STATE).is_file():
        return "shards"
    return "run" if _is_run(root) else None


def _point_folders(root: Path) -> bool:
    """A sweep's folder before its index: Hydra's `multirun.yaml`, or a numbered folder that points at its run."""
    return (root / "multirun.yaml").is_file() or (root / "0" / POINT_LINK).exists()


def _rows(root: Path, what: str, t: Thresholds, now: float, slurm: bool) -> list[Row]:
    if what == "sweep":
        return _sweep_rows(root, now, t, slurm)
    if what == "shards":
        return _shard_rows(root, now, t, slurm, root.name)
    return [classify(root, "run", root.name, now, t)]


def rows_for(entry: str, t: Thresholds, now: float, slurm: bool = True) -> list[Row]:
    root = Path(entry).expanduser()
    if not root.is_dir():
        raise InputError(root, "runs", "no such directory" if not root.exists() else "not a directory")
    what = _what(root)
    if what is None:
        raise InputError(
            root, "runs", "not a run directory, a sharded run or a sweep folder (no manifest, results/, shards, index)"
        )
    return _rows(root, what, t, now, slurm)


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
