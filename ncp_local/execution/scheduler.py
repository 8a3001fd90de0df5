"""Many episodes at once: checkpoints, resume, fail fast.

Every episode is a coroutine; they run concurrently so the engine sees every
request in flight and batches them, as many at once as each engine's KV cache
holds with their prefixes resident (`admission.py`), at most `concurrency`. The scheduler never
special-cases a narrator method: it only hands each episode an `Ask` from the
call service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol.episode import Checkpoint, Episode, EpisodeResult
from ..protocol.narrators import Narrator
from ..protocol.player import Player
from ..protocol.spec import Spec
from .admission import Admission
from .calls import FAIL_FAST_EPISODES, CallService, FailureWatch
from .footprint import counter, estimate
from .store import RunDir


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 100
    concurrency: int = 64
    play_through: bool = False  # benchmarks only: see Episode.play_through
    failure_modes: bool = False  # audit.failure_modes: see protocol.episode.audit_response
    speculative_player: bool = False  # ask the next turn's player during the audits (see Speculation)


@dataclass
class EpisodeScheduler:
    specs: tuple[Spec, ...]
    calls: CallService
    store: RunDir
    settings: EpisodeSettings
    make_narrator: Callable[[], Narrator]
    player: Player
    on_result: Callable[[EpisodeResult], None] | None = None
    # (spec id, turns committed so far): after each checkpoint, and once when a checkpoint is resumed
    # (progress counts turns, not episodes: a 100-turn episode is hours of work).
    on_turn: Callable[[str, int], None] | None = None
    # role -> its engine (unwrapped): the admission reads each engine's `kv_tokens`; none: no cache bound.
    engines: Mapping[str, Any] = field(default_factory=dict)
    results: dict[str, EpisodeResult] = field(default_factory=dict)
    admission: Admission | None = None  # by default made by run() from `engines`; the bench reads its peak

    async def _one(self, spec: Spec, gate: Admission, checkpoint: Checkpoint | None) -> None:
        await gate.enter(spec.id)
        try:
            if checkpoint is not None and self.on_turn:
                self.on_turn(spec.id, len(checkpoint.turns))

            async def on_commit(cp: Checkpoint) -> None:
                self.store.write_checkpoint(cp)
                if self.on_turn:
                    self.on_turn(spec.id, len(cp.turns))
                await gate.turn_done(spec.id)

            episode = Episode(
                spec,
                self.make_narrator(),
                self.player,
                self.calls.ask_for(spec.id),
                self.settings.max_turns,
                on_commit,
                play_through=self.settings.play_through,
                speculative_player=self.settings.speculative_player,
                failure_modes=self.settings.failure_modes,
            )
            result = await episode.run(checkpoint)
            self.store.write_result(result)
            self.results[spec.id] = result
            if self.on_result:
                self.on_result(result)
        finally:
            gate.leave(spec.id)

    async def run(self) -> dict[str, EpisodeResult]:
        """Run every spec without a result; returns all results in spec order."""
        for spec in self.specs:
            if self.store.has_result(spec.id):
                self.results[spec.id] = self.store.load_result(spec.id)
        todo = [s for s in self.specs if s.id not in self.results]
        if self.calls.watch is None:
            self.calls.watch = FailureWatch(threshold=min(len(todo), FAIL_FAST_EPISODES) or 1)
        gate = self.admission = self.admission or Admission.for_engines(self.engines, self.settings.concurrency)
        checkpoints = {s.id: self.store.load_checkpoint(s.id) for s in todo}
        # What each episode will hold before it has run (a resumed one from its checkpoint), for the
        # engines with a cache bound only: the admission's start-up guess.
        counts = {
            role: counter(engine)
            for role, engine in self.engines.items()
            if gate.capacity.get(gate.engine_of[role]) is not None
        }
        by_id = {s.id: s for s in todo}
        gate.register(
            [s.id for s in todo],
            (lambda sid: estimate(by_id[sid], checkpoints[sid], self.calls.pack, counts)) if counts else None,
            resumed={sid for sid, cp in checkpoints.items() if cp is not None},
        )
        if self.calls.observe is None:
            self.calls.observe = gate.observe
        # A TaskGroup cancels every episode if one raises something that is not
        # an episode's own failure (a dead engine): the run stops, checkpoints stand.
        async with asyncio.TaskGroup() as tg:
            for spec in todo:
                tg.create_task(self._one(spec, gate, checkpoints[spec.id]))
        return {s.id: self.results[s.id] for s in self.specs}
