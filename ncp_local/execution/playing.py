"""Playing episodes: the one place a call service and a scheduler are put together.

The life plays each of its points here (execution/life.py), and the plan's prompt projection plays its
few turns on scripted answers here too (execution/projection.py): pre-flight asks for that projection
before any life starts, so this sits below both.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Mapping
from typing import Any

from ..engines.base import Engine
from ..protocol import ROLES
from ..protocol.spec import Spec
from ..rundir.store import RunDir, StoredResults
from .admission import Admission
from .calls import CallService, Pacer, with_engines
from .progress import Metered, Progress
from .ready import Ready
from .scheduler import EpisodeScheduler, EpisodeSettings


async def play(
    ready: Ready,
    specs: tuple[Spec, ...],
    engines: Mapping[str, Engine],
    store: RunDir,
    bar: Progress,
    name: str,
    episodes: tuple[str, ...] | None = None,
    wrap: Callable[[Engine], Engine] | None = None,
    play_through: bool = False,
    pacer: Pacer | None = None,
) -> tuple[StoredResults, Admission | None]:
    """Every unfinished episode of `specs` (each trial, or only `episodes`) on these engines (role ->
    engine), metered on `bar`; `pacer`: shared by every point of this event loop. `wrap`: what the
    episodes see in place of each engine (mode=bench's recorder, or its scripted and prefill-only
    answers), made once per engine, so that roles sharing an engine still share its cache in the
    admission. The results, and the admission that let the episodes in (the bench reads its peak)."""
    cfg = ready.cfg
    seen = {id(e): wrap(e) if wrap else e for e in engines.values()}
    shown = {role: seen[id(e)] for role, e in engines.items()}
    roles = with_engines(ready.bindings, shown, ROLES, wrap=lambda e: Metered(e, bar, name))
    calls = CallService(roles=roles, pack=ready.pack, store=store, seed=cfg.seed, vary=cfg.trials.roles, pacer=pacer)
    assert ready.player is not None
    scheduler = EpisodeScheduler(
        specs=specs,
        calls=calls,
        store=store,
        settings=EpisodeSettings(
            max_turns=cfg.max_turns,
            concurrency=cfg.concurrency,
            play_through=play_through,
            speculative_player=cfg.speculative_player,
            failure_modes=cfg.audit.failure_modes,
            trials=cfg.trials.count,
        ),
        make_narrator=lambda: ready.make_narrator(roles),
        player=ready.player,
        engines=shown,
        on_result=lambda episode, turns: bar.result(name, episode, turns),
        on_turn=lambda sid, n: bar.turn(name, sid, n),
        episodes=episodes,
    )
    # What the process holds before the episodes start stays: the collector's full passes (each one a stall
    # of the loop, tens of ms) need not walk it, and come ten times rarer. The young garbage goes first; a
    # full collection here was itself a stall of 100 ms (the engine's objects, the other points' episodes).
    # Given back when the point ends: what was frozen and has died since is garbage a full pass can take.
    thresholds = gc.get_threshold()
    gc.collect(1)
    gc.freeze()
    # A generation-1 collection walks what survived the young ones since the last: with 400 episodes, ten
    # young passes' survivors took 40-60 ms at once; after every 2nd it walks about a fifth as many, the
    # same objects in all (issue 67). Full passes come after as many young ones as before (10 x 100).
    gc.set_threshold(thresholds[0], 2, 500)
    refreeze = FreezeSurvivors(asyncio.get_running_loop())
    gc.callbacks.append(refreeze)
    try:
        results = await scheduler.run()
        # The writer makes the results from the endings it holds (800 at once at a paper run's end): the
        # heap stays frozen until it has, or a full collection in its thread walks them all with the
        # interpreter held (420 ms of the loop at 800 episodes, unfrozen as play returned).
        await asyncio.to_thread(store.flush)
        return results, scheduler.admission
    except BaseExceptionGroup as group:
        # Surface the first non-episode failure (a dead engine) as itself.
        raise group.exceptions[0] from None
    finally:
        refreeze.stop()
        gc.callbacks.remove(refreeze)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class FreezeSurvivors:
    """A `gc.callbacks` hook: after each collection of the middle or the oldest generation, what the heap
    holds is frozen (early in the loop's next pass), so the oldest generation stays near empty and a full
    collection walks next to nothing. Freezing after full collections only, each full one still walked all
    that had survived since the last: 220-290 ms of the loop at 800 episodes (issue 67). What is frozen and
    dies in a cycle meanwhile waits for the point's end (`play`'s unfreeze): none did in a 200-episode
    paper-length run (the collection after the unfreeze found nothing unreachable). `stop()` before that
    unfreeze: a freeze still scheduled then does nothing (it would hold the heap frozen past play)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.on = loop, True

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info.get("generation", 0) >= 1 and self.on and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._freeze)  # not inside the collection, nor in the writer's thread

    def _freeze(self) -> None:
        if self.on:
            gc.freeze()

    def stop(self) -> None:
        self.on = False
