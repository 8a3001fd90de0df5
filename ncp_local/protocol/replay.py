"""An episode's state turn by turn, rebuilt from its records through `ledger`.

Results store every turn's decisions (fact updates, node completed, the
statuses) but only the final state; replaying the decisions through the
same pure transitions the episode used gives the state before each turn,
which both the transcript pages and the re-audit need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import ledger, turns
from .episode import to_update
from .ledger import EpisodeState, Exchange, FactEntry, Status
from .records import ConflictRecord, EpisodeResult, TurnRecord
from .spec import Spec

# The ids of conflicts that name no fact or commitment are the stages' (PROTOCOL section 4); a record
# written before may say `player_input` for `input`: both are read as one (records.conflict_key).
INTERNAL_LABEL = "internal contradiction in the narration"


@dataclass(frozen=True)
class LedgerDiff:
    added: tuple[FactEntry, ...] = ()
    negated: tuple[FactEntry, ...] = ()  # as they were before (active)

    @property
    def empty(self) -> bool:
        return not self.added and not self.negated


def diff(before: tuple[FactEntry, ...], after: tuple[FactEntry, ...]) -> LedgerDiff:
    old = {f.id: f for f in before}
    added = tuple(f for f in after if f.id not in old)
    negated = tuple(old[f.id] for f in after if f.id in old and old[f.id].active and not f.active)
    return LedgerDiff(added, negated)


@dataclass(frozen=True)
class TurnView:
    record: TurnRecord
    before: EpisodeState  # committed state before the turn
    projected: tuple[FactEntry, ...]  # committed + pending: the ledger the audit saw
    pending: LedgerDiff  # the opening's updates, applied when turn 0 commits
    update: LedgerDiff  # this turn's own updates (candidates only, on a turn that did not commit)
    after: EpisodeState | None  # None: the turn did not commit (a conflict)

    @property
    def committed(self) -> bool:
        return self.after is not None


@dataclass(frozen=True)
class Replay:
    spec: Spec
    result: EpisodeResult
    opening_state: EpisodeState  # after the opening: its updates pending
    turns: tuple[TurnView, ...]
    final: EpisodeState
    problems: tuple[str, ...]  # where the records and the stored final state disagree


def _statuses(rec: TurnRecord, before: EpisodeState) -> tuple[tuple[str, Status], ...]:
    if rec.status_check is None:
        return before.statuses
    return tuple((e.id, "satisfied" if e.status == "SATISFIED" else "pending") for e in rec.status_check)


def replay(spec: Spec, result: EpisodeResult) -> Replay:
    problems: list[str] = []
    state = ledger.initial_state(spec).model_copy(
        update={"opening": result.opening, "pending": to_update(result.opening_update)}
    )
    opening_state = state
    node_index = {n.id: i for i, n in enumerate(spec.trajectory)}
    views = []
    for rec in result.turns:
        projected = ledger.projected_facts(state)
        pending = diff(state.facts, projected)
        update = to_update(rec.fact_update)
        candidate = diff(projected, ledger.apply_update(projected, update))
        if rec.conflicts:
            views.append(TurnView(rec, state, projected, pending, candidate, None))
            if rec is not result.turns[-1]:
                problems.append(f"{turns.label(rec.turn)}: a standing conflict that did not end the episode")
            break
        occurred = state.node_occurred
        if rec.node_completed is not None:
            if rec.node_completed in node_index:
                occurred = ledger.complete_node(occurred, node_index[rec.node_completed])
            else:
                problems.append(f"{turns.label(rec.turn)}: completed node {rec.node_completed} is not in the spec")
        after = ledger.commit_turn(
            state,
            update,
            occurred,
            _statuses(rec, state),
            Exchange(player_input=rec.player_input, response=rec.response),
        )
        views.append(TurnView(rec, state, projected, pending, candidate, after))
        state = after
    stored = result.final_state
    if (state.facts, state.node_occurred, state.statuses) != (stored.facts, stored.node_occurred, stored.statuses):
        problems.append("replayed final state differs from the stored one (spec changed since the run?)")
    return Replay(spec, result, opening_state, tuple(views), state, tuple(problems))


def target_text(spec: Spec | None, view: TurnView | None, rec: TurnRecord, conflict: ConflictRecord) -> str:
    """What a conflict cites, in words: the fact's text (as the audit saw the ledger), the commitment's
    description, the player input, or the internal-contradiction label. Without the spec (or its replay)
    only the targets that need none are resolved."""
    ctype, cid = conflict.key
    missing = "(spec not available)" if spec is None or view is None else None
    if conflict.internal:
        return INTERNAL_LABEL
    if ctype == "fact":
        facts = {f.id: f.text for f in view.projected} if view is not None else {}
        return missing or facts.get(cid, "(unknown fact)")
    if ctype == "commitment":
        commitments = {c.id: c.description for c in spec.commitments} if spec is not None else {}
        return missing or commitments.get(cid, "(unknown commitment)")
    return rec.player_input


def conflict_details(spec: Spec | None, view: TurnView | None, rec: TurnRecord | None = None) -> list[dict[str, Any]]:
    """Each standing conflict with its target's text and the reasons before and after the double-check.

    Without the spec (or its replay) only the targets that need none are
    resolved: the player input, and an internal contradiction.
    """
    rec = view.record if view is not None else rec
    if rec is None:
        raise ValueError("conflict_details: give a turn view or a turn record")
    first = {c.key: c.reason for c in rec.conflict_check.conflicts}
    review = rec.double_check
    modes = rec.failure_modes or ()  # in `conflicts`' order, when the run asked for them
    out = []
    for i, c in enumerate(rec.conflicts):
        ctype, cid = c.key
        out.append(
            {
                "type": ctype,
                "id": cid,
                "internal": c.internal,
                "target_text": target_text(spec, view, rec, c),
                "reason_initial": first.get((ctype, cid), "(not raised by the first check)"),
                "reason_reviewed": c.reason,
                "review_reason": review.review_reason if review else "",
                "confirmed": review.confirmed if review else None,
                "mode": modes[i].mode if i < len(modes) else None,
                "mode_reason": modes[i].reason if i < len(modes) else "",
            }
        )
    return out
