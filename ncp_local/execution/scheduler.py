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
from dataclasses import dataclass, field, replace
from typing import Any

from ..protocol.episode import Episode
from ..protocol.narrators import Narrator
from ..protocol.player import Player
from ..protocol.records import Checkpoint
from ..protocol.spec import Spec
from ..protocol.trials import episode_names, parse_episode
from ..rundir.invalid import Outcome
from ..rundir.store import RunDir, StoredResults
from .admission import Admission
from .calls import FAIL_FAST_EPISODES, CallService, FailureWatch
from .footprint import counter, estimate

# Requests the writer thread may have queued before a committing episode waits for its own line: a
# bound on the work a kill loses and on the memory the queue holds.
WRITER_LAG = 256


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int = 100
    concurrency: int = 64
    play_through: bool = False  # benchmarks only: see Episode.play_through
    failure_modes: bool = False  # audit.failure_modes: see protocol.episode.audit_response
    speculative_player: bool = False  # ask the next turn's player during the audits (see Speculation)
    trials: int = 1  # plays of each story (protocol/trials.py names them)


def episodes_of(specs: tuple[Spec, ...], trials: int) -> list[tuple[str, Spec, int]]:
    """(episode name, spec, trial) for every play, in `trials.episode_names`' order."""
    by_id = {s.id: s for s in specs}
    return [
        (name, by_id[sid], t)
        for name in episode_names([s.id for s in specs], trials)
        for sid, t in [parse_episode(name)]
    ]


@dataclass
class EpisodeScheduler:
    specs: tuple[Spec, ...]
    calls: CallService
    store: RunDir
    settings: EpisodeSettings
    make_narrator: Callable[[], Narrator]
    player: Player
    # (episode, turns it played) once its result is asked for (written by the store's writer: read it there).
    on_result: Callable[[str, int], None] | None = None
    # (spec id, turns committed so far): after each checkpoint, and once when a checkpoint is resumed
    # (progress counts turns, not episodes: a 100-turn episode is hours of work).
    on_turn: Callable[[str, int], None] | None = None
    # role -> its engine, one object per engine (roles on one engine share its cache): the admission reads
    # each engine's `kv_tokens`; none: no cache bound.
    engines: Mapping[str, Any] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # episodes with a result (on disk, not held)
    # How each episode this scheduler ended ended (the run's verdict reads it, not the results on disk).
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    # The episodes to play, when not every trial of every spec (a shard that deals a story's trials out).
    episodes: tuple[str, ...] | None = None
    admission: Admission | None = None  # by default made by run() from `engines`; the bench reads its peak

    async def _one(
        self,
        name: str,
        spec: Spec,
        trial: int,
        gate: Admission,
        checkpoint: Checkpoint | None,
    ) -> None:
        await gate.enter(name)
        try:
            if self.calls.pacer is not None:
                await self.calls.pacer.pace()  # every episode starts in one pass: its first steps paced
            if checkpoint is not None and self.on_turn:
                self.on_turn(name, checkpoint.committed)

            async def on_commit(cp: Checkpoint) -> None:
                # The episode knows its story, not which play of it this is: the records say.
                # The writer thread writes it, in order (nothing later overtakes it), while the episode
                # goes on: nobody waits for the disk, and the schedule stays the loop's alone (on the
                # scripted engine, the same every run). Only a writer that falls behind holds it back.
                written = self.store.write_checkpoint(cp.model_copy(update={"trial": trial}) if trial else cp)
                if self.store.writes_pending() > WRITER_LAG:
                    await asyncio.wrap_future(written)
                    if self.calls.pacer is not None:
                        await self.calls.pacer.pace()  # the writer lets many go at once: not all in one pass
                if self.on_turn:
                    self.on_turn(name, cp.committed)
                await gate.turn_done(name)

            episode = Episode(
                spec,
                self.make_narrator(),
                self.player,
                self.calls.ask_for(name),
                self.settings.max_turns,
                on_commit,
                play_through=self.settings.play_through,
                speculative_player=self.settings.speculative_player,
                failure_modes=self.settings.failure_modes,
            )
            ending = await episode.run(checkpoint)
            if trial:
                ending = replace(ending, head=ending.head.model_copy(update={"trial": trial}))
            # The writer makes the result from the turn log it wrote, after the log's last line; nothing
            # here waits for it (an episode that did made the order of play depend on the writer thread).
            self.store.write_ending(ending)
            self.finished.add(name)
            self.outcomes[name] = Outcome(ending.head.termination, ending.head.reason, ending.turns)
            if self.on_result:
                self.on_result(name, ending.turns)
        finally:
            gate.leave(name)

    async def run(self) -> StoredResults:
        """Play every episode (each trial of each spec) without a result; returns all results by
        episode name, in spec order (a story's trials in trial order), read from the run directory when
        asked."""
        plays = episodes_of(self.specs, self.settings.trials)
        if self.episodes is not None:
            mine = set(self.episodes)
            plays = [p for p in plays if p[0] in mine]
        self.finished |= {name for name, _, _ in plays if self.store.has_result(name)}
        todo = [(name, s, t) for name, s, t in plays if name not in self.finished]
        if self.calls.watch is None:
            self.calls.watch = FailureWatch(threshold=min(len(todo), FAIL_FAST_EPISODES) or 1)
        gate = self.admission = self.admission or Admission.for_engines(self.engines, self.settings.concurrency)
        checkpoints = {name: self.store.load_checkpoint(name) for name, _, _ in todo}
        # What each episode will hold before it has run (a resumed one from its checkpoint), for the
        # engines with a cache bound only: the admission's start-up guess.
        counts = {
            role: counter(engine)
            for role, engine in self.engines.items()
            if gate.capacity.get(gate.engine_of[role]) is not None
        }
        by_id = {name: s for name, s, _ in todo}
        gate.register(
            list(by_id),
            (lambda sid: estimate(by_id[sid], checkpoints[sid], self.calls.pack, counts)) if counts else None,
            resumed={sid for sid, cp in checkpoints.items() if cp is not None},
        )
        if self.calls.observe is None:
            self.calls.observe = gate.observe
        # A TaskGroup cancels every episode if one raises something that is not
        # an episode's own failure (a dead engine): the run stops, checkpoints stand.
        async with asyncio.TaskGroup() as tg:
            for name, spec, trial in todo:
                tg.create_task(self._one(name, spec, trial, gate, checkpoints[name]))
        return StoredResults(self.store, [name for name, _, _ in plays], self.outcomes)
