"""Admission by cache capacity: how many episodes are in flight on each engine.

A surviving episode comes back to its engine every few seconds with a prompt
that extends the one before; vLLM's prefix cache spares the recompute only if
that prefix is still resident. When the episodes in flight hold more than the
engine's KV cache, vLLM evicts each one's prefix before its next call and
every call recomputes its whole prompt (thrashing). So an episode is admitted
only while every in-flight episode's prefix fits beside it:

  - an episode's footprint on an engine is what its stages' last prompts and
    answers there hold in a prefix cache: every stage's prompt + answer, less
    the prefix it shares with another stage's prompt (vLLM keeps one copy of a
    shared prefix; most stages start with the same story material and
    history, PROTOCOL section 3), measured on the prompt texts;
  - before an episode has played a whole turn, its footprint is estimated
    (footprint.py: each stage's prompt filled from the episode's state, a
    resumed one's from its checkpoint, shared prefixes once), rescaled by the mean ratio of measured to
    estimated footprint of the episodes that have played one; until then it holds the larger of
    the estimate and what its calls measured. So at start-up every episode the
    cache holds is admitted at once, up to `concurrency`;
  - the head of the queue (episodes in spec order) starts when its footprint
    fits every engine beside those in flight, or when nothing is in flight;
    `concurrency` stays an upper bound; nobody overtakes the head;
  - prompts grow: at its turn boundary, an episode that finds an engine over
    capacity steps back into the queue (at its place in spec order) until the
    cache holds it again, unless it is the oldest in flight (a call in flight
    cannot be paused, so the rest step back at their own boundaries).

No starvation: the oldest episode in flight is never paused, so it finishes;
then the next oldest is the oldest, and so on; the queue is served in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol.prompts import Placed

# An episode -> the prompts its next turn would send: role -> stage -> (prompt, answer tokens, text).
Estimator = Callable[[str], Mapping[str, Mapping[str, tuple[int, int, str]]]]


@dataclass
class _Episode:
    order: int
    # engine -> tokens, before its first whole turn; None: not estimated yet (done when first needed,
    # so a run of thousands of episodes does not tokenize them all at start)
    estimated: dict[str, int] | None = None
    to_know: int = 2  # commits until every stage has been asked: opening and turn 0, or 1 turn on resume
    # engine -> stage -> (prompt tokens, answer tokens, the prompt's blocks) of its last call there
    calls: dict[str, dict[str, tuple[int, int, Prompt]]] = field(default_factory=dict)
    footprint: dict[str, int] = field(default_factory=dict)  # engine -> resident tokens (of `calls`)
    known: bool = False  # a whole turn measured: the footprint replaces the estimate
    commits: int = 0
    stale: set[str] = field(default_factory=set)  # engines called since their footprint was last summed

    def on(self, engine: str) -> int:
        # Summed when asked (an admission decision, once a turn), not after each of a turn's calls.
        if engine in self.stale:
            self.stale.discard(engine)
            self.footprint[engine] = resident(self.calls[engine])
        return self.footprint.get(engine, 0)


_BLOCK = 2048
_EXACT = 16_384


@dataclass(frozen=True)
class Prompt:
    """A prompt as the admission keeps it: its length, a hash per whole block of `_BLOCK` characters and
    the characters after the last one. Enough to find the prefix two prompts share (to within a block,
    exactly for prompts shorter than one) without keeping the text: at turn 100 an episode's stages'
    prompts are megabytes, kept for every episode in flight."""

    chars: int
    blocks: tuple[int, ...]
    tail: str
    text: str = ""  # the whole text, kept while it is short (`_EXACT`): a short prompt's sharing is exact
    # Where the text holds a history (and what comes before it): what the stage's next prompt needs to
    # take this one's blocks instead of hashing them.
    placed: Placed | None = field(default=None, compare=False)

    @classmethod
    def of(cls, text: str, before: Prompt | None = None, placed: Placed | None = None) -> Prompt:
        """The prompt of `text`; `placed`: where it holds a history (CallService.ask). Its blocks are the
        hashes of its text's blocks, however found: the leading ones of `before` (the stage's prompt
        before) as far as both texts are known to agree, the text before the history being the same and
        the history continuing the one `before` held (a few fields compared, not the text). At turn 100
        the history is most of a prompt: hashing it whole on every call was a tenth of the rig's CPU."""
        reused: tuple[int, ...] = ()
        was = before.placed if before is not None else None
        if before is not None and was is not None and placed is not None:
            if was.at == placed.at and was.head == placed.head:
                agree = min(placed.at + was.history.kept_by(placed.history), before.chars, len(text))
                reused = before.blocks[: agree // _BLOCK]
        whole = len(text) - len(text) % _BLOCK
        blocks = reused + tuple(hash(text[i : i + _BLOCK]) for i in range(len(reused) * _BLOCK, whole, _BLOCK))
        return cls(len(text), blocks, text[whole:], text if len(text) <= _EXACT else "", placed)

    def shared(self, other: Prompt) -> int:
        """Characters the two prompts share at their start: exactly when both are short; else the equal
        leading blocks, then, where both end within the next block, their tails' common prefix."""
        if self.text and other.text:
            return _common(self.text, other.text)
        n = 0
        for a, b in zip(self.blocks, other.blocks, strict=False):
            if a != b:
                return n * _BLOCK
            n += 1
        if n == len(self.blocks) == len(other.blocks):
            return n * _BLOCK + _common(self.tail, other.tail)
        return n * _BLOCK

    def key(self) -> tuple[tuple[int, ...], str]:
        return self.blocks, self.tail


def _common(a: str, b: str) -> int:
    """Length of the common prefix (a binary search over comparisons that run in C). Only the part not
    yet known to match is compared (and copied): linear in the prompts' length, not n log n."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):  # a[:lo] == b[:lo] already
            lo = mid
        else:
            hi = mid - 1
    return lo


def resident(calls: Mapping[str, tuple[int, int, str | Prompt]]) -> int:
    """Tokens these calls' prompts and answers hold in a prefix cache where a shared prefix is kept once.

    In sorted order each prompt's longest common prefix with any other is with a neighbour (sorted by
    their blocks' hashes, prompts that share leading blocks are neighbours too), so the prompts' union
    (as a prefix tree) is their sum less each one's common prefix with the one before; characters
    convert to tokens at each prompt's own ratio.
    """
    total, before = 0, None
    held = [(p, a, t if isinstance(t, Prompt) else Prompt.of(t)) for p, a, t in calls.values()]
    for prompt, answer, text in sorted(held, key=lambda c: c[2].key()):
        shared = (before.shared(text) * prompt // text.chars if text.chars else 0) if before is not None else 0
        total += prompt + answer - shared
        before = text
    return total


@dataclass
class Admission:
    """Episodes in flight under each engine's KV capacity (tokens; None: unbounded) and `limit`."""

    capacity: dict[str, int | None]  # engine key -> KV tokens
    limit: int
    engine_of: dict[str, str]  # role -> engine key
    episodes: dict[str, _Episode] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    waiting: list[str] = field(default_factory=list)  # kept in spec order
    ratios: dict[str, list[float]] = field(default_factory=dict)  # engine -> measured / estimated footprints
    estimator: Estimator | None = None
    peak: int = 0  # most episodes in flight at once (reported by the bench)
    pauses: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def for_engines(cls, engines: Mapping[str, Any], limit: int) -> Admission:
        """Roles sharing one engine share its capacity: the engine's `kv_tokens` (absent: unbounded)."""
        engine_of = {role: f"engine{id(engine)}" for role, engine in engines.items()}
        capacity = {engine_of[role]: getattr(engine, "kv_tokens", None) for role, engine in engines.items()}
        return cls(capacity=capacity, limit=max(1, limit), engine_of=engine_of)

    def register(
        self,
        episode_ids: list[str],
        estimate: Estimator | None = None,
        resumed: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """Episodes in queue order; `estimate(episode)`: the prompts its next turn would send, per role
        and stage (footprint.estimate), asked when the admission first needs that episode's size."""
        if estimate is not None:
            self.estimator = estimate
        for order, eid in enumerate(episode_ids, start=len(self.episodes)):
            self.episodes[eid] = _Episode(order, to_know=1 if eid in resumed else 2)

    def estimate(self, episode_id: str) -> dict[str, int]:
        """What the episode would hold on each engine by its estimated prompts, shared prefixes once."""
        ep = self.episodes[episode_id]
        if ep.estimated is None:
            per_engine: dict[str, dict[str, tuple[int, int, str]]] = {}
            for role, stages in (self.estimator(episode_id) if self.estimator else {}).items():
                for stage, call in stages.items():
                    per_engine.setdefault(self.engine_of.get(role, role), {})[f"{role}/{stage}"] = call
            ep.estimated = {e: resident(c) for e, c in per_engine.items()}
        return ep.estimated

    # ---- what an episode holds ------------------------------------------------------------

    def observe(
        self,
        episode_id: str,
        role: str,
        stage: str,
        prompt: int,
        answer: int,
        text: str,
        placed: Placed | None = None,
    ) -> None:
        """A call of `episode_id` on its role's engine: its prompt and answer tokens and prompt text (and
        where that holds a history: `Prompt.of`)."""
        ep = self.episodes.get(episode_id)
        if ep is None:
            return
        engine = self.engine_of.get(role, role)
        calls = ep.calls.setdefault(engine, {})
        before = calls.get(stage)
        calls[stage] = (prompt, answer, Prompt.of(text, before[2] if before else None, placed))
        ep.stale.add(engine)

    def guess(self, episode_id: str, engine: str) -> int:
        """The estimate, rescaled by what the episodes that played a whole turn measured against theirs."""
        ratios = self.ratios.get(engine)
        return round(self.estimate(episode_id).get(engine, 0) * (sum(ratios) / len(ratios) if ratios else 1.0))

    def holds(self, episode_id: str, engine: str) -> int:
        """Tokens the episode holds, or will once it has played a turn (its measured footprint after that)."""
        ep = self.episodes[episode_id]
        return ep.on(engine) if ep.known else max(ep.on(engine), self.guess(episode_id, engine))

    def need(self, episode_id: str) -> dict[str, int]:
        """What the episode would hold on each engine, were it admitted."""
        return {e: self.holds(episode_id, e) for e in self.capacity}

    def held(self, engine: str) -> int:
        return sum(self.holds(e, engine) for e in self.in_flight)

    def fits(self, episode_id: str) -> bool:
        if not self.in_flight:
            return True  # one episode always runs, even one larger than the cache
        if len(self.in_flight) >= self.limit:
            return False
        need = self.need(episode_id)
        return all(cap is None or self.held(e) + need[e] <= cap for e, cap in self.capacity.items())

    def over(self) -> bool:
        return any(cap is not None and self.held(e) > cap for e, cap in self.capacity.items())

    # ---- entering, leaving, stepping back --------------------------------------------------

    def _admit_head(self) -> None:
        while self.waiting and self.fits(self.waiting[0]):
            self.in_flight.add(self.waiting.pop(0))
            self.peak = max(self.peak, len(self.in_flight))
        self._wake.set()

    def _queue(self, episode_id: str) -> None:
        self.waiting.append(episode_id)
        self.waiting.sort(key=lambda e: self.episodes[e].order)
        self._admit_head()

    async def _until_admitted(self, episode_id: str) -> None:
        while episode_id not in self.in_flight:
            self._wake.clear()
            await self._wake.wait()

    async def enter(self, episode_id: str) -> None:
        self._queue(episode_id)
        await self._until_admitted(episode_id)

    def leave(self, episode_id: str) -> None:
        self.in_flight.discard(episode_id)
        self._admit_head()

    def _measured(self, ep: _Episode) -> None:
        """A whole turn measured: its footprint replaces its estimate and rescales everyone else's."""
        ep.known = True
        for e in self.capacity:
            guessed = (ep.estimated or {}).get(e)
            if ep.on(e) and guessed:
                self.ratios.setdefault(e, []).append(ep.on(e) / guessed)

    def oldest(self) -> str:
        return min(self.in_flight, key=lambda e: self.episodes[e].order)

    async def turn_done(self, episode_id: str) -> None:
        """A turn committed: step back if an engine is over capacity, unless this is the oldest in flight."""
        ep = self.episodes[episode_id]
        ep.commits += 1
        if not ep.known and ep.commits >= ep.to_know:  # every stage has been asked
            self._measured(ep)
        self._admit_head()  # footprints changed: a smaller measure than the guess may make room
        if len(self.in_flight) <= 1 or not self.over() or self.oldest() == episode_id:
            return
        self.pauses += 1
        self.in_flight.discard(episode_id)
        await self.enter(episode_id)
