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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Role = Literal["narrator", "player", "auditor", "builder"]
ConflictType = Literal["fact", "commitment", "player_input"]
CONFLICT_TYPES: tuple[str, ...] = ("fact", "commitment", "player_input")
# The reference's ids for conflicts that name no fact or commitment (PROTOCOL section 4).
PLAYER_INPUT_ID = "input"
PLAYER_INPUT_ALIASES: tuple[str, ...] = ("input", "player_input")  # a pack or old record may say either
INTERNAL_ID = "response_internal"  # a fact conflict inside the narration itself


class Bounds(BaseModel):
    """Output bounds of one role (PROTOCOL section 6), enforced by the grammar.

    They exist to stop a small model from looping inside a string until
    max_tokens; on a capable model a bound that binds changes the measurement
    (a narration cut mid-sentence, a 9th new fact dropped). So `None`
    (unbounded) is the default, the embedded model's role files set tight
    values, and every answer that reached a bound is recorded (`bound_hits`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    text_chars: int | None = Field(None, gt=0)  # a narration (opening, narrate, HiAgent)
    player_chars: int | None = Field(None, gt=0)  # the player's action
    reason_chars: int | None = Field(None, gt=0)  # every reason / review_reason
    fact_chars: int | None = Field(None, gt=0)  # one new fact
    new_facts: int | None = Field(None, ge=0)  # new facts per update (the opening's included)
    conflicts: int | None = Field(None, ge=1)  # conflicts per check
    subgoal_chars: int | None = Field(None, gt=0)
    summary_chars: int | None = Field(None, gt=0)
    build_chars: int | None = Field(None, gt=0)  # each text field of a built spec


UNBOUNDED = Bounds()
# The embedded 135M model's bounds: 150 words is about 900 characters, 50 about 300.
TIGHT = Bounds(text_chars=1000, player_chars=350, reason_chars=160, fact_chars=300, new_facts=8, conflicts=6,
               subgoal_chars=200, summary_chars=600, build_chars=240)
# A player answer never runs past one line (the rig's grammar for plain text).
PLAYER_LINE_CHARS = 2000


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
    # fact_update: the ids this update's own additions would get, so that an
    # update may negate a fact it adds (PROTOCOL section 2: additions first).
    new_fact_ids: tuple[str, ...] = ()


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _nonempty(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    return v


class Narration(_Out):
    text: str


class FactUpdateOut(_Out):
    add_facts: tuple[str, ...]
    negate_facts: tuple[str, ...]
    reason: str

    @field_validator("negate_facts")
    @classmethod
    def _strip_ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # Compared after stripping (PROTOCOL section 2); a repeated id negates once.
        return tuple(dict.fromkeys(i.strip() for i in v))

    _reason = field_validator("reason")(_nonempty)


class Conflict(_Out):
    type: ConflictType
    id: str
    reason: str

    @field_validator("id")
    @classmethod
    def _strip_id(cls, v: str) -> str:
        return v.strip()

    _reason = field_validator("reason")(_nonempty)

    def normalized(self) -> "Conflict":
        """The player-input id spelled as the reference spells it."""
        if self.type == "player_input" and self.id in PLAYER_INPUT_ALIASES:
            return self.model_copy(update={"id": PLAYER_INPUT_ID})
        return self


COUNT_KEYS = {"fact_conflict_count": "fact", "commitment_conflict_count": "commitment",
              "player_input_conflict_count": "player_input", "total_conflict_count": "total"}


class ConflictCheckOut(_Out):
    conflicts: tuple[Conflict, ...]
    # The reference asks for these counts and rejects an answer whose counts
    # do not match its list; the rig derives them (PROTOCOL section 8) but, when
    # a model volunteers them (no grammar, the official prompts), checks them too.
    fact_conflict_count: int | None = Field(None, exclude=True)
    commitment_conflict_count: int | None = Field(None, exclude=True)
    player_input_conflict_count: int | None = Field(None, exclude=True)
    total_conflict_count: int | None = Field(None, exclude=True)

    def counts(self) -> dict[str, int]:
        """Derived, never asked for (PROTOCOL section 8)."""
        out = {t: sum(c.type == t for c in self.conflicts) for t in CONFLICT_TYPES}
        out["total"] = len(self.conflicts)
        return out


class DoubleCheckOut(ConflictCheckOut):
    confirmed: bool
    review_reason: str

    _review = field_validator("review_reason")(_nonempty)

    def standing(self) -> tuple[Conflict, ...]:
        """`confirmed: false` clears every conflict; otherwise the reviewed list stands."""
        return self.conflicts if self.confirmed else ()


class Occurrence(_Out):
    occurred: bool
    reason: str

    _reason = field_validator("reason")(_nonempty)


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


def _str(max_len: int | None, min_len: int = 0) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    if max_len is not None:
        s["maxLength"] = max_len
    if min_len:
        s["minLength"] = min_len
    return s


def _array(items: dict[str, Any], max_items: int | None, **extra: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"type": "array", "items": items, **extra}
    if max_items is not None:
        a["maxItems"] = max_items
    return a


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _conflict_list(ids: AuditIds, b: Bounds) -> dict[str, Any]:
    branches = []
    targets: list[tuple[str, dict[str, Any]]] = [
        # An internal contradiction names no fact, so it is offered even with no active facts.
        ("fact", {"enum": [*ids.fact_ids, INTERNAL_ID]}),
        ("commitment", {"enum": list(ids.commitment_ids)} if ids.commitment_ids else {}),
        ("player_input", {"enum": list(PLAYER_INPUT_ALIASES)}),
    ]
    for ctype, id_schema in targets:
        if not id_schema:  # nothing of that kind exists to conflict with
            continue
        branches.append(_obj({"type": {"const": ctype}, "id": id_schema, "reason": _str(b.reason_chars, 1)}))
    return _array({"anyOf": branches}, b.conflicts)


# mode=build: how many nodes / commitments / facts a built spec may have.
BUILD_SIZES: dict[str, tuple[int, int]] = {"build_trajectory": (3, 15), "build_commitments": (2, 12),
                                           "build_facts": (3, 20)}


def regex_for(stage: str, bounds: Bounds = UNBOUNDED) -> str | None:
    """Plain-text stages: under a bound, one line of bounded length, so a small model must stop."""
    if stage == "player" and bounds.player_chars is not None:
        return rf"[^\n]{{1,{bounds.player_chars}}}"
    return None


def schema_for(stage: str, ids: AuditIds = AuditIds(), bounds: Bounds = UNBOUNDED) -> dict[str, Any] | None:
    """The grammar for one call: only what is valid, within the role's bounds."""
    b = bounds
    if stage in ("opening", "narrate"):
        return _obj({"text": _str(b.text_chars, 1)})
    if stage == "player":
        return None
    if stage == "fact_update":
        negatable = [*ids.fact_ids, *ids.new_fact_ids]
        negate = {"type": "array", "items": {"enum": negatable} if negatable else {"type": "string", "maxLength": 0},
                  "maxItems": len(negatable)}
        return _obj({
            "add_facts": _array(_str(b.fact_chars, 1), b.new_facts),
            "negate_facts": negate,
            "reason": _str(b.reason_chars, 1),
        })
    if stage == "conflict_check":
        return _obj({"conflicts": _conflict_list(ids, b)})
    if stage == "double_check":
        return _obj({"conflicts": _conflict_list(ids, b), "confirmed": {"type": "boolean"},
                     "review_reason": _str(b.reason_chars, 1)})
    if stage == "trajectory_check":
        occ = _obj({"occurred": {"type": "boolean"}, "reason": _str(b.reason_chars, 1)})
        return _obj({"trigger": occ, "delta": occ})
    if stage == "hiagent_narrate":
        # Retrieval is offered only while there are compressed subgoals to expand.
        retrieve: dict[str, Any] = {"anyOf": [{"type": "null"}, {"enum": list(ids.retrievable)}]} \
            if ids.retrievable else {"type": "null"}
        return _obj({"subgoal": _str(b.subgoal_chars, 1), "retrieve": retrieve,
                     "text": _str(b.text_chars, 1)})
    if stage == "hiagent_summarize":
        return _obj({"summary": _str(b.summary_chars, 1)})
    if stage == "build_trajectory":
        node = _obj({k: _str(b.build_chars, 1) for k in ("description", "trigger_event", "key_delta")})
        lo, hi = BUILD_SIZES[stage]
        return _obj({"trajectory": _array(node, hi, minItems=lo)})
    if stage == "build_commitments":
        texts = {k: _str(b.build_chars, 1) for k in ("description", "satisfaction_condition", "violation_condition")}
        c = _obj({"type": {"enum": ["invariant", "ordering", "achievement"]}, **texts})
        # "At least one achievement" is said by the grammar: the first entry must be one.
        first = _obj({"type": {"const": "achievement"}, **texts})
        lo, hi = BUILD_SIZES[stage]
        return _obj({"commitments": _array(c, hi, prefixItems=[first], minItems=lo)})
    if stage == "build_facts":
        lo, hi = BUILD_SIZES[stage]
        return _obj({"initial_facts": _array(_obj({"content": _str(b.fact_chars, 1)}), hi, minItems=lo)})
    if stage == "status_check":
        entries = [_obj({"id": {"const": cid}, "status": {"enum": ["SATISFIED", "PENDING"]},
                         "reason": _str(b.reason_chars, 1)}) for cid in ids.commitment_ids]
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

PLAYER_LABELS: tuple[str, ...] = ("action:", "player:", "player input:", "input:")


def clean_player_text(text: str) -> str:
    """The player's text as the narrator gets it: a leading label removed, quotes kept."""
    text = text.strip()
    lowered = text.lower()
    for label in PLAYER_LABELS:
        if lowered.startswith(label):
            return text[len(label):].strip()
    return text


def parse(stage: str, text: str, ids: AuditIds = AuditIds()) -> Any:
    """Parse and check one answer; raises InvalidOutput with a short reason.

    The grammar (schema_for) is what a constrained engine can produce; this
    is what the rig accepts from any backend: as lenient as the reference where
    it is lenient (status case and order, counts left out) and as strict where
    it is strict (non-empty reasons, counts that match the list when given).
    """
    if stage == "player":
        cleaned = clean_player_text(text)
        # An answer with nothing but a label or quotes is no action (PROTOCOL section 8).
        if not cleaned.strip(" \t\n\"'`"):
            raise InvalidOutput(f"empty player input after clean-up (got {text.strip()[:40]!r})")
        return cleaned
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidOutput(f"bad JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(data, dict):
        raise InvalidOutput(f"schema: expected a JSON object, got {type(data).__name__}")
    try:
        out = _MODELS[stage].model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "/".join(str(p) for p in err["loc"]) or "(root)"
        raise InvalidOutput(f"schema: {where}: {err['msg'][:200]}") from None
    return _semantic_check(stage, out, ids)


def _semantic_check(stage: str, out: Any, ids: AuditIds) -> Any:
    """What JSON alone cannot say; returns the answer normalized."""
    if isinstance(out, (Narration, HiAgentStep)) and not out.text.strip():
        raise InvalidOutput("empty narration")
    if isinstance(out, HiAgentStep):
        if not out.subgoal.strip():
            raise InvalidOutput("empty subgoal")
        if out.retrieve is not None and out.retrieve not in ids.retrievable:
            raise InvalidOutput(f"retrieve names no compressed subgoal: {out.retrieve}")
    if isinstance(out, Summary) and not out.summary.strip():
        raise InvalidOutput("empty summary")
    # fact_update: an unknown or inactive negation id is ignored, not invalid
    # (PROTOCOL section 2); the ledger skips ids it does not hold.
    if isinstance(out, ConflictCheckOut):
        conflicts = tuple(c.normalized() for c in out.conflicts)
        for c in conflicts:
            valid = {"fact": (*ids.fact_ids, INTERNAL_ID), "commitment": ids.commitment_ids,
                     "player_input": (PLAYER_INPUT_ID,)}[c.type]
            if c.id not in valid:
                raise InvalidOutput(f"{c.type} conflict names unknown id {c.id!r}")
        out = out.model_copy(update={"conflicts": conflicts})
        derived = out.counts()
        for key, kind in COUNT_KEYS.items():
            given = getattr(out, key)
            if given is not None and given != derived[kind]:
                raise InvalidOutput(f"{key}={given} does not match the {derived[kind]} listed")
    if isinstance(out, (BuiltTrajectory, BuiltCommitments, BuiltFacts)):
        # Said by the grammar too, but not every backend's grammar can carry it (llm/grammar.py).
        items = {BuiltTrajectory: "trajectory", BuiltCommitments: "commitments", BuiltFacts: "initial_facts"}
        n = len(getattr(out, items[type(out)]))
        lo, hi = BUILD_SIZES[stage]
        if not lo <= n <= hi:
            raise InvalidOutput(f"{stage}: {n} items, expected {lo} to {hi}")
    if isinstance(out, StatusOut):
        got = [e.id for e in out.statuses]
        # Any order is accepted; each commitment exactly once; kept in spec order.
        if sorted(got) != sorted(ids.commitment_ids):
            raise InvalidOutput(f"statuses must list each commitment once; got {got}")
        by_id = {e.id: e for e in out.statuses}
        out = out.model_copy(update={"statuses": tuple(by_id[c] for c in ids.commitment_ids)})
    return out


def _reasons(out: Any) -> list[str]:
    if isinstance(out, ConflictCheckOut):
        texts = [c.reason for c in out.conflicts]
        return texts + [out.review_reason] if isinstance(out, DoubleCheckOut) else texts
    if isinstance(out, FactUpdateOut):
        return [out.reason]
    if isinstance(out, TrajectoryOut):
        return [out.trigger.reason, out.delta.reason]
    if isinstance(out, StatusOut):
        return [e.reason for e in out.statuses]
    return []


def _sizes(out: Any) -> list[tuple[str, int]]:
    """(bound name, size) for every bounded part of an answer."""
    sizes: list[tuple[str, int]] = []
    if isinstance(out, str):
        sizes.append(("player_chars", len(out)))
    if isinstance(out, (Narration, HiAgentStep)):
        sizes.append(("text_chars", len(out.text)))
    if isinstance(out, HiAgentStep):
        sizes.append(("subgoal_chars", len(out.subgoal)))
    if isinstance(out, Summary):
        sizes.append(("summary_chars", len(out.summary)))
    if isinstance(out, FactUpdateOut):
        sizes.append(("new_facts", len(out.add_facts)))
        sizes += [("fact_chars", len(f)) for f in out.add_facts]
    if isinstance(out, ConflictCheckOut):
        sizes.append(("conflicts", len(out.conflicts)))
    if isinstance(out, BuiltFacts):
        sizes += [("fact_chars", len(f.content)) for f in out.initial_facts]
    if isinstance(out, (BuiltTrajectory, BuiltCommitments)):
        items = out.trajectory if isinstance(out, BuiltTrajectory) else out.commitments
        sizes += [("build_chars", len(v)) for it in items for v in it.model_dump().values() if isinstance(v, str)]
    sizes += [("reason_chars", len(r)) for r in _reasons(out)]
    return sizes


def check_bounds(stage: str, out: Any, b: Bounds) -> None:
    """An answer past its role's bounds is invalid, whichever backend produced it.

    A grammar that carries the bounds never produces one; a backend that could
    not carry them (outlines, see llm/grammar.py) or none (an OpenAI-compatible
    endpoint) is held to the same contract here.
    """
    limits = b.model_dump()
    for name, size in _sizes(out):
        if limits[name] is not None and size > limits[name]:
            raise InvalidOutput(f"{stage}: {name} {size} is over its bound {limits[name]}")


def bound_hits(stage: str, out: Any, b: Bounds) -> tuple[str, ...]:
    """Which bounds this answer reached (so it may have been cut by the grammar).

    Reaching a bound is not a failure, but on a capable model it changes what
    was measured, so the call log and the turn record keep it.
    """
    limits = b.model_dump()
    reached = {name for name, size in _sizes(out) if limits[name] is not None and size >= limits[name]}
    return tuple(f"{stage}:{name}" for name in limits if name in reached)
