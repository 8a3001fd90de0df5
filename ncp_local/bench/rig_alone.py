"""`mode=bench bench.rig_alone=true`: the rig alone at paper length, on an engine that answers at once.

A GPU node answers hundreds of calls a second; on it, what the rig does per call (prompts, grammar
and schema checks, the call log, admission, the checkpoints) sets the pace. This way measures that
and nothing else: the stories of the configured dataset (`bench.episodes` of them, `dataset=ncp_bench`
for the official ones) x `bench.trials`, `bench.turns` turns each, played by `mode=run`'s own life
(execution/life.py) on the scripted engine with nothing ending an episode early (no conflict, no
beat, no satisfied commitment) and texts as long as a real narrator's, player's and auditor's
(`bench.short_texts=true`: the scripted engine's short ones), every episode in flight at once,
optionally on a slow filesystem (`bench.fsync_delay_s`: every fsync waits that long more).

It prints, by tenth of the turns: calls/s and the process's CPU per call while the episodes were in
those turns, the event loop's longest stall (a probe task that sleeps 10 ms and notes how late it
woke), and the memory per episode in flight (resident set over the baseline before the run, divided
by the episodes); then the run's end after its last call (`End`: the results still to make, where every
episode ends at its last turn). `bench.profile=true` plays under cProfile instead and prints the top costs (its
figures are then the profiler's, not the rig's).
"""

from __future__ import annotations

import asyncio
import bisect
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RunConfig, validate
from ..execution import points
from ..execution.life import Life, prepared_run
from ..protocol.turns import shown
from ..rundir import layout, provenance
from ..rundir.atomic import fsync_delay
from .passes import watching
from .ways import played, run_overrides

# Texts as long as a real narrator's (about 150 words), player's (50) and auditor's reason (20): with
# them a committed turn adds about 2.6 times what the short scripted texts add to the episode's record.
REALISTIC = {"narration_chars": 750, "player_chars": 250, "reason_chars": 100}
PROBE_S = 0.01  # the loop-lag probe's sleep
SAMPLE_S = 0.25  # how often the probe notes CPU, memory and its longest lag since the last note


@dataclass
class Sample:
    at: float  # wall clock (time.time(): the call log's `done_at` clock)
    cpu_s: float  # the process's CPU so far
    lag_s: float  # the probe's longest lateness since the previous sample
    lag_cpu_s: (
        float  # the loop thread's CPU during that lateness: about lag_s when the loop computed, ~0 when it waited
    )
    rss: int  # resident bytes now


@dataclass
class Probe:
    """A task beside the run: how late the event loop lets it wake, and the process's CPU and memory."""

    samples: list[Sample] = field(default_factory=list)

    async def watch(self) -> None:
        """Until cancelled; a sample first and last, so that a run shorter than a sample is measured too."""
        worst, worst_cpu, next_note = 0.0, 0.0, time.monotonic() + SAMPLE_S
        self.note(0.0, 0.0)
        try:
            while True:
                before, cpu = time.monotonic(), time.thread_time()  # the probe runs on the loop's thread
                await asyncio.sleep(PROBE_S)
                now = time.monotonic()
                if now - before - PROBE_S > worst:
                    worst, worst_cpu = now - before - PROBE_S, time.thread_time() - cpu
                if now >= next_note:
                    self.note(worst, worst_cpu)
                    worst, worst_cpu, next_note = 0.0, 0.0, now + SAMPLE_S
        finally:
            self.note(worst, worst_cpu)

    def note(self, lag_s: float, lag_cpu_s: float) -> None:
        self.samples.append(Sample(time.time(), time.process_time(), lag_s, lag_cpu_s, rss()))


def rss() -> int:
    """The process's resident set now, in bytes (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Tenth:
    """The middle 90% of the calls of one tenth of the turns, and what the process did meanwhile. What
    follows the last call (the results of episodes that all end at once, the bench's case) is `End`'s."""

    turns: str  # e.g. "91-100"
    calls: int  # every call that ended in the window (of any turn)
    wall_s: float
    cpu_s: float
    stall_s: float
    stall_cpu_s: float  # the loop thread's CPU during that stall (the rest: waiting for a core or the interpreter)
    rss: int  # at the window's end

    @property
    def per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / self.calls if self.calls else float("nan")


@dataclass(frozen=True)
class End:
    """From the last call to the last result on disk: what the run's end costs with no call left to make
    (every episode of the bench ends at its last turn, so most of their results are made then)."""

    results: int
    wall_s: float
    cpu_s: float
    stall_s: float
    stall_cpu_s: float

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / self.results if self.results else float("nan")


def rig_overrides(cfg: RunConfig, out: Path) -> list[str]:
    """The run this way plays: this command's own run (not its engine), on the scripted engine that ends
    no episode early, the texts, the size, every episode in flight."""
    b = cfg.bench
    given = [o for o in provenance.command()["overrides"] if not o.lstrip("+~").startswith("engine")]
    texts = {} if b.short_texts else REALISTIC
    return run_overrides(
        given,
        [
            "engine=scripted",
            "engine.conflict_rate=0",
            "engine.node_rate=0",
            "engine.satisfy_rate=0",
            *(f"engine.{k}={v}" for k, v in texts.items()),
            f"max_turns={b.turns}",
            f"limit={b.episodes}",
            f"trials.count={b.trials}",
            f"concurrency={b.episodes * b.trials}",
            f"out_dir={out}",
        ],
    )


def call_times(calls: Path, turns: int) -> tuple[list[float], list[list[float]]]:
    """Every call's end (sorted) and each tenth of the turns' call ends (the opening in the first)."""
    ends: list[float] = []
    by_tenth: list[list[float]] = [[] for _ in range(10)]
    with open(calls, "rb") as f:
        for line in f:
            c = json.loads(line)
            at = c.get("done_at")
            if at is None:
                continue
            ends.append(at)
            by_tenth[min(9, max(0, (shown(c["turn"]) - 1) * 10 // turns))].append(at)
    ends.sort()
    return ends, by_tenth


def tenths(ends: list[float], by_tenth: list[list[float]], samples: list[Sample], turns: int) -> list[Tenth]:
    """Each tenth's figures (`Tenth`)."""
    out = []
    at = [s.at for s in samples]

    def sample(t: float) -> Sample:
        return samples[max(0, min(len(samples) - 1, bisect.bisect_left(at, t)))]

    for k, times in enumerate(by_tenth):
        if len(times) < 20 or not samples:
            continue
        times.sort()
        lo, hi = times[len(times) // 20], times[-len(times) // 20 - 1]
        window = _window(samples, at, lo, hi)
        first, last = k * turns // 10 + 1, (k + 1) * turns // 10
        out.append(
            Tenth(
                turns=f"{first}-{last}",
                calls=bisect.bisect_right(ends, hi) - bisect.bisect_left(ends, lo),
                wall_s=hi - lo,
                cpu_s=_cpu_at(samples, at, hi) - _cpu_at(samples, at, lo),
                stall_s=max((s.lag_s for s in window), default=0.0),
                stall_cpu_s=max(window, key=lambda s: s.lag_s).lag_cpu_s if window else 0.0,
                rss=sample(hi).rss,
            )
        )
    return out


def _window(samples: list[Sample], at: list[float], lo: float, hi: float) -> list[Sample]:
    return samples[bisect.bisect_left(at, lo) : bisect.bisect_right(at, hi) + 1]  # and the next


def _cpu_at(samples: list[Sample], at: list[float], t: float) -> float:
    """The process's CPU at `t`: linear between the samples either side (a tenth of a short run lasts
    less than a sample)."""
    i = bisect.bisect_left(at, t)
    if i <= 0 or i >= len(samples):
        return samples[max(0, min(len(samples) - 1, i))].cpu_s
    a, z = samples[i - 1], samples[i]
    return a.cpu_s + (z.cpu_s - a.cpu_s) * (t - a.at) / (z.at - a.at) if z.at > a.at else z.cpu_s


def end(ends: list[float], samples: list[Sample], results: int, finished: float) -> End | None:
    """`End` from the last call (`ends[-1]`) to `finished`, when the last result was written."""
    if not ends or not samples or finished <= ends[-1]:
        return None
    at = [s.at for s in samples]
    window = _window(samples, at, ends[-1], finished)
    worst = max(window, key=lambda s: s.lag_s, default=None)
    return End(
        results=results,
        wall_s=finished - ends[-1],
        cpu_s=_cpu_at(samples, at, finished) - _cpu_at(samples, at, ends[-1]),
        stall_s=worst.lag_s if worst is not None else 0.0,
        stall_cpu_s=worst.lag_cpu_s if worst is not None else 0.0,
    )


def lines(
    rows: list[Tenth], last: End | None, episodes: int, base: int, peak: int, wall: float, cpu: float, calls: int
) -> list[str]:
    mib = 1 << 20
    out = [
        "| turns | calls | calls/s | CPU ms/call | longest loop stall ms (the loop's CPU) | MB per episode in flight |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.turns} | {r.calls} | {r.per_s:.0f} | {r.cpu_ms:.2f} | {1000 * r.stall_s:.0f} "
            f"({1000 * r.stall_cpu_s:.0f}) | {(r.rss - base) / mib / episodes:.2f} |"
        )
    if last is not None:
        out.append(
            f"after the last call: {last.results} results on disk in {last.wall_s:.1f} s ({last.cpu_ms:.1f} ms of "
            f"CPU a result), longest loop stall {1000 * last.stall_s:.0f} ms ({1000 * last.stall_cpu_s:.0f})"
        )
    late = rows[-1].per_s / rows[0].per_s if len(rows) > 1 and rows[0].per_s else float("nan")
    out.append(
        f"rig alone: {episodes} episodes, {calls} calls in {wall:.1f} s ({calls / wall:.0f} calls/s, "
        f"{1000 * cpu / max(calls, 1):.2f} ms CPU per call); peak memory {(peak - base) / mib:.0f} MB over the "
        f"{base / mib:.0f} MB before the run, {(peak - base) / mib / episodes:.2f} MB per episode in flight"
    )
    stall = max((r.stall_s for r in rows), default=0.0)
    out.append(
        f"rig_alone: last/first_tenth={late:.2f} late_calls_s={rows[-1].per_s if rows else float('nan'):.0f} "
        f"stall_ms={1000 * stall:.0f} end_s={last.wall_s if last is not None else 0.0:.1f}"
    )
    return out


def top_costs(profile: cProfile.Profile, n: int = 30) -> list[str]:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(n)
    return text.getvalue().splitlines()


def main(cfg: RunConfig, out: Path) -> list[str]:
    """Play the run (its directory under `out`, removed after unless `bench.keep_run`) and measure it."""
    b = cfg.bench
    run_dir = out / "rig-alone-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run each time: a resumed one would measure nothing
    run_cfg = validate(points.load(rig_overrides(cfg, run_dir)))
    p = prepared_run(run_cfg)
    assert p.ready is not None and p.ready.dataset is not None
    episodes = len(p.episodes())
    print(
        f"bench: rig alone, {episodes} episodes ({len(p.ready.dataset.specs)} stories x {b.trials}) x {b.turns} "
        f"turns on the scripted engine, {'short' if b.short_texts else 'realistic'} texts, fsync delay "
        f"{1000 * b.fsync_delay_s:.0f} ms{', under cProfile' if b.profile else ''}",
        flush=True,
    )
    probe = Probe()
    profile = cProfile.Profile() if b.profile else None
    life = Life([p])

    async def go() -> None:
        watch = asyncio.create_task(probe.watch())
        try:
            if profile is not None:
                profile.enable()
            await life.run()
        finally:
            if profile is not None:
                profile.disable()
            watch.cancel()

    base = rss()
    cpu0, t0 = time.process_time(), time.time()
    with fsync_delay(b.fsync_delay_s), watching() as passes:
        asyncio.run(go())
    wall, cpu = time.time() - t0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    played("the rig-alone run", life, p)
    ends, by_tenth = call_times(run_dir / layout.CALLS, b.turns)
    written = [f.stat().st_mtime for f in (run_dir / layout.RESULTS).glob("*.json")]
    rows = tenths(ends, by_tenth, probe.samples, b.turns)
    last = end(ends, probe.samples, sum(t > ends[-1] for t in written) if ends else 0, max(written, default=0.0))
    out_lines = lines(rows, last, episodes, base, peak, wall, cpu, len(ends))
    if passes is not None:
        out_lines = passes.lines() + out_lines  # the summary stays last
    if profile is not None:
        profile.dump_stats(out / "rig-alone.prof")
        out_lines += top_costs(profile)
    if not b.keep_run:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out_lines
