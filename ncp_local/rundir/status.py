"""`mode=status`'s rows for each `runs=` entry, their total and the JSON document.

An entry is a run directory (one row), a sharded run (a row per shard, from its submission record and
the shard directories), a sweep folder (a row per point and shard, from its index: under the basic
launcher as under the batched one, from its first point), or a glob of these. Each row is
rundir/status_row.py's `classify`; a record that says where the runs are (the index, `submit.json`)
and cannot be read is a `damaged` row naming it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from .heartbeat import Damaged
from .layout import ENGINE_LOG, MANIFEST, RESULTS, STATUS, SUBMIT_STATE, shard_dirs, shard_name
from .slurm import SubmitRecord, read_submit, tasks_of
from .status_row import STATES, Row, Thresholds, classify, pid_state, quantile, stall_threshold
from .sweep_index import POINT_LINK, read_sweep

__all__ = [
    "STATES",
    "Row",
    "Thresholds",
    "Total",
    "document",
    "pid_state",
    "quantile",
    "rows_for",
    "stall_threshold",
    "status_rows",
    "total",
]
DOC_KIND = "ncp-status"
DOC_VERSION = 1


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
    tasks = tasks_of(root, count, slurm, rec if isinstance(rec, SubmitRecord) else None)
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
        row = Row(kind="sweep", name=root.name, path=str(root), state="queued", line="no point has started yet")
        row.next = "wait: the sweep's first point is being checked"
        return [row]
    rows = [r for index in indexes for r in index.points]
    # The process that writes the index: a point it has not finished is its to play, while it lives.
    alive = {pid_state(i.pid, i.host) if i.pid and i.host else None for i in indexes}
    gone = alive == {"gone"}
    shared = set.intersection(*(set(r.overrides) for r in rows)) if rows else set()
    rec = read_submit(root)
    count = rec.shards if isinstance(rec, SubmitRecord) else 1
    tasks = tasks_of(root, count, slurm, rec if isinstance(rec, SubmitRecord) else None)
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
                row.next = f"kill -CONT {indexes[0].pid} resumes the sweep"
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
            rows = [r for f in found for r in _matched(Path(f), t, now, slurm)]
            if not rows:
                raise InputError(entry, "runs", "no run directory, sharded run or sweep folder matches this pattern")
            out += rows
        else:
            out += rows_for(entry, t, now, slurm)
    return out


def _matched(root: Path, t: Thresholds, now: float, slurm: bool) -> list[Row]:
    """A folder a glob matched: its rows, none when it is no run, one naming it when it cannot be read."""
    try:
        what = _what(root)
        return _rows(root, what, t, now, slurm) if what else []
    except OSError as exc:
        return [_damaged("run", root.name, root, "folder", f"cannot read it ({exc.strerror or exc})", "check it")]


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
