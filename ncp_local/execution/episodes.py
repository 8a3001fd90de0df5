"""Playing a run's episodes into its run directory: the work of `mode=run`, `mode=rerun` and
each point of a batched sweep.

Pre-flight (`preflight.py`) has checked everything; this opens the run
directory (lock, identity), starts the engines, plays every unfinished
episode with signals handled (SIGTERM, SIGINT: checkpoints stand, exit
130/143), and reports.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..engines.base import Engine
from ..exits import EXIT_ENGINE_DEAD, EXIT_SIGNAL, EXIT_SYSTEMATIC
from ..protocol import ROLES
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..protocol.records import EpisodeResult
from ..protocol.spec import Dataset, Spec
from . import engine_log, layout, provenance
from . import identity as identity_mod
from .call_log import CallLine, read_calls
from .calls import CallService, systematic_invalid, with_engines
from .engine_pool import EnginePool, embedded_note
from .failures import exit_for
from .points import where
from .preflight import Ready, preflight
from .progress import Metered, Progress
from .scheduler import EpisodeScheduler, EpisodeSettings
from .store import RunDir, resume_hint


def manifest(
    cfg: RunConfig, raw: dict[str, Any], ds: Dataset, ready: Ready, engines: EnginePool, ident: identity_mod.Identity
) -> dict[str, Any]:
    """What the run is (config, content hashes per file, weights) and what it ran on (provenance)."""
    pack = ready.pack
    models = engines.describe()
    for role, weights in ident.parts["models"].items():
        if role in models:
            # The revision as configured, and as the download left it on disk (often the only record).
            found = provenance.hf_revision(models[role]["path"]) if weights.get("kind") == "files" else None
            models[role] = {**models[role], "weights": weights, "revision_on_disk": found}
    return {
        **provenance.environment(),
        "config": raw,
        "dataset": {
            "path": str(ds.root.resolve()),
            "sha256": ds.sha256,
            "specs": [s.id for s in ds.specs],
            "files": ident.parts["dataset"],
        },
        "prompts": {"path": str(Path(pack.root).resolve()), "sha256": pack.sha256, "files": ident.parts["prompts"]},
        "models": models,
    }


def run(cfg: RunConfig, raw: dict[str, Any], on_finished: Callable[[Path], None] | None = None) -> int:
    """Check, play and report one run; the exit code. `on_finished(run dir)` runs once the run has finished
    and reported (exit 0): the tracker's turn (ncp_local/tracking)."""
    ready = preflight(cfg)  # all checked before anything starts
    cfg = ready.cfg  # memory shares and devices as planned
    assert ready.dataset is not None
    specs, ident, out = where(ready, raw)
    engines = EnginePool(ready.bindings, endpoints=ready.endpoints)
    note = embedded_note(ready.bindings)
    if note:
        print(note)
    store = RunDir(out)
    store.open(manifest(cfg, raw, ready.dataset, ready, engines, ident), ident)
    engine_log.place(out / layout.ENGINE_LOG)
    stopped: list[str] = []
    names = list(layout.run_episodes(cfg, [s.id for s in ready.dataset.specs]))
    sharding = layout.sharding_note(cfg, len(ready.dataset.specs))
    if sharding:
        print(f"shard {cfg.shard.index} of {cfg.shard.count}: {len(names)} episodes; {sharding}")
    try:
        if all(store.has_result(n) for n in names):
            # Nothing to run: no engine is started, the stored results are reported.
            print(f"all {len(names)} episodes already finished in {out}; nothing left to do")
            results = {n: store.load_result(n) for n in names}
        else:
            results = asyncio.run(_run_async(ready, specs, engines, store, stopped, tuple(names)))
        if not stopped:
            store.mark_done(len(names))
    except asyncio.CancelledError:
        results = {}
    except Exception as exc:
        known = exit_for(exc, resume_hint("every committed turn is checkpointed", out))
        if known is None or known.code not in (EXIT_ENGINE_DEAD, EXIT_SYSTEMATIC):
            raise
        known.print()
        return known.code
    finally:
        store.close()
    if stopped:
        left = sum(not store.has_result(n) for n in names)
        print(
            f"stopped by {stopped[0]}: " + resume_hint(f"{left} unfinished episode(s) checkpointed", out),
            file=sys.stderr,
        )
        return EXIT_SIGNAL[stopped[0]]
    rows = [(out.name, aggregate([episode_metrics(r) for r in results.values()], cfg.max_turns))]
    print(results_table(rows))
    for line in call_summary(store.calls_path):
        print(line)
    print(f"run directory: {out}")
    broken = systematic_invalid(results.values(), cfg.max_invalid_share)
    if broken:
        print(f"error: {broken} (max_invalid_share={cfg.max_invalid_share})", file=sys.stderr)
        return EXIT_SYSTEMATIC
    if on_finished is not None:
        on_finished(out)
    return 0


async def _run_async(
    ready: Ready,
    specs: tuple[Spec, ...],
    engines: EnginePool,
    store: RunDir,
    stopped: list[str],
    episodes: tuple[str, ...],
) -> dict[str, EpisodeResult]:
    # SIGTERM (Slurm preemption) and SIGINT cancel the run; each committed turn
    # is already on disk, so cancelling loses at most the turns in flight.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):

        def on_signal(name: str = sig.name) -> None:
            stopped.append(name)
            if task:
                task.cancel()

        loop.add_signal_handler(sig, on_signal)
    cfg = ready.cfg
    bar = Progress(enabled=cfg.progress, every_s=cfg.progress_every_s, heartbeat_s=cfg.status.heartbeat_s)
    bar.add_run("run", list(episodes), cfg.max_turns, store.root)
    with bar.beating("run", stopped):  # status.json from the engines' loading to the run's end (mode=status)
        started = await engines.start()
        try:
            bar.start()
            try:
                return await play(ready, specs, started, store, bar, "run", episodes)
            finally:
                bar.close()
        finally:
            await engines.close()


async def play(
    ready: Ready,
    specs: tuple[Spec, ...],
    engines: Mapping[str, Engine],
    store: RunDir,
    bar: Progress,
    name: str,
    episodes: tuple[str, ...] | None = None,
) -> dict[str, EpisodeResult]:
    """Every unfinished episode of `specs` (each trial, or only `episodes`), on these engines (role ->
    engine), metered on `bar`."""
    cfg = ready.cfg
    roles = with_engines(ready.bindings, engines, ROLES, wrap=lambda e: Metered(e, bar, name))
    calls = CallService(roles=roles, pack=ready.pack, store=store, seed=cfg.seed, vary=cfg.trials.roles)
    assert ready.player is not None
    scheduler = EpisodeScheduler(
        specs=specs,
        calls=calls,
        store=store,
        settings=EpisodeSettings(
            max_turns=cfg.max_turns,
            concurrency=cfg.concurrency,
            speculative_player=cfg.speculative_player,
            failure_modes=cfg.audit.failure_modes,
            trials=cfg.trials.count,
        ),
        make_narrator=lambda: ready.make_narrator(roles),
        player=ready.player,
        engines=engines,
        on_result=lambda r: bar.result(name, r.episode, len(r.turns)),
        on_turn=lambda sid, n: bar.turn(name, sid, n),
        episodes=episodes,
    )
    try:
        return await scheduler.run()
    except BaseExceptionGroup as group:
        # Surface the first non-episode failure (a dead engine) as itself.
        raise group.exceptions[0] from None


def call_summary(calls_path: str | Path) -> list[str]:
    """The call log in words: calls per stage, then, for a stage where something happened, how many
    answers were cut at their token bound (and after how long), failed otherwise, or were retried;
    then tokens (prompt, cached, generated, hit rate)."""
    if not Path(calls_path).exists():
        return []
    calls = read_calls(calls_path)
    by_stage: dict[str, list[CallLine]] = {}
    for c in calls:
        by_stage.setdefault(c.stage, []).append(c)
    # A call is a question to a model; its retries are further attempts of the same call (as in the
    # report's cost table), said apart below.
    lines = [f"calls: {_asked(calls)} (" + ", ".join(f"{k} {_asked(v)}" for k, v in by_stage.items()) + ")"]
    for stage, cs in by_stage.items():
        said = _stage_events(cs)
        if said:
            lines.append(f"  {stage}: {_count(_asked(cs), 'call')}, " + ", ".join(said))
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    cached = sum(c.cached_tokens or 0 for c in calls)
    lines.append(
        f"tokens: prompt={prompt} cached={cached} generated={sum(c.generated_tokens or 0 for c in calls)}"
        + (f" cache_hit={cached / prompt:.2f}" if prompt else "")
    )
    return lines


def _asked(calls: list[CallLine]) -> int:
    return sum(c.attempt == 0 for c in calls)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _stage_events(calls: list[CallLine]) -> list[str]:
    """What went other than plainly for one stage's calls, in words ([] when nothing did)."""
    said = []
    cut = [c for c in calls if c.finish_reason == "length"]
    if cut:
        bounds = sorted({c.max_tokens_sent or 0 for c in cut})
        bound = f"{bounds[0]}-token bound" if len(bounds) == 1 and bounds[0] else "token bound"
        secs = sum(c.latency_s or 0.0 for c in cut)
        said.append(
            f"1 cut at its {bound} after {secs:.0f} s"
            if len(cut) == 1
            else f"{len(cut)} cut at their {bound} after {secs:.0f} s in all"
        )
    failed = sum(c.error is not None and c.finish_reason != "length" for c in calls)
    if failed:
        said.append(f"{failed} failed")
    retried = sum(c.attempt > 0 for c in calls)
    if retried:
        said.append(f"{retried} {'retry' if retried == 1 else 'retries'}")
    return said
