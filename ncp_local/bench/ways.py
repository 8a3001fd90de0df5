"""`mode=bench`'s four ways of running one workload (rig, sequential, ceiling, replay_k) and their tallies."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engines.base import Completion, Engine, Request
from ..execution.calls import CallService, RoleBinding
from ..execution.scheduler import EpisodeScheduler, EpisodeSettings
from ..protocol.player import Player
from ..protocol.prompts import PromptPack
from ..protocol.spec import Meta, Spec
from ..rundir.call_log import CallLine, read_calls
from ..rundir.store import RunDir
from .figures import WayFigures

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
    """Passes calls through to the engine and keeps every request it saw."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.requests: list[Request] = []

    async def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        return await self.inner.generate(request)

    async def close(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # count_tokens etc. of the engine
        return getattr(self.inner, name)


def workload(specs: tuple[Spec, ...], k: int) -> tuple[Spec, ...]:
    """K episodes cycling over the specs; repeats get their own id (own seeds)."""
    out = []
    for i in range(k):
        s = specs[i % len(specs)]
        if i >= len(specs):
            s = replace(
                s,
                meta=Meta(
                    id=f"{s.id}~{i // len(specs)}",
                    title=s.meta.title,
                    genres=s.meta.genres,
                    player_role=s.meta.player_role,
                ),
            )
        out.append(s)
    return tuple(out)


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
        alive.setdefault(c.turn, set()).add(c.spec_id)
        n, g = way.by_episode.get(c.spec_id, (0, 0))
        way.by_episode[c.spec_id] = (n + 1, g + (c.generated_tokens or 0))
    way.tokens_by_turn = dict(sorted(by_turn.items()))
    if way.wall_s:
        way.in_flight = sum(c.latency_s or 0.0 for c in calls) / way.wall_s
    way.prompt_by_turn = {t: p / len(alive[t]) for t, (p, _) in way.tokens_by_turn.items()}


async def reset_cache(backend: Any) -> None:
    reset = getattr(backend, "reset_prefix_cache", None)
    if reset is not None:
        await reset()


async def run_rig(
    name: str,
    specs: tuple[Spec, ...],
    roles: dict[str, RoleBinding],
    pack: PromptPack,
    narrator_cls: type,
    player: Player,
    seed: int,
    turns: int,
    concurrency: int,
    root: Path,
) -> Way:
    store = RunDir(root / name)
    store.open({"bench": name}, name)
    scheduler = EpisodeScheduler(
        specs=specs,
        calls=CallService(roles=roles, pack=pack, store=store, seed=seed),
        store=store,
        settings=EpisodeSettings(max_turns=turns, concurrency=concurrency, play_through=True),
        make_narrator=lambda: narrator_cls(pack=pack, roles=roles),
        player=player,
    )
    started = time.perf_counter()
    try:
        results = await scheduler.run()
    finally:
        store.close()
    way = Way(name, wall_s=time.perf_counter() - started)
    way.turns = sum(len(r.turns) for r in results.values())
    _summarise(way, read_calls(store.calls_path))
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
