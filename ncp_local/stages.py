"""Per stage: who answers it, its template, its JSON schema, parsing and checks.

PROTOCOL section 4. Schemas are built per call from the state under audit so
that whatever a grammar admits is valid wherever JSON Schema can say it:
fact ids and commitment ids are enums, conflict types and statuses are
enums, `status_check` has exactly one entry per commitment in spec order,
strings and lists are bounded. What a schema cannot say is checked after
parsing; any failure is an `InvalidOutput`, i.e. one failed attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError

Role = Literal["narrator", "player", "auditor", "builder"]
ConflictType = Literal["fact", "commitment", "player_input"]
CONFLICT_TYPES: tuple[str, ...] = ("fact", "commitment", "player_input")
PLAYER_INPUT_ID = "player_input"

# Bounds keep a small model from looping inside a string until max_tokens.
NARRATION_MAX_CHARS = 1000  # 150 words is about 900 characters
PLAYER_MAX_CHARS = 350  # 50 words is about 300 characters
REASON_MAX_CHARS = 160
FACT_MAX_CHARS = 300
MAX_NEW_FACTS = 8
MAX_CONFLICTS = 6
SUBGOAL_MAX_CHARS = 200
SUMMARY_MAX_CHARS = 600
BUILD_MAX_CHARS = 240


class InvalidOutput(ValueError):
    """A model answer that fails its stage's contract; the call is retried."""


@dataclass(frozen=True)
class Stage:
    name: str
    role: Role
    json: bool  # False only for the player's plain text


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("opening", "narrator", True),
    Stage("narrate", "narrator", True),
    Stage("player", "player", False),
    Stage("fact_update", "auditor", True),
    Stage("conflict_check", "auditor", True),
    Stage("double_check", "auditor", True),
    Stage("trajectory_check", "auditor", True),
    Stage("status_check", "auditor", True),
    Stage("hiagent_narrate", "narrator", True),
    Stage("hiagent_summarize", "narrator", True),
    Stage("build_trajectory", "builder", True),
    Stage("build_commitments", "builder", True),
    Stage("build_facts", "builder", True),
)}


@dataclass(frozen=True)
class AuditIds:
    """The ids a stage's answer may name (projected active facts, commitments)."""

    fact_ids: tuple[str, ...] = ()
    commitment_ids: tuple[str, ...] = ()
    retrievable: tuple[int, ...] = ()  # HiAgent: indexes of compressed subgoals


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Narration(_Out):
    text: str


class FactUpdateOut(_Out):
    add_facts: tuple[str, ...]
    negate_facts: tuple[str, ...]
    reason: str


class Conflict(_Out):
    type: ConflictType
    id: str
    reason: str


class ConflictCheckOut(_Out):
    conflicts: tuple[Conflict, ...]

    def counts(self) -> dict[str, int]:
        """Derived, never asked for (PROTOCOL section 8)."""
        out = {t: sum(c.type == t for c in self.conflicts) for t in CONFLICT_TYPES}
        out["total"] = len(self.conflicts)
        return out


class DoubleCheckOut(ConflictCheckOut):
    confirmed: bool
    review_reason: str

    def standing(self) -> tuple[Conflict, ...]:
        """`confirmed: false` clears every conflict; otherwise the reviewed list stands."""
        return self.conflicts if self.confirmed else ()


class Occurrence(_Out):
    occurred: bool
    reason: str


class TrajectoryOut(_Out):
    trigger: Occurrence
    delta: Occurrence

    @property
    def completed(self) -> bool:
        return self.trigger.occurred and self.delta.occurred


class StatusEntry(_Out):
    id: str
    status: Literal["SATISFIED", "PENDING"]
    reason: str


class StatusOut(_Out):
    statuses: tuple[StatusEntry, ...]


class HiAgentStep(_Out):
    """HiAgent's answer: the subgoal it is pursuing, an optional memory
    retrieval, and the narration (its action)."""

    subgoal: str
    retrieve: int | None = None
    text: str


class Summary(_Out):
    summary: str


class BuiltNode(_Out):
    description: str
    trigger_event: str
    key_delta: str


class BuiltCommitment(_Out):
    type: Literal["invariant", "ordering", "achievement"]
    description: str
    satisfaction_condition: str
    violation_condition: str


class BuiltFact(_Out):
    content: str


class BuiltTrajectory(_Out):
    trajectory: tuple[BuiltNode, ...]


class BuiltCommitments(_Out):
    commitments: tuple[BuiltCommitment, ...]


class BuiltFacts(_Out):
    initial_facts: tuple[BuiltFact, ...]


def _str(max_len: int, min_len: int = 0) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string", "maxLength": max_len}
    if min_len:
        s["minLength"] = min_len
    return s


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _conflict_list(ids: AuditIds) -> dict[str, Any]:
    branches = []
    targets: list[tuple[str, dict[str, Any]]] = [
        ("fact", {"enum": list(ids.fact_ids)} if ids.fact_ids else {}),
        ("commitment", {"enum": list(ids.commitment_ids)} if ids.commitment_ids else {}),
        ("player_input", {"const": PLAYER_INPUT_ID}),
    ]
    for ctype, id_schema in targets:
        if not id_schema:  # nothing of that kind exists to conflict with
            continue
        branches.append(_obj({"type": {"const": ctype}, "id": id_schema, "reason": _str(REASON_MAX_CHARS)}))
    return {"type": "array", "items": {"anyOf": branches}, "maxItems": MAX_CONFLICTS}


def regex_for(stage: str) -> str | None:
    """Plain-text stages: one line of bounded length, so a small model must stop."""
    if stage == "player":
        return rf"[^\n]{{1,{PLAYER_MAX_CHARS}}}"
    return None


def schema_for(stage: str, ids: AuditIds = AuditIds()) -> dict[str, Any] | None:
    if stage in ("opening", "narrate"):
        return _obj({"text": _str(NARRATION_MAX_CHARS, 1)})
    if stage == "player":
        return None
    if stage == "fact_update":
        negate: dict[str, Any] = {"type": "array", "maxItems": len(ids.fact_ids)}
        negate["items"] = {"enum": list(ids.fact_ids)} if ids.fact_ids else {"type": "string"}
        return _obj({
            "add_facts": {"type": "array", "items": _str(FACT_MAX_CHARS, 1), "maxItems": MAX_NEW_FACTS},
            "negate_facts": negate,
            "reason": _str(REASON_MAX_CHARS),
        })
    if stage == "conflict_check":
        return _obj({"conflicts": _conflict_list(ids)})
    if stage == "double_check":
        return _obj({"conflicts": _conflict_list(ids), "confirmed": {"type": "boolean"},
                     "review_reason": _str(REASON_MAX_CHARS)})
    if stage == "trajectory_check":
        occ = _obj({"occurred": {"type": "boolean"}, "reason": _str(REASON_MAX_CHARS)})
        return _obj({"trigger": occ, "delta": occ})
    if stage == "hiagent_narrate":
        # Retrieval is offered only while there are compressed subgoals to expand.
        retrieve: dict[str, Any] = {"anyOf": [{"type": "null"}, {"enum": list(ids.retrievable)}]} \
            if ids.retrievable else {"type": "null"}
        return _obj({"subgoal": _str(SUBGOAL_MAX_CHARS, 1), "retrieve": retrieve,
                     "text": _str(NARRATION_MAX_CHARS, 1)})
    if stage == "hiagent_summarize":
        return _obj({"summary": _str(SUMMARY_MAX_CHARS, 1)})
    if stage == "build_trajectory":
        node = _obj({k: _str(BUILD_MAX_CHARS, 1) for k in ("description", "trigger_event", "key_delta")})
        return _obj({"trajectory": {"type": "array", "items": node, "minItems": 3, "maxItems": 15}})
    if stage == "build_commitments":
        texts = {k: _str(BUILD_MAX_CHARS, 1) for k in ("description", "satisfaction_condition", "violation_condition")}
        c = _obj({"type": {"enum": ["invariant", "ordering", "achievement"]}, **texts})
        # "At least one achievement" is said by the grammar: the first entry must be one.
        first = _obj({"type": {"const": "achievement"}, **texts})
        return _obj({"commitments": {"type": "array", "prefixItems": [first], "items": c,
                                     "minItems": 2, "maxItems": 12}})
    if stage == "build_facts":
        return _obj({"initial_facts": {"type": "array", "items": _obj({"content": _str(FACT_MAX_CHARS, 1)}),
                                       "minItems": 3, "maxItems": 20}})
    if stage == "status_check":
        entries = [_obj({"id": {"const": cid}, "status": {"enum": ["SATISFIED", "PENDING"]},
                         "reason": _str(REASON_MAX_CHARS)}) for cid in ids.commitment_ids]
        n = len(entries)
        return _obj({"statuses": {"type": "array", "prefixItems": entries, "items": False,
                                  "minItems": n, "maxItems": n}})
    raise KeyError(f"unknown stage {stage!r}")


_MODELS: dict[str, type[_Out]] = {
    "opening": Narration, "narrate": Narration, "fact_update": FactUpdateOut,
    "conflict_check": ConflictCheckOut, "double_check": DoubleCheckOut,
    "trajectory_check": TrajectoryOut, "status_check": StatusOut,
    "hiagent_narrate": HiAgentStep, "hiagent_summarize": Summary,
    "build_trajectory": BuiltTrajectory, "build_commitments": BuiltCommitments, "build_facts": BuiltFacts,
}


def parse(stage: str, text: str, ids: AuditIds = AuditIds()) -> Any:
    """Parse and check one answer; raises InvalidOutput with a short reason."""
    if stage == "player":
        text = text.strip()
        if not text:
            raise InvalidOutput("empty player input")
        return text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidOutput(f"bad JSON: {exc.msg} at char {exc.pos}") from None
    schema = schema_for(stage, ids)
    # Engines with grammars cannot break the schema, but the openai and
    # scripted backends can; one validator covers all of them.
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidOutput(f"schema: {where}: {exc.message[:200]}") from None
    try:
        out = _MODELS[stage].model_validate(data)
    except ValidationError as exc:
        raise InvalidOutput(f"schema: {exc.errors()[0]['msg']}") from None
    _semantic_check(stage, out, ids)
    return out


def _semantic_check(stage: str, out: Any, ids: AuditIds) -> None:
    if isinstance(out, (Narration, HiAgentStep)) and not out.text.strip():
        raise InvalidOutput("empty narration")
    if isinstance(out, HiAgentStep) and not out.subgoal.strip():
        raise InvalidOutput("empty subgoal")
    if isinstance(out, Summary) and not out.summary.strip():
        raise InvalidOutput("empty summary")
    if isinstance(out, FactUpdateOut):
        unknown = [i for i in out.negate_facts if i not in ids.fact_ids]
        if unknown:
            raise InvalidOutput(f"negates unknown fact ids {unknown}")
    if isinstance(out, ConflictCheckOut):
        for c in out.conflicts:
            valid = {"fact": ids.fact_ids, "commitment": ids.commitment_ids,
                     "player_input": (PLAYER_INPUT_ID,)}[c.type]
            if c.id not in valid:
                raise InvalidOutput(f"{c.type} conflict names unknown id {c.id!r}")
    if isinstance(out, StatusOut):
        got = [e.id for e in out.statuses]
        if got != list(ids.commitment_ids):
            raise InvalidOutput(f"statuses must list each commitment once in order; got {got}")
