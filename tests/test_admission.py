"""Admission by cache capacity (execution/admission.py) against a fake engine with a given KV cache."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from helpers import RandomPolicy, make_spec

from ncp_local.execution.admission import Admission
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.execution.scheduler import EpisodeScheduler, EpisodeSettings
from ncp_local.execution.store import RunDir
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.player import Player
from ncp_local.protocol.prompts import PromptPack
from ncp_local.engines.scripted import ScriptedEngine

CALM = RandomPolicy(conflict_rate=0.0, node_rate=0.3, satisfy_rate=0.0)


@dataclass
class Watched(Admission):
    """Records every decision: who is in flight after each admission and each turn boundary."""

    log: list[tuple[str, str, bool, int, int, str]] = field(default_factory=list)  # (event, episode, _, held, n, oldest)

    def _admit_head(self) -> None:
        before = set(self.in_flight)
        super()._admit_head()
        for e in sorted(self.in_flight - before, key=lambda e: self.episodes[e].order):
            self.log.append(("admit", e, True, self._total(), len(self.in_flight), self.oldest()))

    def _total(self) -> int:
        return sum(self.held(e) for e in self.capacity)

    async def turn_done(self, episode_id: str) -> None:
        await super().turn_done(episode_id)
        # (recorded once it is back in flight, if it stepped back)
        self.log.append(("turn", episode_id, True, self._total(), len(self.in_flight), self.oldest()))


def _run(root: Path, kv_tokens: int | None, concurrency: int, episodes: int = 8, turns: int = 6) -> tuple[dict, Watched]:
    engine = ScriptedEngine(policy=CALM, delay_s=0.001)
    engine.kv_tokens = kv_tokens  # type: ignore[attr-defined]
    pack = PromptPack.load(None)
    store = RunDir(root)
    store.open({"test": True}, identity="test")
    roles = {r: RoleBinding(engine, Sampling(), "scripted") for r in ("narrator", "player", "auditor")}
    specs = tuple(make_spec(f"e{i}", n_nodes=4) for i in range(episodes))
    sched = EpisodeScheduler(specs=specs, calls=CallService(roles=roles, pack=pack, store=store, seed=3),
                             store=store, settings=EpisodeSettings(max_turns=turns, concurrency=concurrency,
                                                                   play_through=True),
                             make_narrator=lambda: BaselineNarrator(pack), player=Player("adversarial"),
                             engines={r: engine for r in roles})
    base = Admission.for_engines(sched.engines, concurrency)
    watched = sched.admission = Watched(capacity=base.capacity, limit=base.limit, engine_of=base.engine_of)
    try:
        results = asyncio.run(sched.run())
    finally:
        store.close()
    return {k: v.model_dump_json() for k, v in results.items()}, watched


def test_admission_keeps_in_flight_within_the_cache_and_starves_nobody(tmp_path: Path) -> None:
    free, unbounded = _run(tmp_path / "free", None, concurrency=8)
    # Every episode's last footprint (all stages' prompts + answers) on the one engine.
    last = max(sum(ep.footprint[e].values()) for ep in unbounded.episodes.values() for e in ep.footprint)
    cap = int(last * 2.5)  # two episodes at their longest, more early on
    bound, watched = _run(tmp_path / "bound", cap, concurrency=8)
    # Results do not depend on when an episode runs; every one finished (nobody starved).
    assert bound == free and len(bound) == 8
    assert unbounded.peak == 8 and unbounded.pauses == 0  # no cache bound: concurrency is the bound
    admits = [x for x in watched.log if x[0] == "admit"]
    for event, episode, _, held, n, oldest in watched.log:
        # After every decision, what is in flight fits the cache, unless a lone episode (or the
        # oldest, which is never paused: that is what makes everyone finish) holds it.
        assert held <= cap or n == 1 or episode == oldest, (event, episode, held, cap, n)
    # First admissions come in spec order (nobody overtakes the queue's head).
    first = []
    for _, e, *_ in admits:
        if e not in first:
            first.append(e)
    assert first == [f"e{i}" for i in range(8)]
    # It adapts: more in flight while prompts are short than when they are long; some stepped back.
    assert watched.peak > 2 and watched.pauses > 0
    late = [n for event, _, _, held, n, _ in watched.log if event == "turn" and held > 0.8 * cap]
    assert late and max(late) <= 3
    # concurrency stays an upper bound.
    _, capped = _run(tmp_path / "capped", None, concurrency=3)
    assert capped.peak == 3


def test_a_lone_episode_larger_than_the_cache_still_runs(tmp_path: Path) -> None:
    results, watched = _run(tmp_path, 10, concurrency=4, episodes=3, turns=2)
    assert len(results) == 3 and watched.peak == 1
