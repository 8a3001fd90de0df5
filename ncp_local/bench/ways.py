"""`mode=bench`'s four ways of running one workload (rig, sequential, ceiling, replay_k) and their tallies."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import validate
from ..engines.base import Completion, Engine, Request
from ..execution import points
from ..execution.engine_pool import EnginePool
from ..execution.life import Life, Point, prepared_run
from ..exits import EXIT_SIGNAL
from ..protocol.trials import episode_name
from ..rundir import layout, provenance
from ..rundir.call_log import CallLine, read_calls
from .figures import WayFigures


class Stopped(Exception):
    """A way stopped by SIGTERM or SIGINT: the bench stops there, with the signal's exit code."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.code = EXIT_SIGNAL.get(signal_name, EXIT_SIGNAL["SIGINT"])


def played(what: str, life: Life, point: Point) -> None:
    """Raises unless `point` played to the end: `Stopped` when a signal stopped it, else what ended it."""
    if point.status == "stopped":
        raise Stopped(life.stopped[0] if life.stopped else "SIGINT")
    if point.status != "done":
        raise RuntimeError(f"bench: {what} ended {point.status}: {point.message or f'exit {point.code}'}")


# The paper's grid, for the cost projection.
PAPER_NARRATORS = 6
PAPER_SPECS = 100
PAPER_TURNS = 100


@dataclass
class Tally:
    """One way of running a workload: its wall time, calls and tokens."""

    name: str
    wall_s: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.generated_tokens) / self.wall_s if self.wall_s else 0.0


@dataclass
class Way(Tally):
    cached_tokens: int = 0
    turns: int = 0
    overhead_ms: float | None = None
    tokens_by_turn: dict[int, tuple[int, int]] = field(default_factory=dict)  # (prompt, cached)
    by_episode: dict[str, tuple[int, int]] = field(default_factory=dict)  # (calls, generated tokens)
    # Time-average of calls in flight (summed latency / wall): how full the way kept the engine.
    in_flight: float = 0.0
    prompt_by_turn: dict[int, float] = field(default_factory=dict)

    def row(self) -> str:
        w = self.wall_s or float("nan")
        turns = f"{60 * self.turns / w:.1f}" if self.turns else "-"
        over = f"{self.overhead_ms:.2f}" if self.overhead_ms is not None else "-"
        return (
            f"| {self.name} | {self.wall_s:.1f} | {self.calls} | {self.prompt_tokens / w:.0f} "
            f"| {self.cached_tokens / w:.0f} | {self.generated_tokens / w:.1f} | {self.tokens_per_s:.0f} "
            f"| {turns} | {over} |"
        )


def way_figures(way: Way) -> WayFigures:
    """A table row as a record (raw counts and the printed rates unrounded)."""
    w = way.wall_s

    def rate(x: float) -> float:
        return x / w if w else 0.0

    return WayFigures(
        key=way.name.split(" ", 1)[0],
        name=way.name,
        wall_s=w,
        calls=way.calls,
        prompt_tokens=way.prompt_tokens,
        cached_tokens=way.cached_tokens,
        generated_tokens=way.generated_tokens,
        prompt_tok_s=rate(way.prompt_tokens),
        cached_tok_s=rate(way.cached_tokens),
        generated_tok_s=rate(way.generated_tokens),
        total_tok_s=way.tokens_per_s,
        turns_per_min=60 * rate(way.turns) if way.turns else None,
        overhead_ms=way.overhead_ms,
        in_flight=way.in_flight,
    )


def ratio_of(x: float, y: float) -> float:
    return x / y if y else float("nan")


HEADER = (
    "| way | wall s | calls | prompt tok/s | cached tok/s | generated tok/s | total tok/s "
    "| turns/min | overhead ms/call (median) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


class Recorder:
    """Passes calls through to the engine and keeps every request it saw (in `requests`, which the
    recorders of several roles may share)."""

    def __init__(self, inner: Engine, requests: list[Request] | None = None) -> None:
        self.inner = inner
        self.requests: list[Request] = [] if requests is None else requests

    async def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        return await self.inner.generate(request)

    async def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # count_tokens etc. of the engine
        return getattr(self.inner, name)


def cycled(spec_ids: Sequence[str], k: int) -> tuple[str, ...]:
    """K episodes cycling over the stories: the first round trial 0 of each, the next trial 1, ..."""
    return tuple(episode_name(spec_ids[i % len(spec_ids)], i // len(spec_ids)) for i in range(k))


# What the bench's command says that is not the run its ways play.
_NOT_THE_RUN = (
    "mode",
    "bench.",
    "out_dir",
    "progress",
    "concurrency",
    "max_turns",
    "trials.count",
    "speculative_player",
)


def run_overrides(given: Sequence[str], extra: Sequence[str]) -> list[str]:
    """A `mode=run` of the bench's command: its own overrides (not its mode or the bench's), then `extra`."""
    own = [o for o in given if not o.split("=", 1)[0].lstrip("+~").startswith(_NOT_THE_RUN)]
    return [*own, "mode=run", "progress=false", *extra]


def bench_point(out: Path, k: int, turns: int, concurrency: int, extra: Sequence[str] = ()) -> Point:
    """The bench's workload as `mode=run` plays it: the command's run, its first `k` episodes (the
    stories cycled, a trial per round) played through `turns` turns, `concurrency` at once, into `out`;
    checked as mode=run checks it (pre-flight) before anything starts. Without the speculative player
    (`extra` may turn it on: bench.speculative's way): with it an episode has two calls in flight during its
    audits, which the replay (one per episode) never has, so rig/replay_k would weigh the speculation's
    cost to the engine, not the rig's own (0.72 and 0.75 with it on the embedded model; fceb218's bench,
    which played without it, 1.00). `out` is cleared first: a way that resumed an earlier bench's finished
    run directory (the same `out_dir` given twice) would make no call and measure nothing."""
    shutil.rmtree(out, ignore_errors=True)
    overrides = run_overrides(
        provenance.command()["overrides"],
        [
            f"out_dir={out}",
            f"max_turns={turns}",
            f"concurrency={concurrency}",
            f"trials.count={k}",
            "speculative_player=false",
            *extra,
        ],
    )
    p = prepared_run(validate(points.load(overrides)))
    assert p.ready is not None and p.ready.dataset is not None
    p.only = cycled([s.id for s in p.ready.dataset.specs], k)
    p.play_through = True  # exactly k x turns turns whatever the model says: every way makes the same calls
    return p


def _summarise(way: Way, lines: list[CallLine]) -> None:
    calls = [c for c in lines if c.prompt_tokens is not None]  # left out: never reached the engine
    way.calls = len(calls)
    way.prompt_tokens = sum(c.prompt_tokens or 0 for c in calls)
    way.cached_tokens = sum(c.cached_tokens or 0 for c in calls)
    way.generated_tokens = sum(c.generated_tokens or 0 for c in calls)
    overheads = [c.overhead_s for c in calls if c.overhead_s is not None]
    way.overhead_ms = 1000 * statistics.median(overheads) if overheads else None
    by_turn: dict[int, tuple[int, int]] = {}
    alive: dict[int, set[str]] = {}
    for c in calls:
        p, h = by_turn.get(c.turn, (0, 0))
        by_turn[c.turn] = (p + (c.prompt_tokens or 0), h + (c.cached_tokens or 0))
        episode = episode_name(c.spec_id, c.trial)
        alive.setdefault(c.turn, set()).add(episode)
        n, g = way.by_episode.get(episode, (0, 0))
        way.by_episode[episode] = (n + 1, g + (c.generated_tokens or 0))
    way.tokens_by_turn = dict(sorted(by_turn.items()))
    if way.wall_s:
        way.in_flight = sum(c.latency_s or 0.0 for c in calls) / way.wall_s
    way.prompt_by_turn = {t: p / len(alive[t]) for t, (p, _) in way.tokens_by_turn.items()}


async def reset_cache(backend: Any) -> None:
    reset = getattr(backend, "reset_prefix_cache", None)
    if reset is not None:
        await reset()


async def run_rig(name: str, point: Point, pool: EnginePool, wrap: Callable[[Engine], Engine] | None = None) -> Way:
    """One point played by `mode=run`'s life on the bench's engines (kept between ways). Its wall time
    runs from the first call's start to the last call's answer, as a replay's does: the run directory's
    opening and sealing (the manifest's provenance: git, versions) are the same for every run and
    workload, and would only blur the rig's pace between the calls."""
    life = Life([point], pool=pool, wrap=wrap)
    await life.run()
    played(f"way {name!r}", life, point)
    assert point.out is not None
    calls = read_calls(point.out / layout.CALLS)
    timed = [c for c in calls if c.done_at is not None]
    first = min((c.done_at - (c.latency_s or 0.0) for c in timed if c.done_at is not None), default=0.0)
    way = Way(name, wall_s=max((c.done_at for c in timed if c.done_at is not None), default=0.0) - first)
    way.turns = sum(len(r.turns) for r in point.results.values())
    _summarise(way, calls)
    return way


def _as_logged(requests: list[Request], outs: Sequence[Completion | None]) -> list[CallLine]:
    """Each answer of a replay as the rig would have logged it: one summary reads every way."""
    return [
        CallLine(
            spec_id=str(r.tags.get("episode", "")),
            turn=int(r.tags.get("turn", 0)),
            stage=str(r.tags.get("stage", "")),
            role=str(r.tags.get("role", "")),
            model="",
            attempt=int(r.tags.get("attempt", 0)),
            seed=r.seed,
            prompt_tokens=o.prompt_tokens,
            cached_tokens=o.cached_tokens,
            generated_tokens=o.generated_tokens,
            latency_s=o.latency_s,
        )
        for r, o in zip(requests, outs, strict=True)
        if o is not None
    ]


async def run_ceiling(backend: Engine, requests: list[Request], turns: int) -> Way:
    started = time.perf_counter()
    outs = await asyncio.gather(*(backend.generate(r) for r in requests))
    way = Way("c ceiling (same requests, one batch)", wall_s=time.perf_counter() - started, turns=turns)
    _summarise(way, _as_logged(requests, outs))
    way.overhead_ms = None
    return way


async def run_replay_k(backend: Engine, requests: list[Request], turns: int) -> Way:
    """The exact requests the rig sent, replayed with at most one in flight per episode: each
    episode's requests in the order the rig sent them, the next one once the previous has
    answered, every episode at once. As many in flight as the rig could have had (a turn is a
    chain of dependent calls), none of its own work between calls: rig/replay_k is the rig's
    overhead alone, where rig/ceiling (everything in one batch) also counts what more episodes
    at once would buy."""
    chains: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        chains.setdefault(str(r.tags.get("episode", "")), []).append(i)
    outs: list[Completion | None] = [None] * len(requests)

    async def chain(indices: list[int]) -> None:
        for i in indices:
            outs[i] = await backend.generate(requests[i])

    started = time.perf_counter()
    await asyncio.gather(*(chain(ix) for ix in chains.values()))
    way = Way(
        f"d replay_k (same requests, one in flight per episode, {len(chains)} at once)",
        wall_s=time.perf_counter() - started,
        turns=turns,
    )
    _summarise(way, _as_logged(requests, outs))
    way.overhead_ms = None
    return way


def silent(line: str) -> None:
    """The default `note` of the benches: progress lines go nowhere."""


def say(line: str) -> None:
    """A progress line of a long bench, on stderr so the results on stdout stay clean."""
    print(line, file=sys.stderr, flush=True)
