"""`bench.sweep`: a sweep's points run batched (one engine, the real batched launcher's way) and point by point."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import HydraException

from ..config import ConfigError, RunConfig, hydra_error_line
from ..engines.base import Engine
from ..errors import InputError
from ..execution import points
from ..execution.calls import CallService, with_engines
from ..execution.engine_pool import EnginePool
from ..execution.preflight import Ready
from ..execution.scheduler import EpisodeScheduler, EpisodeSettings
from ..protocol import ROLES
from ..protocol.spec import Spec
from ..rundir import provenance
from ..rundir.call_log import read_calls
from ..rundir.store import RunDir
from .ways import Tally, say, silent, workload

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
    roles = with_engines(ready.bindings, backends, ROLES)
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
    note: Callable[[str], None] = silent,
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
        # The one engine pool, as a batched sweep keys it: each distinct engine started once for all points.
        pool = EnginePool()
        try:
            per_point = []
            for _, ready in points:
                keys = pool.register(ready.bindings, endpoints=ready.endpoints)
                t0 = time.perf_counter()
                starts = sum(e.starts for e in pool.engines.values())
                per_point.append(await pool.of_roles(keys))
                if sum(e.starts for e in pool.engines.values()) > starts:
                    batched.start_s += time.perf_counter() - t0
                batched.starts = sum(e.starts for e in pool.engines.values())
            done = await asyncio.gather(
                *(
                    _sweep_point(ready, per_point[num], work, turns, root / f"batched-{num}")
                    for num, (_, ready) in enumerate(points)
                )
            )
        finally:
            await pool.close_all()
        batched.wall_s = time.perf_counter() - started
        note(f"bench: batched way done in {batched.wall_s:.0f} s; now point by point")
        for num, (results, calls) in enumerate(done):
            _account(batched, num, results, calls)
        ways.append(batched)
        if sequential:
            seq = SweepWay("sequential (point by point, an engine each)")
            started = time.perf_counter()
            for num, (_, ready) in enumerate(points):
                engines = EnginePool(ready.bindings, endpoints=ready.endpoints)
                t0 = time.perf_counter()
                backends = await engines.start()
                seq.start_s += time.perf_counter() - t0
                seq.starts += len(engines.engines)
                try:
                    results, calls = await _sweep_point(ready, backends, work, turns, root / f"sequential-{num}")
                finally:
                    await engines.close_all()
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


def main_sweep(cfg: RunConfig) -> int:
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
    for line in asyncio.run(sweep_bench(swept, first.dataset.specs, b.episodes, b.turns, b.sequential, note=say)):
        print(line)
    return 0
