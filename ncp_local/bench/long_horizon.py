"""`mode=bench bench.long_horizon=true`: the prefix cache when the episodes in flight outgrow it.

The paper's runs reach turn 100 with 25-38k-token prompts; a GPU's cache
then holds a few of the 64 episodes in flight, and an episode whose prefix
was evicted recomputes its whole prompt at its next call. The 4-turn bench
never gets there. This one does, cheaply, in three steps:

  1. the state: K episodes played to turn `bench.at_turn` on scripted answers
     of realistic size (the plan's: `plan.narration_words`, ...), no model;
  2. from that state, `bench.turns` more turns per episode with the real
     engine reading every prompt (the exact prompts a run sends, tokenized by
     the engine) under a KV cache of `bench.kv_tokens`: once per concurrency
     level in `bench.levels` (fixed: that many episodes in flight) and once
     with admission by cache capacity (execution/admission.py);
  3. the hit rate an unbounded cache would give on the same requests.

The engine computes the prompt and one token; the answer is the scripted one,
so every way makes the same calls and only the cache differs. Decoding is
left out on purpose: it does not touch the prefix cache, and on two CPU cores
it would make the bench hours long. The first replayed turn of an episode
meets a cold cache in every way (its history was built without the engine),
so the hit rate is counted from the second one.

Each step is `mode=run` of the bench's command (the narrator on its model, the player and auditor
scripted), played by its one life (execution/life.py) into a run directory under the bench's
`long-horizon/`: the state with every engine answering from the script (the life's `wrap`), then each
way resuming the state's episodes from their checkpoints (`Point.start`) with every call read by the
engine (`PrefillOnly`, the wrap), at a fixed level with no cache bound or admitted by the engine's
cache. A way's wall time runs from its first call to its last answer, as the other ways' do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..engines.base import Completion, Engine, Request
from ..engines.scripted import ScriptedEngine
from ..execution.engine_pool import EnginePool
from ..execution.life import Life, Point
from ..plan.growth import Sizes, sized_answers, words_of
from ..protocol import ROLES
from ..protocol.records import Checkpoint, EpisodeResult
from ..protocol.spec import Spec
from ..protocol.trials import parse_episode
from ..protocol.turns import resumed
from ..protocol.turns import shown as shown_turn
from ..rundir import layout
from ..rundir.call_log import read_calls
from .cache_sim import unbounded_cache_hit
from .ways import played

# The run a replaying way plays, made by the caller as `point(name, max_turns, concurrency)`: `mode=run`
# of the bench's command on the state's episodes, each played through (ways.bench_point).
MakePoint = Callable[[str, int, int], Point]


class PrefillOnly:
    """The real engine reads each prompt (prefill + one token); the answer is the scripted one."""

    def __init__(self, inner: Engine, answer: Callable[[Request], str], kv_tokens: int | None, grammar: bool) -> None:
        self.inner, self.answer, self.grammar = inner, answer, grammar
        self.kv_tokens = kv_tokens  # what the admission reads (None: the fixed levels, no admission)
        self.requests: list[Request] = []
        count = getattr(inner, "count_tokens", None)
        if count is not None:
            self.count_tokens = count  # the admission's start-up estimate counts with the engine's tokenizer

    async def generate(self, request: Request) -> Completion:
        self.requests.append(request)
        # One token needs no grammar, and compiling each call's schema (its ids change every turn) would
        # cost more than the prefill measured here; the scripted backend answers from the schema.
        sent = replace(request, max_tokens=1, min_room=1)
        if not self.grammar:
            sent = replace(sent, json_schema=None, regex=None)
        out = await self.inner.generate(sent)
        return Completion(
            text=self.answer(request),
            finish_reason="stop",
            prompt_tokens=out.prompt_tokens,
            cached_tokens=out.cached_tokens,
            generated_tokens=out.generated_tokens,
            latency_s=out.latency_s,
        )

    async def close(self) -> None:
        return None


@dataclass
class Level:
    name: str
    wall_s: float = 0.0
    prompt: int = 0  # all replayed turns
    warm_prompt: int = 0  # from the second replayed turn on
    warm_cached: int = 0
    peak: int = 0
    pauses: int = 0

    @property
    def hit(self) -> float:
        return self.warm_cached / self.warm_prompt if self.warm_prompt else 0.0

    @property
    def recomputed(self) -> int:
        return self.warm_prompt - self.warm_cached

    @property
    def tokens_per_s(self) -> float:
        return self.prompt / self.wall_s if self.wall_s else 0.0


def _checkpoint(r: EpisodeResult) -> Checkpoint:
    # A played-through result is the state after its last turn (the baseline narrator keeps no state).
    return Checkpoint(
        spec_id=r.spec_id,
        state=r.final_state,
        opening_update=r.opening_update,
        turns=r.turns,
        narrator_state={},
        opening_bound_hits=r.opening_bound_hits,
        trial=r.trial,
    )


def played_specs(p: Point) -> list[Spec]:
    """The story of each of the point's episodes (a story twice when its trials are)."""
    assert p.ready is not None and p.ready.dataset is not None
    by_id = {s.id: s for s in p.ready.dataset.specs}
    return [by_id[parse_episode(e)[0]] for e in p.episodes()]


def _always(engine: Engine) -> Callable[[Engine], Engine]:
    """A wrap that puts `engine` in place of every engine of the point."""
    return lambda _: engine


async def _live(what: str, p: Point, pool: EnginePool, wrap: Callable[[Engine], Engine]) -> None:
    life = Life([p], pool=pool, wrap=wrap)
    await life.run()
    played(what, life, p)


async def long_horizon(
    backend: Any,
    state: Point,
    point: MakePoint,
    pool: EnginePool,
    at_turn: int,
    turns: int,
    levels: list[int],
    sizes: Sizes,
    note: Callable[[str], None],
    grammar: bool = False,
) -> list[str]:
    """Each level and the admission on the same long-horizon state (`state`: its episodes to `at_turn`,
    all at once), every step a point played by `mode=run`'s life on `pool`, each call of a replayed
    turn read by `backend`, the engine measured; the table and the closing line."""
    k = len(state.episodes())
    specs = played_specs(state)
    assert state.ready is not None
    # At the plan's sizes within each role's bounds, as the plan's own projection answers (a small model's
    # tight bounds refuse longer answers; a real model's role files set none).
    bounds = {r: state.ready.bindings[r].bounds for r in ROLES}
    answer = sized_answers(sizes, words_of(specs), bounds, lambda *_: None)
    kv = getattr(backend, "kv_tokens", None)
    rows: list[Level] = []
    first_warm = resumed(at_turn, 2)  # the first resumed turn meets a cold cache in every way
    scripted = ScriptedEngine(rules=answer)
    await _live("the long-horizon state", state, pool, _always(scripted))
    start = tuple(_checkpoint(r) for r in state.results.values())
    note(f"bench: {k} episodes played to turn {at_turn} on scripted answers")
    last: PrefillOnly | None = None
    fixed = sorted({min(n, k) for n in levels})  # more in flight than episodes is all of them
    ways = [(f"{n} in flight", n, False) for n in fixed] + [("admission by cache", max(fixed), True)]
    for i, (name, concurrency, admit) in enumerate(ways):
        # Every role's prompts to the engine measured, through one reader (one cache, one admission).
        engine = PrefillOnly(backend, answer, kv if admit else None, grammar)
        reset = getattr(backend, "reset_prefix_cache", None)
        if reset is not None:
            await reset()
        p = point(f"way{i}", at_turn + turns, concurrency)
        p.start = start
        await _live(f"way {name!r}", p, pool, _always(engine))
        assert p.out is not None
        calls = read_calls(p.out / layout.CALLS)
        timed = [c for c in calls if c.done_at is not None]
        began = min((c.done_at - (c.latency_s or 0.0) for c in timed if c.done_at is not None), default=0.0)
        row = Level(name, wall_s=max((c.done_at for c in timed if c.done_at is not None), default=0.0) - began)
        for c in calls:
            if c.prompt_tokens is None:  # never reached the engine (no room in the window)
                continue
            row.prompt += c.prompt_tokens
            if c.turn >= first_warm:
                row.warm_prompt += c.prompt_tokens
                row.warm_cached += c.cached_tokens or 0
        adm = p.admission
        row.peak, row.pauses = (adm.peak, adm.pauses) if adm else (0, 0)
        rows.append(row)
        last = engine
        note(f"bench: {name} done in {row.wall_s:.0f} s (hit {row.hit:.2f})")
    unbounded = _unbounded_hit(backend, last.requests if last else [], first_warm)
    return _lines(rows, unbounded, kv, k, at_turn, turns, first_warm)


def _unbounded_hit(backend: Any, requests: list[Request], first_warm: int) -> float | None:
    tokenize, block = getattr(backend, "tokenize", None), getattr(backend, "block_size", None)
    if tokenize is None or not block:
        return None
    by_turn = unbounded_cache_hit(requests, tokenize, block)
    p = sum(v[0] for t, v in by_turn.items() if t >= first_warm)
    return sum(v[1] for t, v in by_turn.items() if t >= first_warm) / p if p else None


def _lines(
    rows: list[Level], unbounded: float | None, kv: int | None, episodes: int, at_turn: int, turns: int, first_warm: int
) -> list[str]:
    fixed = [r for r in rows[:-1]]
    adaptive = rows[-1]
    best = max(fixed, key=lambda r: r.tokens_per_s)
    ideal = unbounded if unbounded is not None else float("nan")
    out = [
        f"long-horizon: {episodes} episodes from turn {at_turn}, {turns} turns each on the real engine "
        f"(prompt + 1 token per call), KV cache {kv or '?'} tokens; hit rate and recompute from turn "
        f"{shown_turn(first_warm)} on",
        "| way | wall s | prompt tok/s | hit rate | unbounded hit | prefill recomputed (tokens) "
        "| most in flight | stepped back |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        most = str(r.peak) if r is adaptive else r.name.split()[0]
        out.append(
            f"| {r.name} | {r.wall_s:.1f} | {r.tokens_per_s:.0f} | {r.hit:.2f} | {ideal:.2f} "
            f"| {r.recomputed:,} | {most} | {r.pauses if r is adaptive else '-'} |"
        )
    out.append(f"best fixed level: {best.name} ({best.tokens_per_s:.0f} tok/s)")
    out.append(
        f"long-horizon: adaptive_hit={adaptive.hit:.2f} unbounded_hit={ideal:.2f} "
        f"adaptive/best_fixed={adaptive.tokens_per_s / best.tokens_per_s if best.tokens_per_s else float('nan'):.2f}"
    )
    return out
