"""Development only: what the event loop's long passes ran (`NCP_LOOP_PASSES_MS=<ms>` on the rig-alone bench).

The bench's probe says how long the loop stalled, not what ran meanwhile. With the variable set, every
pass of the loop and every handle it runs is timed on the loop thread's CPU (a core taken by another
process is not the loop's work); a pass over the threshold keeps what its handles were, grouped by where
each resumed and stopped (a task: its coroutine and the innermost await; a callback: its function), and
the collections it held, by generation. `NCP_LOOP_PASSES_PROFILE_MS=<ms>` also runs every handle under
cProfile (on the thread's CPU clock: slow) and keeps the profiles of the handles over that. Unset,
nothing is patched: no cost.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.events
import cProfile
import gc
import io
import os
import pstats
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ENV, PROFILE_ENV = "NCP_LOOP_PASSES_MS", "NCP_LOOP_PASSES_PROFILE_MS"


def where(callback: Any) -> str:
    """Where a task's step stands (its innermost awaiting coroutine and line), or the callback's name."""
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro: Any = task.get_coro()
        while getattr(getattr(coro, "cr_await", None), "cr_frame", None) is not None:
            coro = coro.cr_await
        frame = getattr(coro, "cr_frame", None)
        return f"{frame.f_code.co_qualname}:{frame.f_lineno}" if frame is not None else "(done)"
    return getattr(callback, "__qualname__", None) or type(callback).__name__


@dataclass
class LongPass:
    cpu_s: float
    handles: int
    by_label: dict[str, float]  # CPU seconds per label
    counts: Counter[str]  # handles per label
    longest: dict[str, float]  # the longest handle per label
    gc_s: float  # the collections in the pass


@dataclass
class Passes:
    threshold_s: float
    profile_s: float = 0.0  # profile the handles over this (0: none)
    passes: int = 0
    long: list[LongPass] = field(default_factory=list)
    gc_long: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # long passes' collections
    gc_full: list[float] = field(default_factory=list)  # every full collection while watched
    profiled: pstats.Stats | None = None
    _handles: list[tuple[float, Any, str]] = field(default_factory=list)
    _gc: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # this pass's
    _gc_start: float = 0.0

    def lines(self, worst: int = 8, top: int = 6) -> list[str]:
        total: dict[str, float] = defaultdict(float)
        counts: Counter[str] = Counter()
        for p in self.long:
            for k, s in p.by_label.items():
                total[k] += s
            counts.update(p.counts)
        longest = max((p.cpu_s for p in self.long), default=0.0)
        gcs = ", ".join(f"{g}: {s:.2f}" for g, s in sorted(self.gc_long.items()))
        out = [
            f"loop passes: {self.passes}, {len(self.long)} over {1000 * self.threshold_s:.0f} ms of the loop's CPU "
            f"({sum(p.cpu_s for p in self.long):.1f} s), the longest {1000 * longest:.0f} ms; in them, collections "
            f"by generation (s): {gcs}; full collections while watched: {len(self.gc_full)}, the longest "
            f"{1000 * max(self.gc_full, default=0):.0f} ms",
            "what the long passes ran (CPU s, handles, where each resumed -> where it stopped):",
        ]
        out += [f"  {s:8.2f} {counts[k]:8d}  {k}" for k, s in sorted(total.items(), key=lambda x: -x[1])[: top * 3]]
        if self.profiled is not None:
            text = io.StringIO()
            self.profiled.stream = text  # type: ignore[attr-defined]
            self.profiled.sort_stats("cumulative").print_stats(40)
            out += text.getvalue().splitlines()
        for p in sorted(self.long, key=lambda p: -p.cpu_s)[:worst]:
            out.append(
                f"pass of {1000 * p.cpu_s:.0f} ms CPU ({p.handles} handles, collections {1000 * p.gc_s:.0f} ms):"
            )
            out += [
                f"  {1000 * s:7.1f} ms {p.counts[k]:6d} (longest {1000 * p.longest[k]:5.1f})  {k}"
                for k, s in sorted(p.by_label.items(), key=lambda x: -x[1])[:top]
            ]
        return out


def label(callback: Any, resumed: str) -> str:
    """A handle's run: a task's coroutine, where it resumed and where it stopped; or the callback."""
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        return f"{getattr(task.get_coro(), '__qualname__', '?')}: {resumed} -> {where(callback)}"
    return resumed


@contextmanager
def watching(threshold_ms: float | None = None) -> Iterator[Passes | None]:
    """Time every loop pass and handle while inside (the threshold from `NCP_LOOP_PASSES_MS` if not
    given); yields None, patching nothing, when neither says."""
    if threshold_ms is None:
        threshold_ms = float(os.environ.get(ENV) or 0) or None
    if threshold_ms is None:
        yield None
        return
    w = Passes(threshold_ms / 1000, float(os.environ.get(PROFILE_ENV) or 0) / 1000)
    run_handle = asyncio.events.Handle._run
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def timed_handle(self: asyncio.events.Handle) -> None:
        callback = self._callback  # type: ignore[attr-defined]
        resumed = where(callback)  # before it runs: after, a task stands where it stopped
        profile = cProfile.Profile(time.thread_time) if w.profile_s else None  # CPU, not the GIL's waits
        t = time.thread_time()
        if profile is None:
            run_handle(self)
        else:
            profile.runcall(run_handle, self)
        took = time.thread_time() - t
        w._handles.append((took, callback, resumed))
        if profile is not None and took > w.profile_s:
            w.profiled = pstats.Stats(profile) if w.profiled is None else w.profiled.add(profile)

    def timed_pass(self: Any) -> None:
        t = time.thread_time()
        w._handles, w._gc = [], defaultdict(float)
        run_once(self)
        w.passes += 1
        cpu = time.thread_time() - t
        if cpu <= w.threshold_s:
            return
        by: dict[str, float] = defaultdict(float)
        n: Counter[str] = Counter()
        longest: dict[str, float] = defaultdict(float)
        for s, callback, resumed in w._handles:
            k = label(callback, resumed)  # a task runs once a pass: where it stopped is still where it is
            by[k] += s
            n[k] += 1
            longest[k] = max(s, longest[k])
        by["(the loop itself: select, timers)"] = cpu - sum(by.values())
        for g, s in w._gc.items():
            w.gc_long[g] += s
        w.long.append(LongPass(cpu, len(w._handles), by, n, longest, sum(w._gc.values())))

    loop_thread = threading.get_ident()  # asyncio.run's, inside

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != loop_thread:
            return  # the writer thread's
        if phase == "start":
            w._gc_start = time.thread_time()  # the loop's CPU: a collection preempted by another process is not longer
            return
        took = time.thread_time() - w._gc_start
        w._gc[info["generation"]] += took
        if info["generation"] == 2:
            w.gc_full.append(took)

    asyncio.events.Handle._run = timed_handle  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_pass  # type: ignore[attr-defined]
    gc.callbacks.append(on_gc)
    try:
        yield w
    finally:
        asyncio.events.Handle._run = run_handle  # type: ignore[method-assign]
        asyncio.base_events.BaseEventLoop._run_once = run_once  # type: ignore[attr-defined]
        gc.callbacks.remove(on_gc)
