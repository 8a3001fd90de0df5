"""`mode=bench`: the rig against one call at a time and against the engine's ceiling.

One fixed workload (K episodes x T turns, fixed seeds) runs three ways on
one engine, in one process, one after the other:

  a. rig:        every episode concurrent (what `mode=run` does);
  b. sequential: one episode after another, one call in flight (the
                 reference implementation's design);
  c. ceiling:    the exact requests (a) sent, replayed to the engine all at
                 once with the same sampling and seeds.

The prefix cache is reset before each way, so none inherits another's cache.
Throughput is (prompt + generated tokens) per second of wall time, so the
ratios stay fair if a way generates a few tokens more or less.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .llm.base import Backend, Completion, Request
from .prompts import PromptPack
from .roles import Player
from .runner import RoleBinding, Runner, RunSettings, Sampling
from .spec import Meta, Spec
from .store import RunDir, read_calls

# The paper's grid, for the cost projection.
PAPER_NARRATORS = 6
PAPER_SPECS = 100
PAPER_TURNS = 100


@dataclass
class Way:
    name: str
    wall_s: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    turns: int = 0
    overhead_ms: float | None = None
    hit_by_turn: dict[int, float] = field(default_factory=dict)
    prompt_by_turn: dict[int, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.generated_tokens) / self.wall_s if self.wall_s else 0.0

    def row(self) -> str:
        w = self.wall_s or float("nan")
        turns = f"{60 * self.turns / w:.1f}" if self.turns else "-"
        over = f"{self.overhead_ms:.2f}" if self.overhead_ms is not None else "-"
        return (f"| {self.name} | {self.wall_s:.1f} | {self.calls} | {self.prompt_tokens / w:.0f} "
                f"| {self.cached_tokens / w:.0f} | {self.generated_tokens / w:.1f} | {self.tokens_per_s:.0f} "
                f"| {turns} | {over} |")


HEADER = ("| way | wall s | calls | prompt tok/s | cached tok/s | generated tok/s | total tok/s "
          "| turns/min | overhead ms/call (median) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


class Recorder:
    """Passes calls through to the engine and keeps every request it saw."""

    def __init__(self, inner: Backend) -> None:
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
            s = replace(s, meta=Meta(id=f"{s.id}~{i // len(specs)}", title=s.meta.title, genres=s.meta.genres,
                                     player_role=s.meta.player_role))
        out.append(s)
    return tuple(out)


def _summarise(way: Way, calls: list[dict[str, Any]]) -> None:
    calls = [c for c in calls if "prompt_tokens" in c]
    way.calls = len(calls)
    way.prompt_tokens = sum(c["prompt_tokens"] for c in calls)
    way.cached_tokens = sum(c["cached_tokens"] for c in calls)
    way.generated_tokens = sum(c["generated_tokens"] for c in calls)
    overheads = [c["overhead_s"] for c in calls if c.get("overhead_s") is not None]
    way.overhead_ms = 1000 * statistics.median(overheads) if overheads else None
    by_turn: dict[int, list[int]] = {}
    alive: dict[int, set[str]] = {}
    for c in calls:
        p, h = by_turn.setdefault(c["turn"], [0, 0])
        by_turn[c["turn"]] = [p + c["prompt_tokens"], h + c["cached_tokens"]]
        alive.setdefault(c["turn"], set()).add(c["spec_id"])
    way.hit_by_turn = {t: h / p for t, (p, h) in sorted(by_turn.items()) if p}
    # Per episode still running at that turn: ended episodes must not pull the average down.
    way.prompt_by_turn = {t: p / len(alive[t]) for t, (p, _) in sorted(by_turn.items())}


async def _reset_cache(backend: Any) -> None:
    reset = getattr(backend, "reset_prefix_cache", None)
    if reset is not None:
        await reset()


async def run_rig(name: str, specs: tuple[Spec, ...], roles: dict[str, RoleBinding], pack: PromptPack,
                  narrator_cls: type, player: Player, seed: int, turns: int, concurrency: int, root: Path) -> Way:
    store = RunDir(root / name)
    store.open({"bench": name}, name)
    runner = Runner(specs=specs, roles=roles, pack=pack, store=store,
                    settings=RunSettings(seed=seed, max_turns=turns, concurrency=concurrency),
                    make_narrator=lambda: narrator_cls(pack=pack, roles=roles), player=player)
    started = time.perf_counter()
    try:
        results = await runner.run()
    finally:
        store.close()
    way = Way(name, wall_s=time.perf_counter() - started)
    way.turns = sum(len(r.turns) for r in results.values())
    _summarise(way, read_calls(store.calls_path))
    return way


async def run_ceiling(backend: Backend, requests: list[Request], turns: int) -> Way:
    started = time.perf_counter()
    outs = await asyncio.gather(*(backend.generate(r) for r in requests))
    way = Way("c ceiling (same requests, one batch)", wall_s=time.perf_counter() - started, turns=turns)
    _summarise(way, [{"prompt_tokens": o.prompt_tokens, "cached_tokens": o.cached_tokens,
                      "generated_tokens": o.generated_tokens, "turn": r.tags.get("turn", 0),
                      "spec_id": r.tags.get("episode", "")} for r, o in zip(requests, outs)])
    way.overhead_ms = None
    return way


def projection(rig: Way, throughput: float) -> list[str]:
    """GPU-hours for the paper grid from measured prompt tokens per turn, extrapolated linearly."""
    pts = sorted((t, p) for t, p in rig.prompt_by_turn.items() if t >= 0)
    if len(pts) >= 2:
        (t0, p0), (t1, p1) = pts[0], pts[-1]
        slope = (p1 - p0) / (t1 - t0)
        base = p0 - slope * t0
    else:
        slope, base = 0.0, pts[0][1] if pts else 0.0
    per_episode = sum(max(base + slope * t, 0.0) for t in range(PAPER_TURNS))
    gen_per_turn = rig.generated_tokens / max(1, rig.turns)
    total = PAPER_NARRATORS * PAPER_SPECS * (per_episode + gen_per_turn * PAPER_TURNS)
    hit = rig.cached_tokens / rig.prompt_tokens if rig.prompt_tokens else 0.0
    hours = total / throughput / 3600
    return [
        f"projection: prompt tokens/turn = {base:.0f} + {slope:.0f} x turn (measured over turns "
        f"{pts[0][0] if pts else 0}-{pts[-1][0] if pts else 0}), {gen_per_turn:.0f} generated/turn",
        f"projection: paper grid {PAPER_NARRATORS} narrators x {PAPER_SPECS} specs x {PAPER_TURNS} turns "
        f"(upper bound: no early ends) = {total / 1e9:.2f} G tokens; at {throughput:.0f} tok/s per GPU: "
        f"{hours:.0f} GPU-hours ({hours * (1 - hit):.0f} if the {hit:.0%} cache hit rate saves its prefill)",
    ]


async def bench(backend: Backend, model: str, sampling: Sampling, specs: tuple[Spec, ...], pack: PromptPack,
                narrator_cls: type, player: Player, seed: int, k: int, turns: int,
                throughput: float | None, sequential: bool = True) -> list[str]:
    work = workload(specs, k)
    recorder = Recorder(backend)
    rec_roles = {r: RoleBinding(recorder, sampling, model) for r in ("narrator", "player", "auditor")}
    roles = {r: RoleBinding(backend, sampling, model) for r in ("narrator", "player", "auditor")}
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ncp-bench-") as tmp:
        root = Path(tmp)
        # Warm-up (not measured): compiles grammars and kernels the first calls would pay for.
        await run_rig("warmup", work[:1], roles, pack, narrator_cls, player, seed + 1, 1, 1, root)
        await _reset_cache(backend)
        a = await run_rig(f"a rig ({k} concurrent)", work, rec_roles, pack, narrator_cls, player, seed, turns,
                          k, root)
        ways = [a]
        if sequential:
            await _reset_cache(backend)
            ways.append(await run_rig("b sequential (one call in flight)", work, roles, pack, narrator_cls,
                                      player, seed, turns, 1, root))
        await _reset_cache(backend)
        c = await run_ceiling(backend, recorder.requests, a.turns)
        ways.append(c)
    lines.append(HEADER)
    lines.extend(w.row() for w in ways)
    lines.append("cache hit by turn (rig): " + " ".join(f"t{t}={h:.2f}" for t, h in a.hit_by_turn.items()))
    lines.extend(projection(a, throughput or a.tokens_per_s))
    late = [(t, a.prompt_by_turn[t]) for t in a.hit_by_turn if t >= 2]
    late_prompt = sum(p for _, p in late)
    late_hit = (sum(a.hit_by_turn[t] * p for t, p in late) / late_prompt) if late_prompt else 0.0
    b = ways[1] if sequential else None
    lines.append(f"ratios: rig/ceiling={a.tokens_per_s / c.tokens_per_s:.2f} "
                 f"rig/sequential={(a.tokens_per_s / b.tokens_per_s) if b and b.tokens_per_s else float('nan'):.2f} "
                 f"cache_hit={late_hit:.2f}")
    return lines
