"""What an episode leaves behind: its turn records, its result and its checkpoint, and inside each turn
record the answer every audit stage gave (PROTOCOL section 3, steps 3-7).

These are the sealed records of a run directory (rundir/store.py) and what every reader takes: the
metrics, the replay of a turn's state, the reports, the official format's converter, the Inspect
export. Each stage's answer is a model here, not a dict, so a reader names its fields (`c.type`,
`rec.conflict_check.conflicts`) and a misspelt one fails in mypy, not silently as an empty `.get`.

They mirror the stages' answer models (stages/_outputs.py) on purpose rather than reuse them: an
answer model checks what only the turn knows (the ids it may name, non-empty reasons, the run's bounds,
the player-input alias), which a reader of a stored file can neither re-check nor should (a record
written under other bounds is still a record). A record keeps the answer as it was accepted.

Field order is serialization order, and results are compared byte for byte across rig versions: each
answer record lists its fields in the order the stage's answer model (stages/_outputs.py) dumps them,
then what the rig derives (`counts`). A file's format version (rundir/formats.py) changes when a
shape here does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from .ledger import EpisodeState
from .stages import INTERNAL_ID, PLAYER_INPUT_ID, ConflictType, FailureMode, count_conflicts
from .trials import episode_name

# `context_limit`: the episode could not go on because a call no longer fits the
# model's window; it is censored at its last committed turn (PROTOCOL section 5
# counts survival to the end of the story; such an episode did not fail, it ran
# out of room), never dropped as `invalid`.
Termination = Literal["conflict", "max_turns", "all_resolved", "invalid", "context_limit"]


def conflict_key(ctype: str, cid: str) -> tuple[str, str]:
    """(type, id) with the player-input aliases made one: matches a first-check conflict to its review,
    and a labelled conflict to the one a run recorded."""
    return (ctype, PLAYER_INPUT_ID) if ctype == "player_input" else (ctype, cid)


class _Answer(BaseModel):
    """One stage's recorded answer (or a part of it): read back exactly as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ConflictRecord(_Answer):
    """A conflict as the auditor named it (the player-input id as the reference spells it)."""

    type: ConflictType
    id: str
    reason: str

    @property
    def key(self) -> tuple[str, str]:
        return conflict_key(self.type, self.id)

    @property
    def internal(self) -> bool:
        """A contradiction inside the narration itself (a fact conflict naming no ledger fact)."""
        return self.type == "fact" and self.id == INTERNAL_ID


class ConflictCounts(_Answer):
    """Derived from the list, never asked for (PROTOCOL section 8)."""

    fact: int
    commitment: int
    player_input: int
    total: int

    @classmethod
    def of(cls, conflicts: tuple[ConflictRecord, ...]) -> ConflictCounts:
        return cls(**count_conflicts(c.type for c in conflicts))


class ConflictCheckRecord(_Answer):
    """Step 4: the first conflict check."""

    conflicts: tuple[ConflictRecord, ...]
    counts: ConflictCounts


class DoubleCheckRecord(_Answer):
    """Step 5: the reviewed decision on the first check's conflicts (asked only when there were some)."""

    conflicts: tuple[ConflictRecord, ...]
    confirmed: bool
    review_reason: str
    counts: ConflictCounts


class OccurrenceRecord(_Answer):
    occurred: bool
    reason: str


class TrajectoryRecord(_Answer):
    """Step 6: whether the first pending plot node's trigger and key change both happened."""

    trigger: OccurrenceRecord
    delta: OccurrenceRecord

    @property
    def completed(self) -> bool:
        return self.trigger.occurred and self.delta.occurred


class StatusRecord(_Answer):
    """Step 7: one commitment's status after the turn."""

    id: str
    status: Literal["SATISFIED", "PENDING"]
    reason: str


class ModeRecord(_Answer):
    """audit.failure_modes: why one standing conflict happened (`conflict` as `type:id`)."""

    conflict: str
    mode: FailureMode
    reason: str


# Counts added after runs were first written: left out of a record while zero, so a record of a
# model that does not think serializes (and seals) byte for byte as before.
# `trial` likewise: trial 0 of a story is the episode a run without trials plays (protocol/trials.py).
_OMITTED_WHEN_ZERO = ("thought_tokens", "opening_thought_tokens", "trial", "turns_before")
# Likewise a stage a run asks only when turned on (audit.failure_modes): absent, not null, when off.
_OMITTED_WHEN_NONE = ("failure_modes",)


class Record(BaseModel):
    """A sealed record's base (results, checkpoints, re-audits): frozen, no key it does not define, and the
    fields added after runs were first written left out at their neutral value (above)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_serializer(mode="wrap")
    def _omit_zero_counts(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in _OMITTED_WHEN_ZERO:
                if data.get(name) == 0:
                    del data[name]
            for name in _OMITTED_WHEN_NONE:
                if name in data and data[name] is None:
                    del data[name]
        return data


class FactUpdateRecord(Record):
    add_facts: tuple[str, ...]
    negate_facts: tuple[str, ...]
    reason: str


class TurnRecord(Record):
    turn: int
    player_input: str
    response: str
    fact_update: FactUpdateRecord
    conflict_check: ConflictCheckRecord
    double_check: DoubleCheckRecord | None  # when the first check found conflicts
    conflicts: tuple[ConflictRecord, ...]  # what stands after the double-check
    # audit.failure_modes: each standing conflict's mode, in `conflicts`' order.
    failure_modes: tuple[ModeRecord, ...] | None = None
    trajectory_check: TrajectoryRecord | None = None
    node_completed: str | None = None
    status_check: tuple[StatusRecord, ...] | None = None
    newly_satisfied: tuple[str, ...] = ()
    back_to_pending: tuple[str, ...] = ()
    # Answers of this turn that reached an output bound ("stage:bound"); empty
    # on a compliant model under loose bounds (PROTOCOL section 6).
    bound_hits: tuple[str, ...] = ()
    # Tokens this turn's accepted answers spent thinking (thinking models; the thoughts themselves
    # stay in the call log). They were generated, never carried into a later prompt.
    thought_tokens: int = 0


class EpisodeResult(Record):
    spec_id: str
    termination: Termination
    reason: str = ""
    opening: str
    opening_update: FactUpdateRecord | None
    turns: tuple[TurnRecord, ...]
    final_state: EpisodeState
    max_turns: int
    opening_bound_hits: tuple[str, ...] = ()
    opening_thought_tokens: int = 0
    trial: int = Field(0, ge=0)  # which play of the story this is (protocol/trials.py)

    @property
    def episode(self) -> str:
        return episode_name(self.spec_id, self.trial)


class Checkpoint(Record):
    """Everything needed to continue after the last committed turn (with `turns_before`, together with the
    turn log that holds those turns)."""

    spec_id: str
    state: EpisodeState
    opening_update: FactUpdateRecord | None
    turns: tuple[TurnRecord, ...]
    narrator_state: dict[str, Any]
    opening_bound_hits: tuple[str, ...] = ()
    opening_thought_tokens: int = 0
    trial: int = Field(0, ge=0)
    # Committed turns before `turns[0]` that the episode no longer holds (its runner's turn log has them):
    # on the checkpoint a running episode hands its runner and on the one a turn log resumes it from,
    # never on one written whole.
    turns_before: int = Field(0, ge=0)

    @property
    def episode(self) -> str:
        return episode_name(self.spec_id, self.trial)

    @property
    def committed(self) -> int:
        """Turns committed so far."""
        return self.turns_before + len(self.turns)
