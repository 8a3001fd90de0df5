"""Admission by cache capacity (execution/admission.py) against a fake engine with a given KV cache."""

from __future__ import annotations

import asyncio
import copy
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import RandomPolicy, make_spec
from ncp_local.engines.scripted import ScriptedEngine
from ncp_local.execution.admission import _BLOCK, _EXACT, Admission, Prompt, resident
from ncp_local.execution.calls import CallService, RoleBinding, Sampling
from ncp_local.execution.footprint import counter, estimate
from ncp_local.execution.scheduler import EpisodeScheduler, EpisodeSettings
from ncp_local.protocol.ledger import Exchange, initial_state
from ncp_local.protocol.narrators import BaselineNarrator
from ncp_local.protocol.player import Player
from ncp_local.protocol.prompts import History, Placed, PromptPack, player_vars, rendered
from ncp_local.protocol.records import Checkpoint
from ncp_local.rundir.store import RunDir

CALM = RandomPolicy(conflict_rate=0.0, node_rate=0.3, satisfy_rate=0.0)


@dataclass
class Watched(Admission):
    """Records every decision: who is in flight after each admission and each turn boundary."""

    # (event, episode, what it holds, what all in flight hold, how many, the oldest in flight, turns committed)
    log: list[tuple[str, str, int, int, int, str, int]] = field(default_factory=list)

    def _admit_head(self) -> None:
        before = set(self.in_flight)
        super()._admit_head()
        for e in sorted(self.in_flight - before, key=lambda e: self.episodes[e].order):
            self._record("admit", e)

    def _total(self) -> int:
        return sum(self.held(e) for e in self.capacity)

    def _record(self, event: str, e: str) -> None:
        own = sum(self.holds(e, c) for c in self.capacity)
        commits = sum(ep.commits for ep in self.episodes.values())
        self.log.append((event, e, own, self._total(), len(self.in_flight), self.oldest(), commits))

    async def turn_done(self, episode_id: str) -> None:
        await super().turn_done(episode_id)
        # (recorded once it is back in flight, if it stepped back)
        self._record("turn", episode_id)


def _run(
    root: Path,
    kv_tokens: int | None,
    concurrency: int,
    episodes: int = 8,
    turns: int = 6,
    start: dict[str, Checkpoint] | None = None,
) -> tuple[dict, Watched]:
    engine = ScriptedEngine(policy=CALM, delay_s=0.001)
    engine.kv_tokens = kv_tokens  # type: ignore[attr-defined]
    pack = PromptPack.load(None)
    store = RunDir(root)
    store.open({"test": True}, identity="test")
    for cp in (start or {}).values():
        store.write_checkpoint(cp)
    roles = {r: RoleBinding(engine, Sampling(), "scripted") for r in ("narrator", "player", "auditor")}
    specs = tuple(make_spec(f"e{i}", n_nodes=4) for i in range(episodes))
    sched = EpisodeScheduler(
        specs=specs,
        calls=CallService(roles=roles, pack=pack, store=store, seed=3),
        store=store,
        settings=EpisodeSettings(max_turns=turns, concurrency=concurrency, play_through=True),
        make_narrator=lambda: BaselineNarrator(pack),
        player=Player("adversarial"),
        engines={r: engine for r in roles},
    )
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
    last = max(ep.on(e) for ep in unbounded.episodes.values() for e in ep.calls)
    cap = int(last * 2.5)  # two episodes at their longest, more early on
    bound, watched = _run(tmp_path / "bound", cap, concurrency=8)
    # Results do not depend on when an episode runs; every one finished (nobody starved).
    assert bound == free and len(bound) == 8
    assert unbounded.peak == 8 and unbounded.pauses == 0  # no cache bound: concurrency is the bound
    admits = [x for x in watched.log if x[0] == "admit"]
    for event, episode, _, held, n, oldest, _ in watched.log:
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
    # Late turns (each episode near its longest: 0.35 x cap = 0.9 x the longest footprint) run at
    # most three; at start-up, before any turn, several ran at once.
    late = [n for event, _, own, _, n, _, _ in watched.log if event == "turn" and own > 0.35 * cap]
    assert late and max(late) <= 3
    assert max(n for event, *_, n, _, commits in watched.log if commits == 0) >= 3
    # concurrency stays an upper bound.
    _, capped = _run(tmp_path / "capped", None, concurrency=3)
    assert capped.peak == 3


def test_a_lone_episode_larger_than_the_cache_still_runs(tmp_path: Path) -> None:
    results, watched = _run(tmp_path, 10, concurrency=4, episodes=3, turns=2)
    assert len(results) == 3 and watched.peak == 1


def test_at_start_up_every_episode_the_cache_holds_is_admitted_at_once(tmp_path: Path) -> None:
    """Before any call: a large cache admits `concurrency` episodes, a small one as many estimated
    footprints as it holds (not one alone until the first has played a turn)."""
    _, large = _run(tmp_path / "large", 10**7, concurrency=6, turns=2)
    assert [n for event, *_, n, _, commits in large.log if commits == 0][-1] == 6
    one = sum(large.estimate("e0").values())  # what the guess was before any turn
    _, small = _run(tmp_path / "small", int(3.5 * one), concurrency=6, turns=2)
    start = [(held, n) for event, *_, held, n, _, commits in small.log if commits == 0]
    assert start[-1][1] == 3 and all(held <= int(3.5 * one) for held, _ in start)


def test_a_resumed_episode_is_estimated_from_its_checkpoint(tmp_path: Path) -> None:
    """A checkpoint's history makes every stage's prompt longer: a resumed episode is guessed larger
    than a fresh one, and start-up admits fewer of them into the same cache."""
    results, _ = _run(tmp_path / "played", None, concurrency=8, episodes=4, turns=5)
    from ncp_local.protocol.records import EpisodeResult

    done = {k: EpisodeResult.model_validate_json(v) for k, v in results.items()}
    start = {
        k: Checkpoint(
            spec_id=r.spec_id,
            state=r.final_state,
            opening_update=r.opening_update,
            turns=r.turns,
            narrator_state={},
            opening_bound_hits=r.opening_bound_hits,
        )
        for k, r in done.items()
    }
    pack, count = PromptPack.load(None), counter(ScriptedEngine())
    spec = make_spec("e0", n_nodes=4)
    fresh = estimate(spec, None, pack, {"narrator": count, "player": count, "auditor": count})
    resumed = estimate(spec, start["e0"], pack, {"narrator": count, "player": count, "auditor": count})
    # Every stage a turn asks, and a fresh episode's opening; the history lengthens every prompt but the
    # fact update's (which has none); the prefix the narration and the conflict check share counts once.
    assert set(fresh["narrator"]) == {"opening", "narrate"} and set(resumed["narrator"]) == {"narrate"}
    assert set(resumed["auditor"]) == {"fact_update", "conflict_check", "trajectory_check", "status_check"}
    for role, stage in (("player", "player"), ("auditor", "trajectory_check"), ("narrator", "narrate")):
        assert resumed[role][stage][0] > fresh[role][stage][0] + 100
    calls = {f"{r}/{s}": c for r, stages in resumed.items() for s, c in stages.items()}
    held = resident(calls)
    assert held < sum(c[0] for c in calls.values()) - resumed["narrator"]["narrate"][0] // 2
    cap = int(2.5 * held)
    _, cold = _run(tmp_path / "cold", cap, concurrency=4, episodes=4, turns=6)
    _, warm = _run(tmp_path / "warm", cap, concurrency=4, episodes=4, turns=6, start=start)
    first = {
        name: [n for event, *_, n, _, commits in w.log if commits == 0][-1]
        for name, w in (("cold", cold), ("warm", warm))
    }
    assert first["warm"] == 2 and first["cold"] > 2


def test_a_prefix_two_stages_share_is_counted_once() -> None:
    """vLLM keeps one copy of a shared prefix: three prompts of 10 tokens (one a character) that share
    their first 6 hold 10 + 4 + 4 tokens, plus each answer; a prompt shared whole counts once."""
    calls = {"b": (10, 1, "storyXYZab"), "a": (10, 2, "storyXQRST"), "c": (10, 3, "stoRY-----")}
    assert resident(calls) == (10 + 4 + 7) + (1 + 2 + 3)
    assert resident({"a": (8, 0, "abcdefgh"), "b": (8, 0, "abcdefgh")}) == 8
    assert resident({"a": (5, 5, "")}) == 10


def test_a_long_prompt_is_kept_as_blocks_and_its_shared_prefix_found_within_one() -> None:
    """The admission keeps no long prompt's text (at turn 100 an episode's stages' prompts are
    megabytes): a hash per block finds the prefix two prompts share to within a block, never more."""
    rng = random.Random(7)
    for _ in range(200):
        common = "".join(rng.choice("abc ") for _ in range(rng.randrange(0, 60_000)))
        a = common + "X" + "".join(rng.choice("ab") for _ in range(rng.randrange(0, 9_000)))
        b = common + "Y" + "".join(rng.choice("ab") for _ in range(rng.randrange(0, 9_000)))
        pa, pb = Prompt.of(a), Prompt.of(b)
        got = pa.shared(pb)
        assert got == pb.shared(pa) and len(common) - _BLOCK < got <= len(common), (len(common), got)
        if len(a) <= _EXACT and len(b) <= _EXACT:
            assert got == len(common)
        assert not pa.text or len(a) <= _EXACT  # no long text kept


def test_a_prompt_takes_the_blocks_of_its_stages_prompt_before_as_if_hashed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each prompt takes the blocks of its stage's prompt before where the history continued, hashing
    only the rest, and is what hashing its text whole makes: the admission, which decides from nothing
    else, then decides the same, call for call. (Whole runs' decisions cannot be compared across runs:
    the fake engine's sleeps make the order of calls depend on timing.)"""
    taken = []  # per prompt that took blocks: how many its history would give
    of = Prompt.of

    def checked(text: str, before: Prompt | None = None, placed: Placed | None = None) -> Prompt:
        got, whole = of(text, before, placed), of(text)
        assert got == whole  # chars, blocks, tail and short text: all the admission reads
        was = before.placed if before is not None else None
        if was is not None and placed is not None and (was.at, was.head) == (placed.at, placed.head):
            taken.append((placed.at + was.history.kept_by(placed.history)) // _BLOCK)
        return got

    free, unbounded = _run(tmp_path / "free", None, concurrency=8, turns=30)
    cap = int(max(ep.on(e) for ep in unbounded.episodes.values() for e in ep.calls) * 2.5)
    monkeypatch.setattr(Prompt, "of", staticmethod(checked))
    taking, watched = _run(tmp_path / "taking", cap, concurrency=8, turns=30)
    assert max(taken) >= 2 and sum(taken) >= 100, taken  # histories of whole blocks were taken, not hashed
    assert taking == free and watched.pauses > 0


def test_a_history_is_found_in_its_prompt_and_continues_only_its_own_past() -> None:
    pack = PromptPack.load(None)
    spec = make_spec("e0", n_nodes=3)
    state = initial_state(spec)
    for turn in range(3):
        state = state.model_copy(
            update={"exchanges": (*state.exchanges, Exchange(player_input=f"go {turn}", response=f"went {turn}"))}
        )
    variables = player_vars(spec, state)
    history = variables["history_text"]
    assert isinstance(history, History)
    placed = pack.history_in("player_natural", variables)
    text = pack.render("player_natural", variables)[0].content
    assert placed is not None and text[placed.at : placed.at + len(history)] == history
    assert "".join(placed.head) == text[: placed.at]
    grown = placed.history
    # A sibling history (the same past, another last exchange) continues the past, not the sibling.
    past = rendered(state.model_copy(update={"exchanges": state.exchanges[:2]}), "history").grown
    sibling = rendered(
        state.model_copy(update={"exchanges": (*state.exchanges[:2], Exchange(player_input="x", response="y"))}),
        "history",
    ).grown
    assert past.kept_by(grown) == past.pure and past.kept_by(sibling) == past.pure
    assert grown.kept_by(sibling) == 0 and sibling.kept_by(grown) == 0
    assert copy.deepcopy(history) == history and pickle.loads(pickle.dumps(history)).grown.pure == len(history)
    # A history the text's strip would cut, or after a placeholder that is not a plain name: not placed.
    pack2 = PromptPack(
        pack.root, {"t": "{history_text}  ", "u": "a {x!r} {history_text} b", "v": " a {history_text} b"}
    )
    assert pack2.history_in("t", variables) is None and pack2.history_in("u", {**variables, "x": "1"}) is None
    placed = pack2.history_in("v", variables)
    assert placed is not None and (placed.at, placed.head, placed.history) == (2, (" a ",), grown)
