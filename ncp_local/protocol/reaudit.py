"""The re-audit's records: a recorded turn judged again by another auditor (PROTOCOL section 3,
steps 3-5, on the state the turn was told in), and an episode's judged turns."""

from __future__ import annotations

from pydantic import Field

from .episode import CallFailed, audit_response
from .narrators import Ask
from .records import ConflictCheckRecord, ConflictRecord, DoubleCheckRecord, FactUpdateRecord, ModeRecord, Record
from .replay import TurnView
from .spec import Spec
from .trials import episode_name


class TurnAudit(Record):
    turn: int
    fact_update: FactUpdateRecord | None = None
    conflict_check: ConflictCheckRecord | None = None
    double_check: DoubleCheckRecord | None = None
    conflicts: tuple[ConflictRecord, ...] = ()  # what stands after the double-check
    failure_modes: tuple[ModeRecord, ...] | None = None  # audit.failure_modes: each standing one's mode
    error: str = ""  # a call stayed invalid: the turn is left out of the agreement

    @property
    def judged(self) -> bool:
        return not self.error


class ReauditResult(Record):
    spec_id: str
    source_termination: str
    turns: tuple[TurnAudit, ...]
    trial: int = Field(0, ge=0)  # the judged episode's trial (protocol/trials.py); left out while 0

    @property
    def episode(self) -> str:
        return episode_name(self.spec_id, self.trial)


async def audit_turn(spec: Spec, view: TurnView, ask: Ask, failure_modes: bool = False) -> TurnAudit:
    """PROTOCOL section 3, steps 3-5, on a recorded turn and the state before it (and, with
    `failure_modes`, the modes of the conflicts this auditor finds standing)."""
    rec = view.record
    try:
        audit = await audit_response(
            spec, view.before, view.projected, rec.player_input, rec.response, ask, failure_modes
        )
    except CallFailed as exc:
        return TurnAudit(turn=rec.turn, error=str(exc))
    return TurnAudit(turn=rec.turn, **audit.record_fields())
