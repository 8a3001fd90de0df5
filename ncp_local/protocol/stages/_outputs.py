"""Each stage's answer as a pydantic model; its fields' markers say its schema, bounds and checks."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator

from ._base import (
    CONFLICT_TYPES,
    PLAYER_INPUT_ALIASES,
    PLAYER_INPUT_ID,
    Bound,
    ConflictType,
    FirstIs,
    Names,
    NamesPer,
    OnePerName,
    Size,
    _negatable,
    _Out,
    conflict_targets,
)

# ---- output models --------------------------------------------------------

Reason = Annotated[str, Bound("reason_chars")]
BuildText = Annotated[str, Bound("build_chars")]


def _nonempty(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    return v


class Narration(_Out):
    text: Annotated[str, Bound("text_chars")]


class FactUpdateOut(_Out):
    add_facts: Annotated[tuple[Annotated[str, Bound("fact_chars")], ...], Bound("new_facts")]
    negate_facts: Annotated[tuple[Annotated[str, Names(_negatable)], ...], Bound("negations")]
    reason: Reason

    @field_validator("negate_facts")
    @classmethod
    def _strip_ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # Compared after stripping (PROTOCOL section 2); a repeated id negates once.
        return tuple(dict.fromkeys(i.strip() for i in v))

    _reason = field_validator("reason")(_nonempty)


class Conflict(_Out):
    type: ConflictType
    id: Annotated[str, NamesPer("type", conflict_targets)]
    reason: Reason

    @field_validator("id")
    @classmethod
    def _strip_id(cls, v: str) -> str:
        return v.strip()

    _reason = field_validator("reason")(_nonempty)

    def normalized(self) -> Conflict:
        """The player-input id spelled as the reference spells it."""
        if self.type == "player_input" and self.id in PLAYER_INPUT_ALIASES:
            return self.model_copy(update={"id": PLAYER_INPUT_ID})
        return self


def count_conflicts(types: Iterable[str]) -> dict[str, int]:
    """A conflict list's counts per type and in all (PROTOCOL section 8: derived from the list, never asked
    for); an answer's and a recorded turn's alike."""
    listed = list(types)
    return {**{t: listed.count(t) for t in CONFLICT_TYPES}, "total": len(listed)}


COUNT_KEYS = {
    "fact_conflict_count": "fact",
    "commitment_conflict_count": "commitment",
    "player_input_conflict_count": "player_input",
    "total_conflict_count": "total",
}


class ConflictCheckOut(_Out):
    conflicts: Annotated[tuple[Conflict, ...], Bound("conflicts")]
    # The reference asks for these counts and rejects an answer whose counts
    # do not match its list; the rig derives them (PROTOCOL section 8) but, when
    # a model volunteers them (no grammar, the official prompts), checks them too.
    # Excluded fields are accepted, never asked for: the schema leaves them out.
    fact_conflict_count: int | None = Field(None, exclude=True)
    commitment_conflict_count: int | None = Field(None, exclude=True)
    player_input_conflict_count: int | None = Field(None, exclude=True)
    total_conflict_count: int | None = Field(None, exclude=True)

    def counts(self) -> dict[str, int]:
        """Derived, never asked for (PROTOCOL section 8)."""
        return count_conflicts(c.type for c in self.conflicts)


class DoubleCheckOut(ConflictCheckOut):
    confirmed: bool
    review_reason: Reason

    _review = field_validator("review_reason")(_nonempty)

    def standing(self) -> tuple[Conflict, ...]:
        """`confirmed: false` clears every conflict; otherwise the reviewed list stands."""
        return self.conflicts if self.confirmed else ()


class Occurrence(_Out):
    occurred: bool
    reason: Reason

    _reason = field_validator("reason")(_nonempty)


class TrajectoryOut(_Out):
    trigger: Occurrence
    delta: Occurrence

    @property
    def completed(self) -> bool:
        return self.trigger.occurred and self.delta.occurred


class StatusEntry(_Out):
    id: Annotated[str, Names(attrgetter("commitment_ids"))]
    status: Literal["SATISFIED", "PENDING"]
    reason: Reason

    @field_validator("id")
    @classmethod
    def _strip_id(cls, v: str) -> str:
        return v.strip()

    @field_validator("status", mode="before")
    @classmethod
    def _any_case(cls, v: Any) -> Any:
        # As lenient as the reference where no grammar ensures the spelling.
        return v.strip().upper() if isinstance(v, str) else v

    _reason = field_validator("reason")(_nonempty)


class StatusOut(_Out):
    statuses: Annotated[tuple[StatusEntry, ...], OnePerName("id")]


# audit.failure_modes: why a standing conflict happened. The paper sorts its conflicts into the four
# modes of its Figure 5, whose names the reference code does not publish; these four are the rig's
# own, each a distinct cause a reader can act on, and `other` takes what fits none (docs/guide/endings.md).
FailureMode = Literal["yielded_to_player", "lost_continuity", "broke_commitment", "ignored_input", "other"]
FAILURE_MODES: tuple[str, ...] = get_args(FailureMode)


def conflict_name(type_: str, id_: str) -> str:
    """How the failure-mode stage names a standing conflict: `fact:F3`, `commitment:c2`, `player_input:input`."""
    return f"{type_}:{id_}"


class ModeEntry(_Out):
    conflict: Annotated[str, Names(attrgetter("conflict_keys"))]
    mode: FailureMode
    reason: Reason

    @field_validator("conflict")
    @classmethod
    def _strip_key(cls, v: str) -> str:
        return v.strip()

    @field_validator("mode", mode="before")
    @classmethod
    def _any_case(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    _reason = field_validator("reason")(_nonempty)


class FailureModesOut(_Out):
    modes: Annotated[tuple[ModeEntry, ...], OnePerName("conflict")]


class HiAgentStep(_Out):
    """HiAgent's answer: the subgoal it is pursuing, an optional memory
    retrieval, and the narration (its action)."""

    subgoal: Annotated[str, Bound("subgoal_chars")]
    # Retrieval is offered only while there are compressed subgoals to expand.
    retrieve: Annotated[int | None, Names(attrgetter("retrievable"))] = None
    text: Annotated[str, Bound("text_chars")]


class Summary(_Out):
    summary: Annotated[str, Bound("summary_chars")]


class PlantRewrite(_Out):
    """mode=plant's planting model: the narration rewritten with one contradiction, and the words of it that
    carry the contradiction (a sentence or a clause, as they stand in the text)."""

    text: Annotated[str, Bound("text_chars")]
    planted: Annotated[str, Bound("text_chars")]


class BuiltNode(_Out):
    description: BuildText
    trigger_event: BuildText
    key_delta: BuildText


class BuiltCommitment(_Out):
    type: Literal["invariant", "ordering", "achievement"]
    description: BuildText
    satisfaction_condition: BuildText
    violation_condition: BuildText


class BuiltFact(_Out):
    content: Annotated[str, Bound("fact_chars")]


class BuiltTrajectory(_Out):
    trajectory: Annotated[tuple[BuiltNode, ...], Size(3, 15)]


class BuiltCommitments(_Out):
    # "At least one achievement" is said by the grammar: the first entry must be one.
    commitments: Annotated[tuple[BuiltCommitment, ...], Size(2, 12), FirstIs("type", "achievement")]


class BuiltFacts(_Out):
    initial_facts: Annotated[tuple[BuiltFact, ...], Size(3, 20)]
