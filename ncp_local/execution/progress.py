"""Progress that means something on long runs: turns, not episodes.

A 100-turn episode is hours of work, so a bar of finished episodes sits at
0 for hours. This counts turns committed out of the turns still possible
(an episode that ends early gives up its remaining turns, so the total
shrinks), model calls and tokens per second, and an ETA from the turn rate
(an upper bound: episodes that end early finish sooner). On a terminal it
is a tqdm bar; otherwise (Slurm logs, pipes) one plain line every
`every_s` seconds and a last one at the end. A sweep adds its points:
done, running, waiting, failed.

Calls are counted by wrapping each backend (`Metered`), turns by the
runner's `on_turn` and `on_result` hooks; nothing here changes what a run
computes. The same events feed each run directory's heartbeat
(`status.json`, execution/heartbeat.py) when `heartbeat_s` is set: a single
run's for as long as `beating` holds it, a sweep point's from `point(...,
"running")` to its end.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from ..engines.base import Completion, Engine, Request
from ..errors import OutputClosed, closed_outputs
from ..exits import EXIT_CLOSED_PIPE, EXIT_FAILED, EXIT_OK, EXIT_SIGNAL
from ..rundir.layout import checkpointed, result_file, turns_recorded
from .failures import exit_for
from .heartbeat import Counts, Heartbeat

POINT_STATES = ("waiting", "running", "done", "failed")


@dataclass
class _Episodes:
    committed: dict[str, int] = field(default_factory=dict)
    possible: dict[str, int] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)


@dataclass
class Ending:
    """How a run held by `Progress.beating` ended when its block returned: done, exit 0, unless the block
    says otherwise (a run whose finished episodes measured nothing is failed, exit 5)."""

    state: str = "done"
    code: int = EXIT_OK
    error: str | None = None

    def failed(self, code: int, error: str) -> None:
        self.state, self.code, self.error = "failed", code, error


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """Turns committed / possible, calls/s, tokens/s and ETA for one run or a whole sweep."""

    def __init__(
        self,
        enabled: bool = True,
        every_s: float = 30.0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float = 0.0,
    ) -> None:
        self.enabled = enabled
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.runs: dict[str, _Episodes] = {}
        self.points: dict[str, str] = {}  # sweep point -> state (empty for a single run)
        self.calls = 0
        self.tokens = 0
        self.started: float | None = None
        self.committed_at_start = 0
        self._last_line = 0.0
        self._last_draw = 0.0
        self._bar: Any = None
        self._printed = ""
        self.heartbeat_s = heartbeat_s  # 0: no status.json (bench, tests)
        self.roots: dict[str, Path] = {}  # run key -> its run (or shard) directory
        self.beats: dict[str, Heartbeat] = {}  # the heartbeats still beating
        self._point_beats: set[str] = set()  # begun by point(): a close() ends them as stopped

    # -- what there is to do ---------------------------------------------------------
    def add_run(self, key: str, spec_ids: Iterable[str], max_turns: int, root: Path | None = None) -> None:
        """Register a run's episodes; finished ones and checkpoints already on disk count as done work."""
        ep = self.runs.setdefault(key, _Episodes())
        if root is not None:
            self.roots[key] = Path(root)
        logs = checkpointed(root) if root is not None else {}
        for sid in spec_ids:
            done = result_file(root, sid) if root is not None else None
            if done is not None and done.exists():
                n = turns_recorded(done)
                ep.committed[sid] = ep.possible[sid] = n
                ep.finished.add(sid)
                continue
            ep.committed[sid] = logs.get(sid, 0)
            ep.possible[sid] = max_turns

    def point(self, key: str, state: str, code: int | None = None, error: str | None = None) -> None:
        """A sweep point's state; its heartbeat runs from "running" to its end (`code`, `error`: a failure's)."""
        assert state in POINT_STATES, state
        self.points[key] = state
        if state == "running":
            self._point_beats.add(key)
            self.begin_beat(key)
        elif state in ("done", "failed"):
            self.end_beat(key, state, code, error)
        self._tick(force=state in ("done", "failed"))

    # -- heartbeats -------------------------------------------------------------------
    def _counts(self, key: str) -> Counts:
        ep = self.runs.get(key) or _Episodes()
        # Copies first: the heartbeat's thread reads while the event loop writes (a dict copy is atomic).
        committed, possible = dict(ep.committed), dict(ep.possible)
        return Counts(len(ep.finished), len(possible), sum(committed.values()), sum(possible.values()))

    def begin_beat(self, key: str) -> None:
        root = self.roots.get(key)
        if self.heartbeat_s <= 0 or root is None or key in self.beats:
            return
        beat = Heartbeat(root, lambda: self._counts(key), self.heartbeat_s)
        if self.started is not None:
            beat.playing()
        self.beats[key] = beat
        beat.start()

    def end_beat(self, key: str, state: str, code: int | None = None, error: str | None = None) -> None:
        beat = self.beats.pop(key, None)
        if beat is not None:
            beat.finish(state, code, error)

    @contextmanager
    def beating(self, key: str, stopped: list[str] | None = None) -> Iterator[Ending]:
        """A run's heartbeat while the block runs, and its final state, with the process's exit code, by how
        the block ended: as its `Ending` says (returned), stopped (cancelled by the signal named in
        `stopped`, or its output's reader gone), failed (an exception: its exit)."""
        self.begin_beat(key)
        ending = Ending()
        try:
            yield ending
        except asyncio.CancelledError:
            name = stopped[0] if stopped else None
            self.end_beat(key, "stopped", EXIT_SIGNAL.get(name) if name else None, f"stopped by {name or 'a cancel'}")
            raise
        except BaseException as exc:
            if isinstance(exc, (BrokenPipeError, OutputClosed)) and closed_outputs():
                # A progress line to a closed pipe (`2>&1 | head`): the entry ends the process quietly.
                self.end_beat(key, "stopped", EXIT_CLOSED_PIPE, "stopped: the reader of its output closed it")
                raise
            known = exit_for(exc) if isinstance(exc, Exception) else None
            code = known.code if known is not None else EXIT_FAILED
            line = known.message if known is not None else f"{type(exc).__name__}: {exc}"
            self.end_beat(key, "failed", code, (line.splitlines() or [""])[0])
            raise
        else:
            self.end_beat(key, ending.state, ending.code, ending.error)

    # -- events -----------------------------------------------------------------------
    def start(self) -> None:
        """The clock starts once the engines are up: rates measure work, not model loading."""
        self.started = self.clock()
        self._last_line = self.started
        self.committed_at_start = self.committed
        for beat in self.beats.values():
            beat.playing()
        if self.enabled and self.tty:
            self._bar = tqdm(
                total=self.possible,
                initial=self.committed,
                desc="turns",
                unit="turn",
                file=self.stream,
                dynamic_ncols=True,
            )
        self._tick(force=not self.tty)

    def turn(self, key: str, spec_id: str, committed: int) -> None:
        ep = self.runs.setdefault(key, _Episodes())
        before = ep.committed.get(spec_id, 0)
        ep.committed[spec_id] = committed
        beat = self.beats.get(key)
        if beat is not None:
            beat.turn(spec_id, committed - before)
        self._tick()

    def result(self, key: str, spec_id: str, turns: int) -> None:
        ep = self.runs.setdefault(key, _Episodes())
        before = ep.committed.get(spec_id, 0)
        ep.committed[spec_id] = ep.possible[spec_id] = turns
        ep.finished.add(spec_id)
        beat = self.beats.get(key)
        if beat is not None:
            beat.turn(spec_id, turns - before)
            beat.ended(spec_id)
        self._tick()

    def call(self, completion: Completion, key: str | None = None) -> None:
        tokens = completion.prompt_tokens + completion.generated_tokens
        self.calls += 1
        self.tokens += tokens
        beat = self.beats.get(key) if key is not None else None
        if beat is not None:
            beat.call(tokens)
        self._tick()

    # -- figures ----------------------------------------------------------------------
    @property
    def committed(self) -> int:
        return sum(sum(ep.committed.values()) for ep in self.runs.values())

    @property
    def possible(self) -> int:
        return sum(sum(ep.possible.values()) for ep in self.runs.values())

    def eta_s(self) -> float | None:
        if self.started is None:
            return None
        elapsed = self.clock() - self.started
        done = self.committed - self.committed_at_start
        if done <= 0 or elapsed <= 0:
            return None
        return (self.possible - self.committed) / (done / elapsed)

    def line(self) -> str:
        committed, possible = self.committed, self.possible
        episodes = sum(len(ep.possible) for ep in self.runs.values())
        finished = sum(len(ep.finished) for ep in self.runs.values())
        elapsed = (self.clock() - self.started) if self.started is not None else 0.0
        pct = f" ({100 * committed / possible:.0f}%)" if possible else ""
        parts = [f"turns {committed}/{possible}{pct}", f"episodes {finished}/{episodes} finished"]
        if self.points:
            counts = {s: sum(v == s for v in self.points.values()) for s in POINT_STATES}
            parts.append(
                f"points {counts['done']}/{len(self.points)} done, {counts['running']} running"
                + (f", {counts['waiting']} waiting" if counts["waiting"] else "")
                + (f", {counts['failed']} failed" if counts["failed"] else "")
            )
        if elapsed > 0:
            parts.append(f"{self.calls / elapsed:.1f} calls/s, {self.tokens / elapsed:.0f} tok/s")
        eta = self.eta_s()
        parts.append(f"elapsed {duration(elapsed)}, ETA " + (f"<= {duration(eta)}" if eta is not None else "?"))
        return "progress: " + ", ".join(parts)

    # -- output -----------------------------------------------------------------------
    def _tick(self, force: bool = False) -> None:
        if not self.enabled or self.started is None:
            return
        now = self.clock()
        if self._bar is not None:
            if force or now - self._last_draw >= 0.5:
                self._last_draw = now
                self._bar.total = self.possible
                self._bar.n = self.committed
                eta = self.eta_s()
                elapsed = max(now - self.started, 1e-9)
                self._bar.set_postfix_str(
                    f"{self.calls / elapsed:.1f} calls/s, {self.tokens / elapsed:.0f} tok/s, "
                    f"ETA<={duration(eta) if eta is not None else '?'}",
                    refresh=False,
                )
                self._bar.refresh()
            return
        if force or now - self._last_line >= self.every_s:
            self._last_line = now
            self._print(self.line())

    def _print(self, line: str) -> None:
        # The same figures twice in a row (a forced line right after a timed one) say nothing new.
        if line != self._printed:
            self._printed = line
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        # A sweep point still beating at the end was stopped (a signal cancelled the sweep).
        for key in [k for k in self.beats if k in self._point_beats]:
            self.end_beat(key, "stopped", None, "the sweep stopped before this point finished")
        if not self.enabled or self.started is None:
            return
        if self._bar is not None:
            self._tick(force=True)
            self._bar.close()
            self._bar = None
        else:
            self._print(self.line())
        self.started = None


class Metered:
    """A backend that tells the progress about every completed call (of run `key`: its heartbeat's);
    everything else passes through."""

    def __init__(self, inner: Engine, progress: Progress, key: str | None = None) -> None:
        self.inner = inner
        self.progress = progress
        self.key = key

    async def generate(self, request: Request) -> Completion:
        out = await self.inner.generate(request)
        self.progress.call(out, self.key)
        return out

    async def close(self) -> None:
        return None  # the engine belongs to whoever started it

    def __getattr__(self, name: str) -> Any:  # count_tokens, tokenize, ... of the engine
        return getattr(self.inner, name)
