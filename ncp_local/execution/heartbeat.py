"""A running process's heartbeat: `status.json` in its run (or shard) directory, rewritten every few seconds.

The record's format is rundir/heartbeat.py's, and `mode=status` reads it there (rundir/status.py)
to say where a run stands without asking the process. A clean exit writes the final state (done,
failed, stopped) with its exit code and the line that ended it; a process killed with SIGKILL writes
nothing more, so its heartbeat goes stale, and that is how it is found out.

The file is written by a daemon thread, not the event loop: a process whose loop is blocked (a hung
call into an engine) keeps beating, so its figures, not a missing heartbeat, say it is stalled; a
stopped or killed process stops beating. Writing never fails the run: the first failure (disk full,
a read-only directory) is warned once and the run goes on without it. The file is bookkeeping: it is
not part of the results, the identity or any seal, and a merge never copies it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..rundir.atomic import DiskFull, atomic_write, is_disk_full
from ..rundir.heartbeat import STATES, WINDOW_S, Beat, iso
from ..rundir.layout import STATUS

# Per-episode turn durations kept: enough for a 90th percentile that one slow turn does not move much.
TURN_SAMPLES = 64
# The Slurm variables a task runs with; the status joins squeue/sacct by them (rundir/slurm.py).
SLURM_ENV = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID"}


def slurm_ids(env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) if env is None else env
    return {k: env[v] for k, v in SLURM_ENV.items() if env.get(v)}


@dataclass
class Counts:
    """One run directory's episode and turn figures at one moment (from the progress's tallies)."""

    finished: int
    total: int
    committed: int
    possible: int


class Heartbeat:
    """status.json of one run (or shard) directory: events in from the progress, a file out every `every_s`."""

    def __init__(
        self,
        root: Path,
        counts: Callable[[], Counts],
        every_s: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(root) / STATUS
        self.counts = counts
        self.every_s = every_s
        self.wall = wall
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.started_at = wall()
        self.playing_since: float | None = None
        self.last_turn_at: float | None = None
        self.last_call_at: float | None = None
        self.calls = 0
        self.tokens = 0
        # The window's calls and committed turns by whole second, [second, count, tokens]: a window of
        # 300 s at 2,000 calls/s held 600,000 entries (72 MB, 90 kB an episode at 800) that each beat summed
        # under the lock the loop takes for every call (20 ms).
        self._calls: deque[list[int]] = deque()
        self._turns: deque[list[int]] = deque()
        self._turn_s: deque[float] = deque(maxlen=TURN_SAMPLES)
        self._episode_at: dict[str, float] = {}  # episode -> when its last turn was committed
        self.final: tuple[str, int | None, str | None] | None = None

    # -- events (the event loop's thread) ----------------------------------------------
    def playing(self) -> None:
        self.playing_since = self.wall()

    def turn(self, episode: str, new_turns: int) -> None:
        """`new_turns` turns of `episode` committed now (0: a resumed checkpoint reported, nothing new)."""
        if new_turns <= 0:
            return
        now = self.wall()
        with self._lock:
            before = self._episode_at.get(episode)
            if before is not None:
                # Between two commits of the same episode: one turn's own time, whatever else runs beside it.
                self._turn_s.append((now - before) / new_turns)
            self._episode_at[episode] = now
            _count(self._turns, now, new_turns, 0)
            self.last_turn_at = now

    def ended(self, episode: str) -> None:
        with self._lock:
            self._episode_at.pop(episode, None)

    def call(self, tokens: int) -> None:
        now = self.wall()
        with self._lock:
            self.calls += 1
            self.tokens += tokens
            _count(self._calls, now, 1, tokens)
            self.last_call_at = now

    # -- the file ----------------------------------------------------------------------
    def snapshot(self) -> Beat:
        now = self.wall()
        c = self.counts()
        with self._lock:
            for q in (self._calls, self._turns):
                while q and q[0][0] + 1 <= now - WINDOW_S:  # a second wholly before the window
                    q.popleft()
            # The window, or the time since the engines were up if shorter (rates then measure work, not loading).
            since = self.playing_since if self.playing_since is not None else self.started_at
            span = max(min(WINDOW_S, now - since), 1e-9)
            calls, tokens = sum(b[1] for b in self._calls), sum(b[2] for b in self._calls)
            turns = sum(b[1] for b in self._turns)
            state, code, error = self.final or ("running", None, None)
            return Beat(
                state=state,
                every_s=self.every_s,
                episodes_finished=c.finished,
                episodes_total=c.total,
                turns_committed=c.committed,
                turns_possible=c.possible,
                calls_per_s=round(calls / span, 4),
                tokens_per_s=round(tokens / span, 2),
                turns_per_s=round(turns / span, 5),
                calls=self.calls,
                tokens=self.tokens,
                last_turn_at=iso(self.last_turn_at),
                last_call_at=iso(self.last_call_at),
                playing_since=iso(self.playing_since),
                turn_seconds=[round(s, 3) for s in self._turn_s],
                host=socket.gethostname(),
                pid=os.getpid(),
                slurm=slurm_ids(),
                started_at=iso(self.started_at) or "",
                updated_at=iso(now) or "",
                exit_code=code,
                error=error,
            )

    def write(self) -> None:
        try:
            atomic_write(self.path, json.dumps(self.snapshot().model_dump(), indent=1) + "\n")
        except Exception as exc:  # never the run's failure: the status is a courtesy
            if isinstance(exc, DiskFull) or is_disk_full(exc):
                return  # the run's own next write says it, in its one line (exit 4)
            if not self._warned:
                self._warned = True
                print(f"warning: {self.path}: heartbeat not written ({exc}); the run goes on", file=sys.stderr)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path.parent.name}", daemon=True)
        self._thread.start()

    def finish(self, state: str, exit_code: int | None = None, error: str | None = None) -> None:
        """The last write: `state` (done, failed, stopped), the exit code and the line that ended it."""
        assert state in STATES[1:], state
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.every_s, 1.0) + 5.0)
            self._thread = None
        self.final = (state, exit_code, error)
        self.write()


def _count(window: deque[list[int]], now: float, n: int, tokens: int) -> None:
    """Add `n` events (and their tokens) at `now` to `window`'s bucket of that second."""
    second = int(now)
    if window and window[-1][0] == second:
        window[-1][1] += n
        window[-1][2] += tokens
    else:
        window.append([second, n, tokens])
