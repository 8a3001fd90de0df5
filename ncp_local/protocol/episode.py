"""One episode: opening, turns, termination (PROTOCOL section 3).

Knows the protocol and nothing of engines. Every model call goes through an
`Ask` (the runner's: retries, seeds, call log); the state changes only
through `ledger`'s pure functions, and only when a turn commits.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import ledger
from .failures import CallFailed as CallFailed  # re-exported: the rig imports both from here
from .failures import ContextLimit as ContextLimit
from .ledger import EpisodeState, Exchange, FactUpdate, Status
from .narrators import Ask, Narrator
from .player import Player
from .prompts import (
    conflict_vars,
    fact_update_vars,
    rendered,
    status_vars,
    to_json,
    trajectory_vars,
)
from .records import (
    Checkpoint,
    ConflictCheckRecord,
    ConflictRecord,
    DoubleCheckRecord,
    EpisodeResult,
    FactUpdateRecord,
    ModeRecord,
    StatusRecord,
    Termination,
    TrajectoryRecord,
    TurnRecord,
)
from .spec import Spec
from .stages import (
    INTERNAL_ID,
    AuditIds,
    Conflict,
    ConflictCheckOut,
    DoubleCheckOut,
    FactUpdateOut,
    FailureModesOut,
    StatusOut,
    TrajectoryOut,
    conflict_name,
)
from .turns import OPENING

AskFactory = Callable[[int], Ask]  # turn id -> a call bound to that turn (turns.OPENING: the opening)
# Each commit hands the runner its new turn (the checkpoint's `turns`, after `turns_before` handed on at
# earlier commits): the runner keeps it (its turn log), the episode no longer does.
OnCommit = Callable[[Checkpoint], Awaitable[None]]


def fu_record(out: FactUpdateOut) -> FactUpdateRecord:
    # Negation ids arrive stripped and once each (stages.FactUpdateOut).
    return FactUpdateRecord(add_facts=out.add_facts, negate_facts=out.negate_facts, reason=out.reason)


def to_update(rec: FactUpdateRecord | None) -> FactUpdate:
    """The ledger update a recorded fact update makes (none recorded: no change)."""
    if rec is None:
        return FactUpdate()
    return FactUpdate(add_facts=rec.add_facts, negate_facts=rec.negate_facts)


def check_record(out: ConflictCheckOut) -> ConflictCheckRecord:
    """The first check's answer as recorded, with its derived counts (PROTOCOL section 8)."""
    return ConflictCheckRecord.model_validate({**out.model_dump(mode="json"), "counts": out.counts()})


def review_record(out: DoubleCheckOut) -> DoubleCheckRecord:
    """The double-check's answer as recorded, with its derived counts."""
    return DoubleCheckRecord.model_validate({**out.model_dump(mode="json"), "counts": out.counts()})


# The grammar offers a fact update the ids its own first additions would get,
# so that it can negate a fact it adds; an id beyond these is ignored anyway.
NEW_ID_LOOKAHEAD = 8


def audit_ids(spec: Spec, facts: tuple[ledger.FactEntry, ...]) -> AuditIds:
    """The ids an audit answer may name: the active facts and the spec's commitments."""
    return AuditIds(
        fact_ids=tuple(f.id for f in ledger.active_facts(facts)),
        commitment_ids=tuple(c.id for c in spec.commitments),
        new_fact_ids=ledger.next_fact_ids(facts, NEW_ID_LOOKAHEAD),
    )


def resolve_targets(
    spec: Spec,
    conflicts: Sequence[Conflict],
    projected: tuple[ledger.FactEntry, ...],
    player_input: str,
    response: str,
) -> list[dict[str, str]]:
    """Each conflict with its target's text (the double-check's and the failure-mode stage's input)."""
    facts = {f.id: f.text for f in projected}
    commitments = {c.id: c.description for c in spec.commitments}
    resolved = []
    for c in conflicts:
        if c.type == "fact":
            # An internal contradiction names the narration itself.
            target = response if c.id == INTERNAL_ID else facts.get(c.id, "")
        elif c.type == "commitment":
            target = commitments.get(c.id, "")
        else:
            target = player_input
        resolved.append({"type": c.type, "id": c.id, "target_text": target, "reason": c.reason})
    return resolved


@dataclass(frozen=True)
class Audit:
    """Steps 3-5 of a turn: the fact update, the conflict check and its double-check."""

    fact_update: FactUpdateRecord
    first: ConflictCheckOut
    reviewed: DoubleCheckOut | None
    modes: FailureModesOut | None = None  # audit.failure_modes, on a turn with standing conflicts

    @property
    def standing(self) -> tuple[Conflict, ...]:
        return tuple(self.reviewed.standing() if self.reviewed else self.first.conflicts)

    def record_fields(self) -> dict[str, Any]:
        """The audit's part of a turn record (TurnRecord, and the re-audit's TurnAudit)."""
        fields: dict[str, Any] = dict(
            fact_update=self.fact_update,
            conflict_check=check_record(self.first),
            double_check=review_record(self.reviewed) if self.reviewed else None,
            conflicts=tuple(ConflictRecord.model_validate(c.model_dump(mode="json")) for c in self.standing),
        )
        if self.modes is not None:
            by_key = {m.conflict: m for m in self.modes.modes}
            fields["failure_modes"] = tuple(
                ModeRecord.model_validate(by_key[conflict_name(c.type, c.id)].model_dump(mode="json"))
                for c in self.standing
            )
        return fields


async def audit_response(
    spec: Spec,
    state: EpisodeState,
    projected: tuple[ledger.FactEntry, ...],
    player_input: str,
    response: str,
    ask: Ask,
    failure_modes: bool = False,
) -> Audit:
    """PROTOCOL section 3, steps 3-5: `state` is the committed state before the turn, `projected` its
    facts with the pending updates applied. Shared by a run's turns and the re-audit. With
    `failure_modes`, a turn whose conflicts stand asks the auditor one more call: each one's mode."""
    ids = audit_ids(spec, projected)
    seen = ledger.with_facts(state, projected)
    fu = fu_record(await ask("fact_update", "fact_update", fact_update_vars(spec, seen, response), ids=ids))
    cvars = conflict_vars(spec, seen, player_input, response, to_update(fu))
    first: ConflictCheckOut = await ask("conflict_check", "conflict_check", cvars, ids=ids)
    reviewed: DoubleCheckOut | None = None
    if first.conflicts:
        targets = resolve_targets(spec, first.conflicts, projected, player_input, response)
        reviewed = await ask(
            "double_check", "double_check", {**cvars, "initial_conflicts_json": to_json(targets)}, ids=ids
        )
    audit = Audit(fu, first, reviewed)
    if failure_modes and audit.standing:
        try:
            audit = replace(audit, modes=await ask_modes(spec, audit.standing, cvars, projected, player_input, ask))
        except CallFailed:
            # An analysis of the ending, not part of it: the conflict stands and the episode ends as
            # it would have; its conflicts go unclassified (the call log keeps the failed answers).
            pass
    return audit


async def ask_modes(
    spec: Spec,
    standing: Sequence[Conflict],
    cvars: dict[str, str],
    projected: tuple[ledger.FactEntry, ...],
    player_input: str,
    ask: Ask,
) -> FailureModesOut:
    """The failure-mode stage: one mode per standing conflict (a repeated type and id is asked once)."""
    response = cvars["response_text"]
    listed: dict[str, dict[str, str]] = {}  # a repeated type and id is listed once, as first given
    for t in resolve_targets(spec, standing, projected, player_input, response):
        listed.setdefault(conflict_name(t["type"], t["id"]), {"target_text": t["target_text"], "reason": t["reason"]})
    ids = AuditIds(conflict_keys=tuple(listed))
    out: FailureModesOut = await ask(
        "failure_mode",
        "failure_mode",
        {**cvars, "standing_conflicts_json": to_json([{"conflict": k, **v} for k, v in listed.items()])},
        ids=ids,
    )
    return out


class Speculation:
    """The next turn's player call, started as soon as this turn's narration exists.

    The player sees only the visible history (PROTOCOL section 3), so its prompt for turn t+1 is known
    once turn t's narration is; asking it while the audits run takes one call off each surviving
    turn's chain. Its `Ask` is the one turn t+1 would have made (same turn, hence same seeds) and,
    when the runner's Ask can (`hold`/`settle`), keeps the call's log lines and fail-fast counts until
    the turn is decided: used, they happen in order as if asked after the audits; dropped (the
    turn ended the episode), the log lines are kept, marked speculative.
    """

    def __init__(self, turn: int, ask: Ask, visible: EpisodeState, task: asyncio.Task[str]) -> None:
        self.turn, self.ask, self.visible, self.task = turn, ask, visible, task

    async def _done(self) -> None:
        try:
            await asyncio.wait([self.task])  # never raises the call's own exception
        except BaseException:
            self.task.cancel()
            raise

    def _settle(self, used: bool) -> None:
        settle = getattr(self.ask, "settle", None)
        if settle is not None:
            settle(used)

    async def take(self) -> str:
        """The answer, as if asked now (a failed call raises as it would have)."""
        await self._done()
        # Read before settling: settling may stop the run (the call's failure, counted, is systematic), and
        # a failure never read is printed by asyncio as a traceback ("Task exception was never retrieved").
        self.task.exception()
        self._settle(True)
        return self.task.result()

    async def drop(self) -> None:
        """Not used: waits for it (its log lines are written whole) and keeps only an engine's failure."""
        await self._done()
        self._settle(False)
        exc = self.task.exception()
        if exc is not None and not isinstance(exc, CallFailed):
            raise exc


@dataclass(frozen=True)
class Ending:
    """How an episode ended: its result less the committed turns it handed on at their commits.

    At turn 100 an episode's turn records were most of what it held (about a MB with a real narrator's
    texts), and the runner keeps each one anyway, in its turn log, from the commit that hands it on. So the
    episode keeps none: `head` is the result whose `turns` are only those after the first `handed` (the
    turn a conflict ended it on, or turns of an older checkpoint not handed on yet), and whoever holds the
    handed ones makes the whole result (`result`). Nothing here waits for them, so how an episode ends
    never depends on when its runner gets them back.
    """

    head: EpisodeResult
    handed: int  # turns 0 to handed - 1, handed on at their commits

    @property
    def turns(self) -> int:
        """Turns the episode played (its result's turn records)."""
        return self.handed + len(self.head.turns)

    def result(self, handed: Sequence[TurnRecord]) -> EpisodeResult:
        """The whole result, given the turns handed on (turn 0 first)."""
        if [r.turn for r in handed] != list(range(self.handed)):
            raise ValueError(f"{self.head.episode}: expected turns 0 to {self.handed - 1}, got {len(handed)} turns")
        return self.head.model_copy(update={"turns": (*handed, *self.head.turns)}) if handed else self.head

    def result_json(self, handed: Sequence[bytes]) -> bytes:
        """`result(...).model_dump_json()`, given the handed turns' own `model_dump_json()` (turn 0 first):
        the head's JSON with them spliced in, no turn's objects made. A record's JSON is the same alone or
        nested, and `,"turns":[` is the head's own field, the first of its keys: JSON escapes every quote
        in a string, and no field before it holds a key of that name (tests/test_turn_log.py checks it)."""
        head = self.head.model_dump_json().encode()
        if not handed:
            return head
        at = head.index(b',"turns":[') + len(b',"turns":[')
        return head[:at] + b",".join(handed) + (b"," if self.head.turns else b"") + head[at:]


class Episode:
    def __init__(
        self,
        spec: Spec,
        narrator: Narrator,
        player: Player,
        ask_for: AskFactory,
        max_turns: int,
        on_commit: OnCommit,
        play_through: bool = False,
        speculative_player: bool = False,
        failure_modes: bool = False,
    ) -> None:
        self.spec = spec
        self.failure_modes = failure_modes  # audit.failure_modes: see audit_response
        # Ask the next turn's player while this turn's audits run (Speculation); the results are
        # the same either way, only the calls' order and timing differ.
        self.speculative_player = speculative_player
        self._next: Speculation | None = None
        # Benchmarks only (mode=bench): a standing conflict or all_resolved is
        # recorded but does not end the episode, and the turn commits as if no
        # conflict stood, so every episode plays max_turns and every way of
        # running the workload does the same calls. Never used for scores.
        self.play_through = play_through
        self.narrator = narrator
        self.player = player
        self.ask_for = ask_for
        self.max_turns = max_turns
        self.on_commit = on_commit
        self.commitment_ids = tuple(c.id for c in spec.commitments)

    async def run(self, checkpoint: Checkpoint | None = None) -> Ending:
        try:
            return await self._run(checkpoint)
        finally:
            # Only an exception that ends the run (a dead engine, a kill) leaves one pending.
            if self._next is not None:
                self._next.task.cancel()
                self._next = None
            self._close_narrator()

    def _close_narrator(self) -> None:
        """A narrator with a `close()` (an official method's `close_episode`) releases what it holds: the
        episode is over, or this process stops playing it (a resume makes a new narrator)."""
        close = getattr(self.narrator, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception as exc:  # releasing failed: the episode's result stands
            print(f"warning: {self.spec.id}: the narrator's close failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    async def _run(self, checkpoint: Checkpoint | None) -> Ending:
        if checkpoint is None:
            try:
                checkpoint = await self._open()
            except CallFailed as exc:
                await self._drop_next()
                state = ledger.initial_state(self.spec)
                empty = Checkpoint(spec_id=self.spec.id, state=state, opening_update=None, turns=(), narrator_state={})
                return self._ending(exc.termination, state, [], empty, reason=str(exc))
        else:
            self.narrator.restore(checkpoint.narrator_state)
        # `turns` are the records held, from turn `first` on: those before were handed on (a resumed
        # checkpoint's `turns_before`: its runner's turn log has them), and each commit hands on the rest.
        state, turns, first = checkpoint.state, list(checkpoint.turns), checkpoint.turns_before
        try:
            # A checkpoint is only written for a turn that committed, so the
            # episode may already be over by all_resolved (never by conflict).
            if checkpoint.committed and self._resolved(state):
                await self._drop_next()
                return self._ending("all_resolved", state, turns, checkpoint, first)
            for t in range(checkpoint.committed, self.max_turns):
                record, new_state = await self._turn(t, state)
                turns.append(record)
                if new_state is None:
                    await self._drop_next()
                    return self._ending("conflict", state, turns, checkpoint, first)
                state = new_state
                checkpoint = Checkpoint(
                    spec_id=self.spec.id,
                    state=state,
                    opening_update=checkpoint.opening_update,
                    turns=tuple(turns),
                    narrator_state=self.narrator.save(),
                    opening_bound_hits=checkpoint.opening_bound_hits,
                    opening_thought_tokens=checkpoint.opening_thought_tokens,
                    turns_before=first,
                )
                await self.on_commit(checkpoint)
                turns, first = [], t + 1  # handed on
                if self._resolved(state):
                    # Only known after the status check: the next turn's player was asked for nothing.
                    await self._drop_next()
                    return self._ending("all_resolved", state, turns, checkpoint, first)
        except CallFailed as exc:
            await self._drop_next()
            return self._ending(exc.termination, state, turns, checkpoint, first, str(exc))
        return self._ending("max_turns", state, turns, checkpoint, first)

    def _speculate(self, turn: int, visible: EpisodeState) -> None:
        """Start turn `turn`'s player on `visible` (the history once this turn's exchange is in),
        unless that turn cannot happen (max_turns)."""
        if not self.speculative_player or turn >= self.max_turns:
            return
        ask = self.ask_for(turn)
        hold = getattr(ask, "hold", None)
        if hold is not None:
            hold()
        self._next = Speculation(turn, ask, visible, asyncio.ensure_future(self.player.act(self.spec, visible, ask)))

    async def _drop_next(self) -> None:
        early, self._next = self._next, None
        if early is not None:
            await early.drop()

    async def _player(self, t: int, state: EpisodeState) -> tuple[Ask, str]:
        """Turn t's player input and the turn's Ask: the speculative answer when it was asked on what
        the player sees now (always, for the protocol's player), else asked now."""
        early, self._next = self._next, None
        if (
            early is not None
            and early.turn == t
            and self.player.sees(self.spec, early.visible) == self.player.sees(self.spec, state)
        ):
            return early.ask, await early.take()
        if early is not None:
            await early.drop()
        ask = self.ask_for(t)
        return ask, await self.player.act(self.spec, state, ask)

    def _resolved(self, state: EpisodeState) -> bool:
        return not self.play_through and ledger.all_resolved(self.spec, state.statuses)

    def _ending(
        self,
        how: Termination,
        state: EpisodeState,
        turns: list[TurnRecord],
        cp: Checkpoint,
        first: int = 0,
        reason: str = "",
    ) -> Ending:
        """`turns`: the records the episode holds, from turn `first` (those before were handed on)."""
        head = EpisodeResult(
            spec_id=self.spec.id,
            termination=how,
            reason=reason,
            opening=state.opening,
            opening_update=cp.opening_update,
            turns=tuple(turns),
            final_state=state,
            max_turns=self.max_turns,
            opening_bound_hits=cp.opening_bound_hits,
            opening_thought_tokens=cp.opening_thought_tokens,
        )
        return Ending(head, first)

    async def _open(self) -> Checkpoint:
        state = ledger.initial_state(self.spec)
        ask = self.ask_for(OPENING)
        text = await self.narrator.opening(self.spec, state, ask)
        self._speculate(0, state.model_copy(update={"opening": text}))
        fu: FactUpdateOut = await ask(
            "fact_update",
            "fact_update",
            fact_update_vars(self.spec, state, text),
            ids=audit_ids(self.spec, state.facts),
        )
        rec = fu_record(fu)
        # The opening's updates are held as pending until turn 0 commits.
        state = state.model_copy(update={"opening": text, "pending": to_update(rec)})
        cp = Checkpoint(
            spec_id=self.spec.id,
            state=state,
            opening_update=rec,
            turns=(),
            narrator_state=self.narrator.save(),
            opening_bound_hits=_hits(ask),
            opening_thought_tokens=_thought_tokens(ask),
        )
        await self.on_commit(cp)
        return cp

    async def _turn(self, t: int, state: EpisodeState) -> tuple[TurnRecord, EpisodeState | None]:
        """Steps 1-9; returns the record and the new state (None: conflict, nothing commits)."""
        ask, player_input = await self._player(t, state)
        response = await self.narrator.respond(self.spec, state, player_input, ask)
        # The history with this turn's exchange: the end-of-turn audits read it, the next player sees it, and
        # the turn commits from it (the states after it extend its one rendering of the history).
        exchanged = ledger.with_exchange(state, Exchange(player_input=player_input, response=response))
        self._speculate(t + 1, exchanged)

        projected = ledger.projected_facts(state)
        audit = await audit_response(self.spec, state, projected, player_input, response, ask, self.failure_modes)
        base = dict(turn=t, player_input=player_input, response=response, **audit.record_fields())
        if audit.standing and not self.play_through:
            return TurnRecord(**base, bound_hits=_hits(ask), thought_tokens=_thought_tokens(ask)), None

        update = to_update(audit.fact_update)

        # The ledger with this turn's update: what the end-of-turn checks read, and the turn commits.
        updated = ledger.with_facts(exchanged, ledger.apply_update(projected, update))
        history = rendered(exchanged, "history")
        occurred, node_done = state.node_occurred, None
        traj: TrajectoryRecord | None = None
        pending_node = ledger.first_pending_node(occurred)
        if pending_node is not None:  # at most one node per turn: the first pending one
            tc: TrajectoryOut = await ask(
                "trajectory_check", "trajectory_check", trajectory_vars(self.spec, pending_node, updated, history)
            )
            traj = TrajectoryRecord.model_validate(tc.model_dump(mode="json"))
            if tc.completed:
                occurred = ledger.complete_node(occurred, pending_node)
                node_done = self.spec.trajectory[pending_node].id

        statuses = state.statuses
        status_payload: tuple[StatusRecord, ...] | None = None
        if self.commitment_ids:
            sc: StatusOut = await ask(
                "status_check",
                "status_check",
                status_vars(self.spec, updated, occurred, history),
                ids=AuditIds(commitment_ids=self.commitment_ids),
            )
            # Overwritten each turn: a satisfied commitment can fall back to pending.
            statuses = tuple((e.id, _status(e.status)) for e in sc.statuses)
            status_payload = tuple(StatusRecord.model_validate(e.model_dump(mode="json")) for e in sc.statuses)
        before = state.status_map
        record = TurnRecord(
            **base,
            trajectory_check=traj,
            node_completed=node_done,
            status_check=status_payload,
            newly_satisfied=tuple(cid for cid, s in statuses if s == "satisfied" and before[cid] != "satisfied"),
            back_to_pending=tuple(cid for cid, s in statuses if s == "pending" and before[cid] == "satisfied"),
            bound_hits=_hits(ask),
            thought_tokens=_thought_tokens(ask),
        )
        return record, ledger.with_checks(updated, occurred, statuses)


def _hits(ask: Ask) -> tuple[str, ...]:
    """The bounds this turn's answers reached, as the runner's Ask collected them."""
    return tuple(getattr(ask, "hits", ()))


def _thought_tokens(ask: Ask) -> int:
    """Tokens this turn's accepted answers spent thinking, as the runner's Ask counted them."""
    return sum(getattr(ask, "thought_tokens", ()))


def _status(s: str) -> Status:
    return "satisfied" if s == "SATISFIED" else "pending"
