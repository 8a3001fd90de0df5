"""A running process's heartbeat as a record: `status.json` in its run (or shard) directory.

The writer is execution/heartbeat.py (a daemon thread rewrites the file every few seconds); the
reader is `mode=status` (rundir/status.py). The file holds the figures the progress line has
(episodes, turns committed and still possible, calls and tokens per second over the last minutes),
when the last turn was committed and the last call completed, the recent turn durations, and who is
writing (host, pid, Slurm job and task). A clean exit writes the final state (done, failed, stopped)
with its exit code and the line that ended it.

Read as untrusted input: `read` takes at most `MAX_BYTES`, refuses non-finite numbers, negative
counts, impossible pids and times that are not times, and says why in one phrase (`Damaged`), so
that a damaged file is named in its row and never misread or a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .layout import STATUS

SCHEMA = 1
STATES = ("running", "done", "failed", "stopped")
# Rates are over this window: long enough to smooth a turn of many calls, short enough to show a slowdown.
WINDOW_S = 300.0
# A heartbeat is a few kilobytes (64 turn durations at most); anything much larger is not one.
_R = TypeVar("_R", bound=BaseModel)
MAX_BYTES = 256_000
# Linux's largest pid (pid_max's ceiling): a larger one is no process's.
PID_MAX = 4_194_304


class Beat(BaseModel):
    """status.json as written (schema 1); readers take unknown keys without complaint."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    schema_version: int = SCHEMA
    state: str
    every_s: float = Field(gt=0)
    episodes_finished: int = Field(0, ge=0)
    episodes_total: int = Field(0, ge=0)
    turns_committed: int = Field(0, ge=0)
    turns_possible: int = Field(0, ge=0)
    window_s: float = WINDOW_S
    calls_per_s: float = Field(0.0, ge=0)
    tokens_per_s: float = Field(0.0, ge=0)
    turns_per_s: float = Field(0.0, ge=0)  # committed turns per second over the window: the ETA's rate
    calls: int = Field(0, ge=0)  # completed calls since this process started
    tokens: int = Field(0, ge=0)
    last_turn_at: str | None = None  # UTC ISO
    last_call_at: str | None = None
    playing_since: str | None = None  # when the engines were up (before: loading)
    turn_seconds: list[float] = []  # recent per-episode turn durations, oldest first
    host: str = ""
    pid: int = Field(0, ge=0, le=PID_MAX)
    slurm: dict[str, str] = {}
    started_at: str = ""
    updated_at: str = ""
    exit_code: int | None = Field(None, ge=0, le=255)
    error: str | None = None  # the line that ended it (failed or stopped)

    @field_validator("state")
    @classmethod
    def _a_state(cls, v: str) -> str:
        if v not in STATES:
            raise ValueError(f"state {v[:40]!r} is not one of {', '.join(STATES)}")
        return v

    @field_validator("turn_seconds")
    @classmethod
    def _durations(cls, v: list[float]) -> list[float]:
        if any(s < 0 for s in v):
            raise ValueError("a negative turn duration")
        return v

    @field_validator("last_turn_at", "last_call_at", "playing_since", "started_at", "updated_at")
    @classmethod
    def _a_time(cls, v: str | None) -> str | None:
        if v and ts(v) is None:
            raise ValueError(f"{v[:40]!r} is not a time")
        return v


@dataclass(frozen=True)
class Damaged:
    """A status.json that is there but cannot be read as a heartbeat, and why (one phrase)."""

    why: str


def iso(t: float | None) -> str | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


def ts(text: str | None) -> float | None:
    """An ISO time as seconds since the epoch; None when it is not one (a time without its zone is UTC,
    as the writer's are)."""
    if not text or not isinstance(text, str):
        return None
    try:
        t = dt.datetime.fromisoformat(text)
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        out = t.timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return out if math.isfinite(out) else None


def read_capped(path: Path, max_bytes: int) -> bytes | Damaged | None:
    """An untrusted record's bytes, at most `max_bytes` of them; None when there is no such file."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Damaged(f"unreadable ({exc.strerror or type(exc).__name__})")
    if len(data) > max_bytes:
        size = f"{max_bytes // 1_000_000} MB" if max_bytes >= 1_000_000 else f"{max_bytes // 1000} kB"
        return Damaged(f"larger than {size}")
    return data


def parse_record(data: bytes, model: type[_R]) -> _R | Damaged:
    """An untrusted record's bytes as `model`, or why not (not JSON, not an object, the first bad field)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        return Damaged(f"not JSON ({str(exc).splitlines()[0][:80]})")
    if not isinstance(doc, dict):
        return Damaged(f"a JSON {type(doc).__name__}, not an object")
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the record"
        return Damaged(f"{where}: {err['msg'][:100]}")


def read(part: Path) -> Beat | Damaged | None:
    """`part`'s heartbeat; None when it has none, `Damaged` (why) when the file cannot be read as one."""
    data = read_capped(Path(part) / STATUS, MAX_BYTES)
    if not isinstance(data, bytes):
        return data
    if not data.strip():
        return Damaged("empty")
    return parse_record(data, Beat)
