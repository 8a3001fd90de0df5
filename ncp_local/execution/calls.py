"""The call service: one validated model call with retries, per-call seeds and the call log.

Every stage's call goes through `CallService.ask`: the prompt rendered from
the pack, the stage's grammar and minimum room, up to `attempts` tries on the
same inputs, each logged; an answer is parsed and held to its role's bounds.
Episodes (`scheduler.py`), the build and the re-audit all call models this way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..bindings import Bindings, Sampling
from ..chat import Message
from ..engines import grammar
from ..engines.base import ContextOverflow, Engine, Request
from ..protocol import ROLES
from ..protocol.episode import CallFailed, ContextLimit
from ..protocol.prompts import Placed, PromptPack
from ..protocol.stages import (
    STAGES,
    UNBOUNDED,
    AuditIds,
    Bounds,
    IdForm,
    InvalidOutput,
    check_bounds,
    min_room,
    parse,
    regex_for,
    schema_for,
)
from ..protocol.trials import episode_name, parse_episode, seed_episode
from ..rundir.call_log import CallLine
from ..rundir.invalid import failure_kind
from ..rundir.store import RunDir
from .footprint import content_at, text_of

ATTEMPTS = 3
# Fail fast after this many episodes (or all, if fewer) failed a stage the same engine-side way.
FAIL_FAST_EPISODES = 3


@dataclass(frozen=True)
class RoleBinding:
    """A role's model: the backend serving it and its sampling settings."""

    backend: Engine
    sampling: Sampling
    model: str
    bounds: Bounds = UNBOUNDED
    # How the engine's grammars name ids (stages.IdForm; engines/grammar.id_form picks it per backend).
    id_form: IdForm = "enum"


class SystematicFailure(Exception):
    """The same engine-side cause failed a stage's first calls in every episode tried: stop the run."""

    def __init__(self, stage: str, model: str, cause: str, episodes: int) -> None:
        super().__init__(
            f"stage {stage} on model {model} failed in each of the first {episodes} episodes "
            f"before any answer was accepted: {cause}"
        )
        self.stage, self.model, self.cause = stage, model, cause


@dataclass
class FailureWatch:
    """Fail fast: a stage whose first calls fail the same engine-side way in `threshold`
    episodes, with no accepted answer yet, will fail in every episode (a grammar the
    backend cannot compile, an output reservation that leaves no prompt room)."""

    threshold: int
    accepted: set[str] = field(default_factory=set)
    failed: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def ok(self, stage: str) -> None:
        self.accepted.add(stage)

    def failed_call(self, stage: str, model: str, spec_id: str, error: str) -> None:
        kind = failure_kind(error)
        if kind is None or stage in self.accepted:
            return
        episodes = self.failed.setdefault((stage, kind), set())
        episodes.add(spec_id)
        if len(episodes) >= self.threshold:
            raise SystematicFailure(stage, model, error, len(episodes))


Effect = tuple[str, Any]  # ("log", call log entry) | ("ok", stage) | ("failed", (stage, model, spec id, error))


@dataclass
class TurnAsk:
    """The `Ask` of one episode's turn: calls bound to (spec, turn), and the
    output bounds their answers reached (for the turn record).

    A speculative ask (the next turn's player, asked before this turn's audits
    end) holds its side effects, the call log lines and the fail-fast watch's
    counts, until the episode settles it: used, they happen as if the call had
    been made in order; dropped, only the log lines are written, marked
    `speculative`. So a run's call log and fail-fast decisions do not depend
    on whether the player was asked early."""

    calls: CallService
    spec_id: str
    turn: int
    hits: list[str] = field(default_factory=list)
    held: list[Effect] | None = None
    # Tokens the accepted answers of thinking models spent thinking (the thoughts stay in the call log).
    thought_tokens: list[int] = field(default_factory=list)

    async def __call__(self, stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any:
        return await self.calls.ask(
            self.spec_id,
            self.turn,
            stage,
            template,
            variables,
            hits=self.hits,
            held=self.held,
            thoughts=self.thought_tokens,
            **kw,
        )

    def hold(self) -> None:
        self.held = []

    def settle(self, used: bool) -> None:
        held, self.held = self.held or [], None
        for kind, what in held:
            if used:
                self.calls.effect(kind, what)
            elif kind == "log":
                self.calls.effect(kind, what.model_copy(update={"speculative": True}))


# The event loop's work per pass (its thread's CPU), at most (about): past it, an answered call waits for
# the next pass. What becomes due during a pass (a timer, a vLLM engine's output) runs at the end of the
# next one, so it waits up to two passes. At 20 ms the probe of the rig-alone bench saw 60-90 ms of the
# loop's CPU; at 10 ms 20-50, but where a collection, which no pass can cut, adds its own (issue 67).
PASS_BUDGET_S = 0.01


class Pacer:
    """Keeps a pass of the event loop short when many answers arrive at once.

    An engine that answers every call in flight at once (a GPU's batch finishing; the scripted engine)
    makes every episode ready in the same pass, and the pass runs each one's next step: parse, log, the
    next prompt. At 200 episodes that was hundreds of ms in which nothing else ran (the heartbeat, the
    signal handlers, other points' episodes, a vLLM engine's output handler). Past `budget_s` of the loop
    thread's CPU in a pass, `pace` queues its caller; each later pass lets go as many of the queued, first
    come first, as the budget holds at the pass before's cost a step (a queued call is not woken each pass
    to find the pass full again: at 800 episodes that cost more than the calls). What each call computes
    does not change, only when.

    The pass's clock starts when the pass does (`_next_pass` runs first in each pass while episodes are
    busy), not at its first paced step: what ran before that step without pacing (an episode resuming
    from its audits, a speculative player's first prompt) counts too. A let-go call is held to the same
    budget: it waits again, at the head of the queue, if the pass is already full.
    """

    def __init__(self, budget_s: float = PASS_BUDGET_S) -> None:
        self.budget_s = budget_s
        # [the loop, its thread's CPU when the pass began, steps run]; None while no pass is watched.
        self._pass: list[Any] | None = None
        self._queued: deque[asyncio.Future[None]] = deque()
        self._step_s = budget_s  # a step's cost, measured by each busy pass (at first: one a pass)
        self._again = 0  # let-go calls that found this pass full and wait again, at the queue's head

    def _step(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Count a step in this pass; False (not counted) once the pass has spent its budget."""
        now = time.thread_time()  # the loop's own work: a core taken by another process is not its
        if self._pass is None or self._pass[0] is not loop:
            self._pass = [loop, now, 0]
            loop.call_soon(self._next_pass)  # early in the next pass
        elif now - self._pass[1] > self.budget_s:
            return False
        self._pass[2] += 1
        return True

    def _next_pass(self) -> None:
        assert self._pass is not None
        loop, began, ran = self._pass
        if not ran and not self._queued:
            self._pass = None  # idle: the next step starts a pass of its own
            return
        now = time.thread_time()
        if ran:
            # What a step costs the loop, its unpaced followers included (a floor: a clock that did not move).
            self._step_s = max((now - began) / ran, 1e-6)
        self._pass, self._again = [loop, now, 0], 0
        loop.call_soon(self._next_pass)  # before the calls let go below: they run after it, in its pass
        # As many as fit the budget at the last pass's cost a step. Not the last pass's count: those let go
        # now run in the next pass, so that count would be of the ones let go two passes ago.
        room, released = max(1, int(self.budget_s / self._step_s)), 0
        while self._queued and released < room:
            waiter = self._queued.popleft()
            if not waiter.done():  # a cancelled caller is passed over
                waiter.set_result(None)
                released += 1

    async def pace(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._queued and self._step(loop):
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._queued.append(waiter)
        while True:
            await waiter
            if self._step(loop):
                return
            waiter = loop.create_future()
            self._queued.insert(self._again, waiter)  # ahead of the rest, behind those let go before it
            self._again += 1


def call_seed(run_seed: int, spec_id: str, turn: int, stage: str, attempt: int) -> int:
    """A per-call seed: stable across processes and resumes, distinct per attempt."""
    key = f"{run_seed}/{spec_id}/{turn}/{stage}/{attempt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


@dataclass
class CallService:
    """Validated calls for the roles it binds, logged to `store`'s call log."""

    roles: dict[str, RoleBinding]  # "narrator", "player", "auditor"
    pack: PromptPack
    store: RunDir
    seed: int = 0
    # The roles whose calls in trials after the first draw seeds of their own (`trials.vary`); the
    # others draw trial 0's (protocol/trials.seed_episode).
    vary: frozenset[str] = frozenset(ROLES)
    attempts: int = ATTEMPTS
    watch: FailureWatch | None = None  # fail fast on a systematic engine-side failure (set by the scheduler)
    # (spec id, role, stage, prompt tokens, answer tokens, prompt text, where the text holds a history)
    # after each answered call: the admission's footprints.
    observe: Callable[[str, str, str, int, int, str, Placed | None], None] | None = None
    pacer: Pacer | None = None  # shared by the services of one event loop (a sweep's points)

    async def ask(
        self,
        episode: str,
        turn: int,
        stage: str,
        template: str,
        variables: dict[str, str],
        ids: AuditIds = AuditIds(),
        role: str | None = None,
        key: str = "",
        feedback: str = "",
        extra: str | None = None,
        hits: list[str] | None = None,
        held: list[Effect] | None = None,
        thoughts: list[int] | None = None,
        messages: tuple[Message, ...] | None = None,
        grammar: bool = True,
    ) -> Any:
        """One call of `episode` (an episode name, protocol/trials.py) with up to `attempts` tries on
        the same inputs; logs every attempt.

        `messages`: a method's own prompt, sent as it is (no template is rendered), and the answer's
        text returned as it came once it passes the stage's check (an official NCP-Bench method parses
        it itself; protocol/official_method.py); `grammar=False` sends it without the stage's grammar
        and checks only that the answer is not empty.

        `extra` appends a second template to the prompt (HiAgent's memory);
        `hits` collects the output bounds the accepted answer reached; `held`, when given, collects
        the call's side effects instead of making them (a speculative call, see `TurnAsk`); `thoughts` the tokens
        its thought took (a thinking model's).
        """

        def effect(kind: str, what: Any) -> None:
            if held is None:
                self.effect(kind, what)
            else:
                held.append((kind, what))

        if self.pacer is not None:
            # A call's prompt is made in the pass its caller resumed in, which the caller may have entered
            # unpaced (from its audits, a commit) or as a new task (a speculative player).
            await self.pacer.pace()
        info = STAGES[stage]
        binding = self.roles[role or info.role]
        seeded_as = seed_episode(episode, role or info.role, self.vary)
        spec_id, trial = parse_episode(episode)
        prepared = time.perf_counter()
        raw = messages is not None
        placed = None
        if messages is None:
            messages = self.pack.render(template, variables, feedback=feedback, extra=extra)
            if self.observe is not None and (within := self.pack.history_in(template, variables)) is not None:
                # Where it is in the text the admission sees (text_of): after the message's role.
                head = (messages[0].role, *within.head)
                placed = Placed(content_at(messages) + within.at, head, within.history)
        schema = schema_for(stage, ids, binding.bounds, binding.id_form) if info.json and grammar else None
        regex = regex_for(stage, binding.bounds) if grammar else None
        room = min_room(stage, ids)
        # The rig's own time per call (render, schema, parse, log), apart from the engine's.
        overhead = time.perf_counter() - prepared
        last = ""
        for attempt in range(self.attempts):
            # `key` tells apart two calls of one stage in one turn (a retrieval, a re-ask).
            seed = call_seed(self.seed, seeded_as, turn, f"{stage}/{key}" if key else stage, attempt)
            request = Request(
                messages=messages,
                temperature=binding.sampling.temperature,
                top_p=binding.sampling.top_p,
                max_tokens=binding.sampling.max_tokens,
                seed=seed,
                json_schema=schema,
                regex=regex,
                min_room=room,
                tags={
                    "stage": stage,
                    "episode": episode,
                    "turn": turn,
                    "attempt": attempt,
                    "role": role or info.role,
                    **({"key": key} if key else {}),  # two calls of a stage in a turn told apart (mode=plant's items)
                },
            )
            log = CallLine(
                spec_id=spec_id,
                **({"trial": trial} if trial else {}),  # trial 0's line is the line of a run without trials
                turn=turn,
                stage=stage,
                role=role or info.role,
                model=binding.model,
                attempt=attempt,
                seed=seed,
                key=key,
            )
            try:
                completion = await binding.backend.generate(request)
            except ContextOverflow as exc:
                # Same inputs would overflow again: no retry.
                self._out_of_room(
                    log.model_copy(update={"finish_reason": "context_overflow"}), f"context_overflow: {exc}", effect
                )
            if self.pacer is not None:
                await self.pacer.pace()
            checked = time.perf_counter()
            if self.observe is not None:
                self.observe(
                    episode,
                    role or info.role,
                    f"{stage}/{key}",
                    completion.prompt_tokens,
                    completion.generated_tokens,
                    text_of(messages),
                    placed,
                )
            error = None
            out: Any = None
            reached: tuple[str, ...] = ()
            if completion.finish_reason == "error":
                # The engine could not run the request (a grammar that fails to
                # compile, a rejected request): its own words, not a parse error.
                error = f"engine error: {completion.error or 'no message'}"
            elif completion.finish_reason == "length":
                sent = completion.max_tokens_sent or binding.sampling.max_tokens
                if sent < binding.sampling.max_tokens:
                    # The window, not the stage's budget, cut the answer: the same inputs would be
                    # cut again, so the episode has run out of room (censored, not invalid).
                    self._out_of_room(
                        log.model_copy(
                            update={
                                "prompt_tokens": completion.prompt_tokens,
                                "generated_tokens": completion.generated_tokens,
                                "max_tokens_sent": sent,
                                "finish_reason": "length",
                            }
                        ),
                        f"context_overflow: the window left {sent} of "
                        f"max_tokens={binding.sampling.max_tokens} and the answer did not fit",
                        effect,
                    )
                error = f"cut off at max_tokens={sent}"
            else:
                try:
                    if raw and not grammar:
                        if not completion.text.strip():
                            raise InvalidOutput("empty answer")
                    else:
                        checked_out = parse(stage, completion.text, ids)
                        reached = check_bounds(stage, checked_out, binding.bounds)
                    out = completion.text if raw else checked_out
                except InvalidOutput as exc:
                    error = str(exc)
            overhead += time.perf_counter() - checked
            effect(
                "log",
                log.model_copy(
                    update={
                        "prompt_tokens": completion.prompt_tokens,
                        "cached_tokens": completion.cached_tokens,
                        "generated_tokens": completion.generated_tokens,
                        "max_tokens_sent": completion.max_tokens_sent,
                        "latency_s": round(completion.latency_s, 4),
                        "done_at": round(time.time(), 3),
                        "overhead_s": round(overhead, 6),
                        "finish_reason": completion.finish_reason,
                        "error": error,
                        "output": completion.text if error else None,
                        # Whether the engine had not seen this grammar before (it compiled it for this call).
                        **({} if completion.grammar_new is None else {"grammar_new": completion.grammar_new}),
                        **({"bound_hits": reached} if reached else {}),
                        # An endpoint's connection errors, timeouts, 429/5xx retried before this answer.
                        **(
                            {"transport_errors": tuple(completion.transport_errors)}
                            if completion.transport_errors
                            else {}
                        ),
                        # A thinking model's thought: kept whole here, only its size goes into the episode.
                        **(
                            {"thought_tokens": completion.thought_tokens, "thought": completion.thought}
                            if completion.thought is not None
                            else {}
                        ),
                    }
                ),
            )
            if error is None:
                if hits is not None:
                    hits.extend(reached)
                if thoughts is not None and completion.thought is not None:
                    thoughts.append(completion.thought_tokens)
                effect("ok", stage)
                return out
            last = error
            overhead = 0.0
        effect("failed", (stage, binding.model, episode, last))
        raise CallFailed(stage, turn, f"invalid after {self.attempts} attempts: {last}")

    def effect(self, kind: str, what: Any) -> None:
        """A call's side effect: a call log line, or an accepted or failed stage for the fail-fast watch."""
        if kind == "log":
            self.store.log_call(what)
        elif self.watch is None:
            return
        elif kind == "ok":
            self.watch.ok(what)
        else:
            self.watch.failed_call(*what)

    def _out_of_room(self, log: CallLine, reason: str, effect: Callable[[str, Any], None]) -> NoReturn:
        """The call cannot fit the window: logged, watched for a systematic cause, the episode censored."""
        effect("log", log.model_copy(update={"error": reason, "done_at": round(time.time(), 3)}))
        effect("failed", (log.stage, log.model, episode_name(log.spec_id, log.trial), reason))
        raise ContextLimit(log.stage, log.turn, reason)

    def ask_for(self, episode: str) -> Callable[[int], TurnAsk]:
        """turn -> the `Ask` of that turn of this episode (an episode name)."""
        return lambda turn: TurnAsk(self, episode, turn)


def with_engines(
    bound: Bindings, engines: Mapping[str, Engine], roles: Iterable[str], wrap: Callable[[Engine], Engine] | None = None
) -> dict[str, RoleBinding]:
    """Each role's binding with its started engine (`wrap`: e.g. a progress meter)."""
    out = {}
    for role in roles:
        b, engine = bound[role], engines[role]
        out[role] = RoleBinding(
            backend=wrap(engine) if wrap else engine,
            model=b.label,
            sampling=b.sampling,
            bounds=b.bounds,
            id_form=grammar.id_form(b.model.structured_outputs_backend),
        )
    return out
