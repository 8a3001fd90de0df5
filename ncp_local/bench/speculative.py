"""`bench.speculative=true`: turn latency with the next turn's player asked after the audits and during them.

The same episodes, seeds and engine, played through (a fixed workload) twice by `mode=run`'s life from a
cold prefix cache: once asking each turn's player after the previous turn's audits (the order PROTOCOL
section 3 describes), once asking it as soon as the narration exists (`speculative_player`, Episode's
Speculation). A turn's latency is the time between two commits of one episode, read from the call log
(a turn commits as its last call answers). The results of both must be identical, byte for byte: the
bench says whether they were.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from ..execution.engine_pool import EnginePool
from ..protocol.trials import episode_name
from ..rundir import layout
from ..rundir.call_log import CallLine, read_calls
from .ways import bench_point, reset_cache, run_rig


def turn_latencies(calls: list[CallLine]) -> list[float]:
    """The time between two commits of one episode, for every turn after the opening: a turn commits
    when its last call (a call asked ahead for the next turn is tagged with that turn) answers."""
    commits: dict[str, dict[int, float]] = {}
    for c in calls:
        if c.done_at is not None and not c.speculative:
            by_turn = commits.setdefault(episode_name(c.spec_id, c.trial), {})
            by_turn[c.turn] = max(by_turn.get(c.turn, 0.0), c.done_at)
    out = []
    for by_turn in commits.values():
        times = [by_turn[t] for t in sorted(by_turn)]
        out += [b - a for a, b in zip(times, times[1:], strict=False)]
    return out


async def speculative_bench(out: Path, episodes: int, turns: int, note: Callable[[str], None]) -> list[str]:
    """Both orders on the same seeds and engine; mean and median turn latency, and whether the results
    are identical."""
    pool = EnginePool()  # one engine for both ways
    try:
        found = await _both(out, pool, episodes, turns, note)
    finally:
        await pool.close_all()
    (seq, a, _), (spec, b, dropped) = found[False], found[True]
    differ = sorted(k for k in a if a[k] != b.get(k))
    mean_seq, mean_spec = statistics.mean(seq), statistics.mean(spec)
    return [
        f"speculative player: {episodes} episodes x {turns} turns, turn latency (s) after the audits: mean "
        f"{mean_seq:.1f}, median {statistics.median(seq):.1f}; during them: mean {mean_spec:.1f}, median "
        f"{statistics.median(spec):.1f}; {dropped} speculative call(s) dropped; results "
        + ("identical" if not differ else f"differ in {len(differ)} of {len(a)} episodes: {differ[:4]}"),
        f"speculative: turn_s after={mean_seq:.2f} during={mean_spec:.2f} during/after={mean_spec / mean_seq:.2f} "
        f"identical={str(not differ).lower()}",
    ]


async def _both(
    out: Path, pool: EnginePool, episodes: int, turns: int, note: Callable[[str], None]
) -> dict[bool, tuple[list[float], dict[str, str], int]]:
    found: dict[bool, tuple[list[float], dict[str, str], int]] = {}
    for speculative in (False, True):
        p = bench_point(
            out / f"speculative-{str(speculative).lower()}",
            episodes,
            turns,
            episodes,
            [f"speculative_player={str(speculative).lower()}"],
        )
        for engine in pool.engines.values():
            if engine.engine is not None:
                await reset_cache(engine.engine)
        await run_rig(f"speculative_player={speculative}", p, pool)
        assert p.out is not None
        calls = read_calls(p.out / layout.CALLS)
        results = {k: v.model_dump_json() for k, v in p.results.items()}
        found[speculative] = (turn_latencies(calls), results, sum(1 for c in calls if c.speculative))
        note(f"bench: speculative_player={str(speculative).lower()} done")
    return found
