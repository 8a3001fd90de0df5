"""`bench.sweep`: a sweep's points run batched (one engine, the real batched launcher's way) and point by point."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra.errors import HydraException

from ..config import ConfigError, RunConfig, hydra_error_line
from ..errors import InputError
from ..execution import points
from ..execution.life import Life, Point, SweepOf, prepare
from ..rundir import layout, provenance
from ..rundir.call_log import read_calls
from .ways import Tally, cycled, played, run_overrides, say, silent

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


def sweep_points(cfg: RunConfig, root: Path, way: str) -> list[Point]:
    """The points of `bench.sweep` = {dotted key: [values]}: those `python run.py -m hydra/launcher=batched
    <this command> key=v1,v2 ...` runs, expanded and checked as that launcher does (execution/life.py
    `prepare`), each a `mode=run` of its own into `root/<way>-<n>`, its first `bench.episodes` episodes
    played through `bench.turns` turns."""
    b = cfg.bench
    axes = dict(b.sweep or {})
    if not axes or any(not isinstance(v, list) or not v for v in axes.values()):
        raise ConfigError(
            "bench.sweep", "give {config key: [values, ...], ...}, e.g. {narrator.temperature:[0.2,0.6],seed:[0,1]}"
        )
    # This command's own overrides (not the bench or its sweep), then the sweep; only bench.sweep's
    # keys are swept (a config file's sweeper params are a `-m` sweep's, not this bench's).
    overrides = run_overrides(
        provenance.command()["overrides"],
        [
            "hydra.sweeper.params=null",
            f"max_turns={b.turns}",
            f"trials.count={b.episodes}",
            *(points.sweep_of(key, values) for key, values in axes.items()),
        ],
    )
    out = []
    try:
        for num, point in enumerate(points.expand(overrides).points()):
            p = Point(num, (*point.overrides, f"out_dir={root / f'{way}-{num}'}"), swept=point.swept)
            try:
                p.raw = points.load(p.overrides)
            except InputError as exc:
                raise ConfigError("bench.sweep", f"point {p.name}: {exc}") from None
            prepare(p)
            if p.status == "failed":
                raise ConfigError("bench.sweep", f"point {p.name}: {p.message}")
            assert p.ready is not None and p.ready.dataset is not None
            p.only = cycled([s.id for s in p.ready.dataset.specs], b.episodes)
            p.play_through = True  # the same calls both ways, whatever the model says
            out.append(p)
    except HydraException as exc:  # a key no config has, an unknown group option
        raise ConfigError("bench.sweep", hydra_error_line(exc)) from None
    return out


def _account(way: SweepWay, p: Point) -> None:
    assert p.out is not None
    calls = [c for c in read_calls(p.out / layout.CALLS) if c.prompt_tokens is not None]
    way.calls += len(calls)
    way.prompt_tokens += sum(c.prompt_tokens or 0 for c in calls)
    way.generated_tokens += sum(c.generated_tokens or 0 for c in calls)
    for name, r in p.results.items():
        way.outputs[(p.num, name)] = r.model_dump_json(exclude={"run"})  # the run identity names the directory


def _started(way: SweepWay, life: Life) -> None:
    way.starts += sum(e.starts for e in life.pool.engines.values())
    way.start_s += sum(e.start_s for e in life.pool.engines.values())


async def sweep_bench(cfg: RunConfig, root: Path, note: Callable[[str], None] = silent) -> list[str]:
    """The same sweep two ways: batched (`hydra/launcher=batched`'s own life: each distinct engine started
    once, every point's episodes in flight together) and point by point (`mode=run`'s life per point, an
    engine each, as Hydra's basic launcher runs a sweep). Wall times include the engine starts: that is
    what a sweep costs. `note` gets a line as each way (and each point of the second) ends: the whole
    bench takes an hour on 2 CPU cores."""
    ways: list[SweepWay] = []
    batched_points = sweep_points(cfg, root, "batched")
    labels = [" ".join(p.swept or ()) for p in batched_points]
    batched = SweepWay(f"batched ({len(batched_points)} points at once)")
    started = time.perf_counter()
    life = Life(batched_points, SweepOf(root / "batched"), say=note)
    await life.run()
    batched.wall_s = time.perf_counter() - started
    _started(batched, life)
    for p in batched_points:
        played(f"sweep point {p.name}", life, p)
        _account(batched, p)
    note(f"bench: batched way done in {batched.wall_s:.0f} s; now point by point")
    ways.append(batched)
    if cfg.bench.sequential:
        seq = SweepWay("sequential (point by point, an engine each)")
        started = time.perf_counter()
        for p in sweep_points(cfg, root, "sequential"):
            alone = Life([p])
            await alone.run()
            played(f"sweep point {p.name} (alone)", alone, p)
            _started(seq, alone)
            _account(seq, p)
            note(
                f"bench: point {p.num + 1} of {len(labels)} done point by point "
                f"({time.perf_counter() - started:.0f} s so far)"
            )
        seq.wall_s = time.perf_counter() - started
        ways.append(seq)
    lines = [
        "sweep points: " + "; ".join(f"#{i} {label}" for i, label in enumerate(labels)),
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


def main_sweep(cfg: RunConfig, out: Path) -> int:
    b = cfg.bench
    print(
        f"bench: sweep of {b.sweep} x {b.episodes} episodes x {b.turns} turns ({cfg.engine.name}), "
        "batched then point by point",
        flush=True,
    )
    for line in asyncio.run(sweep_bench(cfg, out, note=say)):
        print(line)
    return 0
