"""The official NCP-Bench result format, both ways: a rig `EpisodeResult` (with its spec) as the
official code writes one episode (`<spec id>.json`), and such a file read back as an `EpisodeResult`.

The official format keeps what its metric functions read (termination, every turn's standing
conflict counts, the final trajectory flags and commitment statuses) and the story itself. It
keeps no call log, no output-bound hits, no opening fact update, no `max_turns` and no model
names: `MISSING_FROM_REFERENCE` says so in a report. A rig episode the official runner could never
write (`invalid`: that runner stops the whole run) is not exported; `context_limit` is kept under
its own name (the official metric functions count it at its committed turns, as the rig does).

The records below name the official fields as they are written (they are the format); reading goes
through them, so a file of another format fails on its first wrong field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .ledger import EpisodeState, Exchange, FactEntry, FactUpdate
from .records import (
    ConflictCheckRecord,
    ConflictCounts,
    ConflictRecord,
    DoubleCheckRecord,
    EpisodeResult,
    FactUpdateRecord,
    OccurrenceRecord,
    StatusRecord,
    TrajectoryRecord,
    TurnRecord,
)
from .spec import Spec
from .stages import ConflictType
from .turns import OPENING

# What a run read from official result files lacks, one line for the report's notes.
MISSING_FROM_REFERENCE = (
    "official result files: no call log (no cost or tokens), no output-bound hits, no opening fact update, "
    "no seals, no model names or max_turns unless a checkpoint file records them"
)
# Rig terminations the official runner never writes, so no official result file can hold them.
NOT_EXPORTED: frozenset[str] = frozenset({"invalid"})
# The official trajectory assessment has one reason for both parts of the check: each part's name,
# ": " and its reason (an empty one said as "missing"), the two joined by " | ".
_TRIGGER, _DELTA = "trigger: ", " | delta: "
# A count the official decision records per conflict type, and a commitment's status as it spells it.
Count = Annotated[int, Field(ge=0)]
OfficialStatus = Literal["pending", "satisfied"]


class _Official(BaseModel):
    # Unknown keys are kept out (a later official version may add some); missing or mistyped ones fail.
    model_config = ConfigDict(frozen=True, extra="ignore")


class OfficialEpisode(_Official):
    id: str
    player_role: str


class OfficialFactUpdate(_Official):
    add_facts: list[str]
    negate_fact_ids: list[str]
    reason: str | None = None


class OfficialConflict(_Official):
    kind: ConflictType
    target_id: str | None = None
    reason: str


class OfficialDecision(_Official):
    has_conflict: bool
    conflicts: list[OfficialConflict]
    double_checked: bool
    review_reason: str | None = None
    total_count: Count
    # One per conflict type (stages.CONFLICT_TYPES), as the official names spell them.
    fact_count: Count
    commitment_count: Count
    player_input_count: Count


class OfficialEvaluation(_Official):
    fact_update: OfficialFactUpdate
    conflict: OfficialDecision


class OfficialTrajectoryAssessment(_Official):
    target_node_id: str
    occurred: bool
    reason: str


class OfficialCommitmentAssessment(_Official):
    commitment_id: str
    status: OfficialStatus
    reason: str


class OfficialTurn(_Official):
    turn_id: int
    player_input: str
    narrator_response: str
    evaluation: OfficialEvaluation
    trajectory_assessments: list[OfficialTrajectoryAssessment]
    commitment_assessments: list[OfficialCommitmentAssessment]
    newly_occurred_node_ids: list[str]
    new_satisfaction_ids: list[str]


class OfficialFact(_Official):
    id: str
    text: str
    active: bool


class OfficialCommitment(_Official):
    id: str
    kind: str
    status: OfficialStatus
    description: str
    # What settles it either way (spec.Commitment's two conditions).
    satisfaction_condition: str
    violation_condition: str


class OfficialNode(_Official):
    id: str
    occurred: bool
    description: str
    # The event that leads to the node and the change that shows it happened (spec.Node's).
    trigger_event: str
    key_delta: str


class OfficialStoryTurn(_Official):
    turn_id: int
    player_input: str | None
    narrator_response: str | None


class OfficialState(_Official):
    facts: list[OfficialFact]
    commitments: list[OfficialCommitment]
    trajectory: list[OfficialNode]
    history: list[OfficialStoryTurn]


class OfficialResult(_Official):
    episode: OfficialEpisode
    termination: str
    turns: list[OfficialTurn]
    final_state: OfficialState


def validation_problem(exc: ValidationError) -> str:
    """The first wrong field of an official result, as `turns.3.evaluation: field required`."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{where}: {err['msg'].lower()}"


# ---- rig -> official -----------------------------------------------------------------------


def _decision(rec: TurnRecord) -> dict[str, object]:
    # The standing decision: after the double-check when there was one (what the official runner
    # records and its metric functions count).
    counts = ConflictCounts.of(rec.conflicts)
    review = (rec.double_check.review_reason if rec.double_check else "") or None
    return {
        "has_conflict": bool(rec.conflicts),
        "fact_count": counts.fact,
        "commitment_count": counts.commitment,
        "player_input_count": counts.player_input,
        "total_count": counts.total,
        "conflicts": [{"kind": c.type, "target_id": c.id, "reason": c.reason} for c in rec.conflicts],
        "double_checked": rec.double_check is not None,
        "review_reason": review,
    }


def _trajectory(rec: TurnRecord, spec: Spec, done_before: int) -> list[dict[str, object]]:
    check = rec.trajectory_check
    if check is None or done_before >= len(spec.trajectory):
        return []
    parts = {"trigger": check.trigger, "delta": check.delta}
    return [
        {
            # Nodes complete in order, one a turn at most: the node checked is the first pending one.
            "target_node_id": spec.trajectory[done_before].id,
            "occurred": check.completed,
            "reason": " | ".join(f"{name}: {part.reason or 'missing'}" for name, part in parts.items()),
        }
    ]


def _turn(rec: TurnRecord, spec: Spec, done_before: int) -> dict[str, object]:
    return {
        "turn_id": rec.turn,
        "player_input": rec.player_input,
        "narrator_response": rec.response,
        "evaluation": {
            "fact_update": {
                "add_facts": list(rec.fact_update.add_facts),
                "negate_fact_ids": list(rec.fact_update.negate_facts),
                "reason": rec.fact_update.reason or None,
            },
            "conflict": _decision(rec),
        },
        "trajectory_assessments": _trajectory(rec, spec, done_before),
        "commitment_assessments": [
            {"commitment_id": s.id, "status": s.status.lower(), "reason": s.reason} for s in rec.status_check or ()
        ],
        "newly_occurred_node_ids": [rec.node_completed] if rec.node_completed else [],
        "new_satisfaction_ids": list(rec.newly_satisfied),
    }


def to_reference(result: EpisodeResult, spec: Spec) -> dict[str, object]:
    """One finished rig episode as the official runner writes it (JSON-ready)."""
    if result.spec_id != spec.id:
        raise ValueError(f"result of {result.spec_id!r} given spec {spec.id!r}")
    state = result.final_state
    statuses = state.status_map
    turns = []
    done = 0
    for rec in result.turns:
        turns.append(_turn(rec, spec, done))
        done += rec.node_completed is not None
    history: list[dict[str, object]] = [{"turn_id": OPENING, "player_input": None, "narrator_response": result.opening}]
    history += [
        {"turn_id": i, "player_input": x.player_input, "narrator_response": x.response}
        for i, x in enumerate(state.exchanges)
    ]
    return {
        "episode": {"id": spec.id, "player_role": spec.meta.player_role},
        "termination": result.termination,
        "turns": turns,
        "final_state": {
            "facts": [{"id": f.id, "text": f.text, "active": f.active} for f in state.facts],
            "commitments": [
                {
                    "id": c.id,
                    "kind": c.type,
                    "description": c.description,
                    "satisfaction_condition": c.satisfaction_condition,
                    "violation_condition": c.violation_condition,
                    "status": statuses.get(c.id, "pending"),
                }
                for c in spec.commitments
            ],
            "trajectory": [
                {
                    "id": n.id,
                    "description": n.description,
                    "trigger_event": n.trigger_event,
                    "key_delta": n.key_delta,
                    "occurred": occurred,
                }
                for n, occurred in zip(spec.trajectory, state.node_occurred, strict=True)
            ],
            "history": history,
        },
    }


# ---- official -> rig -----------------------------------------------------------------------


def _split_reason(reason: str) -> tuple[str, str]:
    if reason.startswith(_TRIGGER) and _DELTA in reason:
        trigger, delta = reason[len(_TRIGGER) :].split(_DELTA, 1)
        return trigger, delta
    return reason, reason


def _turn_record(turn: OfficialTurn) -> TurnRecord:
    decision = turn.evaluation.conflict
    # The official file keeps the standing decision only; the first check's answer is not recorded.
    conflicts = tuple(
        ConflictRecord(type=c.kind, id=c.target_id or "", reason=c.reason)
        for c in decision.conflicts
        if decision.has_conflict
    )
    counts = ConflictCounts(
        fact=decision.fact_count,
        commitment=decision.commitment_count,
        player_input=decision.player_input_count,
        total=decision.total_count,
    )
    double = None
    if decision.double_checked:
        double = DoubleCheckRecord(
            conflicts=conflicts,
            confirmed=decision.has_conflict,
            review_reason=decision.review_reason or "",
            counts=counts,
        )
    trajectory = None
    if turn.trajectory_assessments:
        a = turn.trajectory_assessments[0]
        trigger, delta = _split_reason(a.reason)
        # Only the conjunction is recorded: a node not completed reads as neither part observed.
        trajectory = TrajectoryRecord(
            trigger=OccurrenceRecord(occurred=a.occurred, reason=trigger),
            delta=OccurrenceRecord(occurred=a.occurred, reason=delta),
        )
    fu = turn.evaluation.fact_update
    statuses = tuple(
        StatusRecord(id=s.commitment_id, status="SATISFIED" if s.status == "satisfied" else "PENDING", reason=s.reason)
        for s in turn.commitment_assessments
    )
    return TurnRecord(
        turn=turn.turn_id,
        player_input=turn.player_input,
        response=turn.narrator_response,
        fact_update=FactUpdateRecord(
            add_facts=tuple(fu.add_facts), negate_facts=tuple(fu.negate_fact_ids), reason=fu.reason or ""
        ),
        conflict_check=ConflictCheckRecord(conflicts=conflicts, counts=counts),
        double_check=double,
        conflicts=conflicts,
        trajectory_check=trajectory,
        node_completed=turn.newly_occurred_node_ids[0] if turn.newly_occurred_node_ids else None,
        status_check=statuses or None,
        newly_satisfied=tuple(turn.new_satisfaction_ids),
    )


TERMINATIONS_READ = ("conflict", "max_turns", "all_resolved", "context_limit")


def from_reference(data: OfficialResult, max_turns: int) -> EpisodeResult:
    """An official episode result as the rig's record (what the official format does not keep is
    left empty: no opening fact update, no bound hits, no first conflict check)."""
    if data.termination not in TERMINATIONS_READ:
        raise ValueError(f"termination: {data.termination!r} is not one of {', '.join(TERMINATIONS_READ)}")
    fs = data.final_state
    opening = next((h.narrator_response or "" for h in fs.history if h.turn_id == OPENING), "")
    exchanges = tuple(
        Exchange(player_input=h.player_input or "", response=h.narrator_response or "")
        for h in fs.history
        if h.turn_id != OPENING
    )
    state = EpisodeState(
        facts=tuple(FactEntry(id=f.id, text=f.text, active=f.active) for f in fs.facts),
        node_occurred=tuple(n.occurred for n in fs.trajectory),
        statuses=tuple((c.id, c.status) for c in fs.commitments),
        pending=FactUpdate(),
        opening=opening,
        exchanges=exchanges,
    )
    return EpisodeResult(
        spec_id=data.episode.id,
        termination=data.termination,  # checked against TERMINATIONS_READ above
        opening=opening,
        opening_update=None,
        turns=tuple(_turn_record(t) for t in data.turns),
        final_state=state,
        max_turns=max_turns,
    )
