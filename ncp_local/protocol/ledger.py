"""Episode state and its pure transitions (PROTOCOL section 2).

Every function here returns a new state; nothing is mutated, so a turn that
ends in a conflict simply never commits and the old state stands.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from .spec import Spec

Status = Literal["pending", "satisfied"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FactEntry(_Frozen):
    id: str
    text: str
    active: bool


class FactUpdate(_Frozen):
    add_facts: tuple[str, ...] = ()
    negate_facts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.add_facts and not self.negate_facts


class Exchange(_Frozen):
    player_input: str
    response: str


class EpisodeState(_Frozen):
    facts: tuple[FactEntry, ...]
    node_occurred: tuple[bool, ...]
    statuses: tuple[tuple[str, Status], ...]  # commitment id -> status, spec order
    pending: FactUpdate  # opening's updates, held until turn 0 commits
    opening: str = ""
    exchanges: tuple[Exchange, ...] = ()
    # The history's texts as prompts.py rendered them, kept so that a turn renders only what it adds. Not
    # part of the state: never serialized nor compared; model_copy carries it to the states made from this
    # one, and prompts.py checks it against their own history before it uses it.
    _rendered: Any = PrivateAttr(default=None)
    # The facts as the prompts show them (prompts.shown_facts), kept for the same reason: a turn's prompts
    # show the ledger up to five times, about 200 lines at turn 100. Checked against `facts` before use.
    _facts_text: Any = PrivateAttr(default=None)

    @property
    def status_map(self) -> dict[str, Status]:
        return dict(self.statuses)


def initial_state(spec: Spec) -> EpisodeState:
    return EpisodeState(
        facts=tuple(FactEntry(id=f.id, text=f.content, active=not f.negated) for f in spec.initial_facts),
        node_occurred=tuple(False for _ in spec.trajectory),
        statuses=tuple((c.id, "pending") for c in spec.commitments),
        pending=FactUpdate(),
    )


def active_facts(facts: tuple[FactEntry, ...]) -> tuple[FactEntry, ...]:
    """Inactive facts stay in the ledger but are never shown to a model."""
    return tuple(f for f in facts if f.active)


def _new_fact_id(n: int, taken: set[str]) -> str:
    # n counts inactive facts too, so ids never get reused after a negation. `taken`: the ids so far, made
    # once per update (the ledger holds about 200 facts at turn 100, and an audit asks 8 ids ahead).
    base = f"f_{n}"
    if base not in taken:
        return base
    k = 2
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def next_fact_ids(facts: tuple[FactEntry, ...], k: int) -> tuple[str, ...]:
    """The ids the next k additions would get, in order."""
    taken, out = {f.id for f in facts}, list[str]()
    for _ in range(k):
        out.append(_new_fact_id(len(facts) + len(out), taken))
        taken.add(out[-1])
    return tuple(out)


def apply_update(facts: tuple[FactEntry, ...], update: FactUpdate) -> tuple[FactEntry, ...]:
    """Additions first (blank ones skipped), so an update may negate a fact it adds; then
    negations, compared after stripping; an unknown or already inactive id is ignored."""
    out, taken = list(facts), {f.id for f in facts} if update.add_facts else set()
    for text in update.add_facts:
        text = text.strip()
        if text:
            out.append(FactEntry(id=_new_fact_id(len(out), taken), text=text, active=True))
            taken.add(out[-1].id)
    negate = {i.strip() for i in update.negate_facts}
    if not negate:
        return tuple(out)
    return tuple(f.model_copy(update={"active": False}) if f.id in negate else f for f in out)


def projected_facts(state: EpisodeState) -> tuple[FactEntry, ...]:
    """Committed ledger plus the pending (opening) updates."""
    return apply_update(state.facts, state.pending) if not state.pending.empty else state.facts


def first_pending_node(occurred: tuple[bool, ...]) -> int | None:
    return next((i for i, done in enumerate(occurred) if not done), None)


def current_node(occurred: tuple[bool, ...]) -> int:
    """The first node not yet occurred; the last one once all have."""
    i = first_pending_node(occurred)
    return len(occurred) - 1 if i is None else i


def complete_node(occurred: tuple[bool, ...], index: int) -> tuple[bool, ...]:
    return tuple(True if i == index else v for i, v in enumerate(occurred))


def with_exchange(state: EpisodeState, exchange: Exchange) -> EpisodeState:
    """The state with a turn's exchange added to its history and nothing else: the history the turn's later
    audits read and the next turn's player sees. The turn commits from it (`commit_exchanged`), so that
    the states after it extend one rendering of the history (prompts.rendered), not one each."""
    return state.model_copy(update={"exchanges": state.exchanges + (exchange,)})


def commit_turn(
    state: EpisodeState,
    update: FactUpdate,
    node_occurred: tuple[bool, ...],
    statuses: tuple[tuple[str, Status], ...],
    exchange: Exchange,
) -> EpisodeState:
    """Step 9: pending first, then this turn's updates; nodes; statuses; history."""
    return commit_exchanged(with_exchange(state, exchange), update, node_occurred, statuses)


def commit_exchanged(
    exchanged: EpisodeState,
    update: FactUpdate,
    node_occurred: tuple[bool, ...],
    statuses: tuple[tuple[str, Status], ...],
) -> EpisodeState:
    """`commit_turn` from the state `with_exchange` made: its history already holds the turn's exchange."""
    return with_checks(with_facts(exchanged, apply_update(projected_facts(exchanged), update)), node_occurred, statuses)


def with_facts(state: EpisodeState, facts: tuple[FactEntry, ...]) -> EpisodeState:
    """The state with `facts` as its ledger and nothing pending: what a turn's audits read (its facts
    projected) and, with the turn's update applied, its end-of-turn checks. The state itself when those are
    its own facts, so that what prompts.py keeps for a state's facts serves every stage of the turn."""
    if facts is state.facts and state.pending.empty:
        return state
    return state.model_copy(update={"facts": facts, "pending": FactUpdate()})


def with_checks(
    updated: EpisodeState, node_occurred: tuple[bool, ...], statuses: tuple[tuple[str, Status], ...]
) -> EpisodeState:
    """Step 9's rest, on the state `with_facts` gave the turn's updated ledger: its nodes and statuses."""
    return updated.model_copy(update={"node_occurred": node_occurred, "statuses": statuses})


def all_resolved(spec: Spec, statuses: tuple[tuple[str, Status], ...]) -> bool:
    """Every achievement satisfied, and there is at least one."""
    status = dict(statuses)
    achievements = [c.id for c in spec.commitments if c.type == "achievement"]
    return bool(achievements) and all(status.get(cid) == "satisfied" for cid in achievements)
