"""The stage registry: per stage, who answers it, its templates, its answer's shape and checks.

PROTOCOL section 4. `STAGES` holds one `Stage` per stage (its role, its
templates and their placeholders, its output model, its minimum output room);
prompts.py's template tables and the grammar are views of it, so adding a
stage is one entry here plus its template file in `prompts/`.

Each JSON schema is built per call by walking the stage's output model, whose
fields say which bound caps them and which ids of the call they may name
(`Bound`, `Names`, ...): whatever a grammar admits is valid in form wherever
JSON Schema can say it (conflict types and statuses are enums, `status_check`
has exactly one entry per commitment in spec order, strings and lists are
bounded, free text starts with a character the parser would not strip). Ids
are enums of the state under audit, or, as the engine layer chooses for a
backend that compiles slowly, patterns of their shapes (`IdForm`): the schema
is then the same on every call and the parser's existence check rejects an id
that does not exist. What a schema cannot say is checked after parsing; any
failure is an `InvalidOutput`, i.e. one failed attempt.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

Role = Literal["narrator", "player", "auditor", "builder"]
ConflictType = Literal["fact", "commitment", "player_input"]
CONFLICT_TYPES: tuple[str, ...] = get_args(ConflictType)
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
    negations: int | None = Field(None, ge=0)  # fact ids negated per update
    conflicts: int | None = Field(None, ge=1)  # conflicts per check
    subgoal_chars: int | None = Field(None, gt=0)
    summary_chars: int | None = Field(None, gt=0)
    build_chars: int | None = Field(None, gt=0)  # each text field of a built spec


UNBOUNDED = Bounds()
# The embedded 135M model's bounds: 150 words is about 900 characters, 50 about 300.
TIGHT = Bounds(
    text_chars=1000,
    player_chars=350,
    reason_chars=160,
    fact_chars=300,
    new_facts=8,
    negations=8,
    conflicts=6,
    subgoal_chars=200,
    summary_chars=600,
    build_chars=240,
)

# How a schema names the ids of the call (fact and commitment ids, `input`, `response_internal`):
# "enum" lists exactly those of the state under audit (the grammar admits only ids that exist,
# but nearly every call has a new schema); "pattern" gives their shapes (`f_[0-9]+`), so a stage's
# schema stays the same call after call and a backend that compiles slowly compiles it once.
# Either way the parser checks that a named id exists. The engine layer picks the form per backend.
IdForm = Literal["enum", "pattern"]
ID_FORMS: tuple[str, ...] = get_args(IdForm)

# What Python's str.strip() removes (every character with str.isspace()): the parser's notion of a
# blank reason or narration, so the grammar's "starts with a non-blank character" is the same set.
BLANK_CHARS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# JSON Schema `pattern` (a search): the first character is not blank. Written with \u escapes, which
# Python's re, xgrammar, llguidance and outlines all read.
_BLANK_CLASS = "\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
NON_BLANK_START = f"^[^{_BLANK_CLASS}]"
_QUOTES = "\"'`"  # what the player's clean-up strips besides blanks


class InvalidOutput(ValueError):
    """A model answer that fails its stage's contract; the call is retried."""


@dataclass(frozen=True)
class AuditIds:
    """The ids a stage's answer may name (projected active facts, commitments)."""

    fact_ids: tuple[str, ...] = ()
    commitment_ids: tuple[str, ...] = ()
    retrievable: tuple[int, ...] = ()  # HiAgent: indexes of compressed subgoals
    # fact_update: the ids this update's own additions would get, so that an
    # update may negate a fact it adds (PROTOCOL section 2: additions first).
    new_fact_ids: tuple[str, ...] = ()
    # failure_mode: the standing conflicts of the turn, as `conflict_name`s.
    conflict_keys: tuple[str, ...] = ()


def _negatable(ids: AuditIds) -> tuple[str, ...]:
    return (*ids.fact_ids, *ids.new_fact_ids)


def conflict_targets(ids: AuditIds) -> dict[str, tuple[str, ...]]:
    """What a conflict of each type may name: the grammar's branches and the check after parsing."""
    # An internal contradiction names no fact, so it is offered even with no active facts.
    return {
        "fact": (*ids.fact_ids, INTERNAL_ID),
        "commitment": ids.commitment_ids,
        "player_input": PLAYER_INPUT_ALIASES,
    }


# ---- what an output field says about its schema ---------------------------
# Markers in `Annotated[...]` on the output models' fields; the schema walker
# (`_object`), the bound checks (`_sizes`) and the item-count check read them.


@dataclass(frozen=True)
class Bound:
    """The `Bounds` field capping this string's length or this list's size (`None` there: uncapped)."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in Bounds.model_fields:  # a typo would silently leave a field uncapped
            raise ValueError(f"no such bound: {self.name!r}")


@dataclass(frozen=True)
class Names:
    """An id the answer names: the grammar offers only what `of` gives for the call."""

    of: Callable[[AuditIds], tuple[Any, ...]]


@dataclass(frozen=True)
class NamesPer:
    """An id whose kind depends on the sibling field `by` (a conflict's type): the object
    becomes one grammar branch per value of `by` that has anything to name."""

    by: str
    of: Callable[[AuditIds], Mapping[str, tuple[str, ...]]]


@dataclass(frozen=True)
class OnePerName:
    """A list with exactly one entry per id its items' `field` may name, in that order."""

    field: str


@dataclass(frozen=True)
class Size:
    """How many items a list must have (mode=build), said by the grammar and checked after parsing."""

    lo: int
    hi: int


@dataclass(frozen=True)
class FirstIs:
    """The list's first item has `field` fixed to `value`."""

    field: str
    value: str


# ---- output models --------------------------------------------------------

Reason = Annotated[str, Bound("reason_chars")]
BuildText = Annotated[str, Bound("build_chars")]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
        out = {t: sum(c.type == t for c in self.conflicts) for t in CONFLICT_TYPES}
        out["total"] = len(self.conflicts)
        return out


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


# ---- reading the markers --------------------------------------------------


def _asked(model: type[_Out]) -> dict[str, FieldInfo]:
    """The fields an answer is asked for, in order (excluded ones are only accepted)."""
    return {name: f for name, f in model.model_fields.items() if not f.exclude}


def _unwrap(tp: Any, meta: tuple[Any, ...] = ()) -> tuple[Any, tuple[Any, ...]]:
    """A type without its `Annotated` layers, and their markers."""
    while get_origin(tp) is Annotated:
        base, *more = get_args(tp)
        tp, meta = base, (*meta, *more)
    return tp, meta


_M = TypeVar("_M")
_E = TypeVar("_E", bound=_Out)


def _marker(meta: tuple[Any, ...], kind: type[_M]) -> _M | None:
    return next((m for m in meta if isinstance(m, kind)), None)


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _field(f: FieldInfo) -> tuple[Any, tuple[Any, ...]]:
    """A field's type and markers (pydantic keeps the outer `Annotated`'s apart, in `metadata`)."""
    return _unwrap(f.annotation, tuple(f.metadata))


# ---- the schema walker ----------------------------------------------------


def _str(max_len: int | None) -> dict[str, Any]:
    """Free text: never blank (its first character is not one str.strip() removes), capped by its bound."""
    s: dict[str, Any] = {"type": "string"}
    if max_len is not None:
        s["maxLength"] = max_len
    s["minLength"] = 1
    s["pattern"] = NON_BLANK_START
    return s


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@dataclass(frozen=True)
class _Call:
    """What one call's schema is built from: the ids it may name, the role's bounds, how ids are written."""

    ids: AuditIds
    bounds: Bounds
    form: IdForm = "enum"


def _object(model: type[_Out], c: _Call, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An output model's schema; `given` fixes some fields' schemas (a pinned id, a branch's type)."""
    given = given or {}
    fields = _asked(model)
    for name, f in fields.items():
        per = _marker(_field(f)[1], NamesPer)
        if per is not None and name not in given:
            return {"anyOf": _branches(model, name, per, c, given)}
    return _obj({name: given[name] if name in given else _schema(*_field(f), c) for name, f in fields.items()})


def _branches(model: type[_Out], name: str, per: NamesPer, c: _Call, given: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One object per value of `per.by`, naming only what that kind offers; a kind with nothing
    to name (no commitments) has no branch."""
    offered = per.of(c.ids)
    kinds = get_args(_asked(model)[per.by].annotation)
    return [
        _object(model, c, {**given, per.by: {"const": kind}, name: _names(str, offered[kind], c.form)})
        for kind in kinds
        if offered[kind]
    ]


def _schema(tp: Any, meta: tuple[Any, ...], c: _Call) -> dict[str, Any]:
    names = _marker(meta, Names)
    if names is not None:
        return _names(tp, names.of(c.ids), c.form)
    if tp is bool:
        return {"type": "boolean"}
    if get_origin(tp) is Literal:
        return {"enum": list(get_args(tp))}
    if tp is str:
        bound = _marker(meta, Bound)
        if bound is None:  # so that a role's bounds reach every free string
            raise TypeError("a free string needs a Bound")
        return _str(getattr(c.bounds, bound.name))
    if get_origin(tp) is tuple:
        return _array(get_args(tp)[0], meta, c)
    if isinstance(tp, type) and issubclass(tp, _Out):
        return _object(tp, c)
    raise TypeError(f"no schema for {tp!r}")


def id_pattern(ids: Iterable[str]) -> str:
    """The shapes of these ids as one anchored pattern: each run of digits stands for any number
    (`f_3`, `f_12` -> `f_[0-9]+`), every other character for itself. Plain ids (spec.ID_PATTERN)
    hold only letters, digits and `_.-`, so `.` and `-` are the only characters to quote."""
    shapes = sorted({re.sub(r"[0-9]+", "[0-9]+", re.sub(r"[.-]", lambda m: f"[{m.group()}]", i)) for i in ids})
    return f"^({'|'.join(shapes)})$"


def _names(tp: Any, offered: tuple[Any, ...], form: IdForm = "enum") -> dict[str, Any]:
    """An id of the call: an enum of what it may name, or (form "pattern", string ids) their shapes.
    An empty enum is no valid schema."""
    if form == "pattern" and offered and all(isinstance(o, str) for o in offered):
        named: dict[str, Any] = {"type": "string", "pattern": id_pattern(offered)}
    else:
        named = {"enum": list(offered)}
    if _is_optional(tp):
        return {"anyOf": [{"type": "null"}, named]} if offered else {"type": "null"}
    # Nothing to name: only the empty string (its list then takes no item).
    return named if offered else {"type": "string", "maxLength": 0}


def _array(item_tp: Any, meta: tuple[Any, ...], c: _Call) -> dict[str, Any]:
    per = _marker(meta, OnePerName)
    if per is not None:
        return _one_per_name(item_tp, per.field, c)
    item, item_meta = _unwrap(item_tp)
    a: dict[str, Any] = {"type": "array", "items": _schema(item, item_meta, c)}
    first, size = _marker(meta, FirstIs), _marker(meta, Size)
    if first is not None:
        a["prefixItems"] = [_object(item, c, {first.field: {"const": first.value}})]
    if size is not None:
        a["minItems"] = size.lo
    most = _most_items(meta, item_meta, c)
    if most is not None:
        a["maxItems"] = most
    return a


def _most_items(meta: tuple[Any, ...], item_meta: tuple[Any, ...], c: _Call) -> int | None:
    size, bound, names = _marker(meta, Size), _marker(meta, Bound), _marker(item_meta, Names)
    if size is not None:
        return size.hi
    capped = getattr(c.bounds, bound.name) if bound is not None else None
    if names is not None:
        offered = len(names.of(c.ids))
        if c.form == "enum" or not offered:  # each id at most once: no more items than ids
            return offered if capped is None else min(offered, capped)
        return capped  # the shapes say nothing of how many ids exist: only the role's bound
    if bound is not None:
        return capped
    raise TypeError("a list needs a Bound, a Size or named items")


def _one_per_name(item: type[_Out], field: str, c: _Call) -> dict[str, Any]:
    # One entry per commitment, each id a constant: the same schema for every call on a spec,
    # whatever the id form.
    marker = _marker(_field(_asked(item)[field])[1], Names)
    if marker is None:
        raise TypeError(f"{item.__name__}.{field}: one entry per name needs the names (Names)")
    entries = [_object(item, c, {field: {"const": n}}) for n in marker.of(c.ids)]
    n = len(entries)
    return {"type": "array", "prefixItems": entries, "items": False, "minItems": n, "maxItems": n}


def _sized(model: type[_Out]) -> Iterator[tuple[str, Size]]:
    """The model's lists with an item-count range (mode=build)."""
    for name, f in _asked(model).items():
        size = _marker(_field(f)[1], Size)
        if size is not None:
            yield name, size


def _bound_names(tp: Any, meta: tuple[Any, ...] = ()) -> Iterator[str]:
    """Every bound a value of this type can reach, outermost first."""
    tp, meta = _unwrap(tp, meta)
    yield from (m.name for m in meta if isinstance(m, Bound))
    if get_origin(tp) is tuple:
        yield from _bound_names(get_args(tp)[0])
    elif isinstance(tp, type) and issubclass(tp, _Out):
        for f in _asked(tp).values():
            yield from _bound_names(*_field(f))


# ---- the registry ---------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A prompt template (`<name>.txt` in a pack) and the placeholders it may use:
    exactly the keys its builder (prompts.py's `*_vars`, hiagent.py, build.py) provides."""

    name: str
    placeholders: frozenset[str]
    fallback: str | None = None  # a template a pack may leave this one out for


def _template(name: str, *placeholders: str, fallback: str | None = None) -> Template:
    return Template(name, frozenset(placeholders), fallback)


@dataclass(frozen=True)
class Stage:
    """One stage of the protocol: everything the rig needs to ask it and to check its answers."""

    name: str
    role: Role
    # The answer's shape; its schema, bounds and checks are read off its fields.
    # None: the player's plain text, one line under `plain_bound`.
    output: type[_Out] | None
    templates: tuple[Template, ...]  # the player: one per condition; HiAgent: its memory block too
    # The least output room in tokens a compliant answer needs; with less the call cannot
    # succeed whatever the model does, and the episode ends `context_limit`.
    min_room: int
    room_per_commitment: int = 0
    plain_bound: str | None = None
    method: str | None = None  # a narrator method's own stage: asked for by its class, not every run
    # An analysis stage a run asks only when turned on (audit.failure_modes): not in what every
    # run reads, so a pack without its template still loads and the run's identity is unchanged.
    optional: bool = False

    @property
    def json(self) -> bool:
        return self.output is not None

    @property
    def bound_names(self) -> tuple[str, ...]:
        """The `Bounds` fields that apply to this stage's answers."""
        if self.output is None:
            return (self.plain_bound,) if self.plain_bound else ()
        return tuple(dict.fromkeys(_bound_names(self.output)))

    @property
    def size(self) -> tuple[int, int] | None:
        """mode=build: how many items the answer's list may have."""
        sized = _sized(self.output) if self.output is not None else iter(())
        return next(((s.lo, s.hi) for _, s in sized), None)


# Placeholders shared by several templates (PROTOCOL section 3).
_NARRATOR = (
    "player_role",
    "current_node",
    "narrative_commitments",
    "commitment_definitions",
    "commitment_statuses",
    "pre_turn_facts",
    "facts",
)
_NARRATE = (*_NARRATOR, "pending_fact_updates", "system_response_history", "user_input")
_AUDIT_STORY = (
    "narrative_commitments",
    "commitment_definitions",
    "commitment_statuses",
    "trajectory_progress",
    "trajectory_nodes",
    "trajectory_flags",
)
_CONFLICT = (
    "player_role",
    "system_response_history",
    "user_input",
    "response_text",
    "candidate_fact_updates",
    "current_node",
    "pre_turn_facts",
    "facts",
    *_AUDIT_STORY,
)
_PLAYER = ("player_role", "history_text")
MIN_ROOM_PER_COMMITMENT = 24  # a status entry

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("opening", "narrator", Narration, (_template("opening", *_NARRATOR),), min_room=128),
        Stage("narrate", "narrator", Narration, (_template("narrate", *_NARRATE),), min_room=128),
        Stage(
            "player",
            "player",
            None,
            (_template("player_adversarial", *_PLAYER), _template("player_natural", *_PLAYER)),
            min_room=32,
            plain_bound="player_chars",
        ),
        Stage(
            "fact_update",
            "auditor",
            FactUpdateOut,
            (_template("fact_update", "player_role", "pre_turn_facts", "facts", "response_text"),),
            min_room=64,
        ),
        Stage("conflict_check", "auditor", ConflictCheckOut, (_template("conflict_check", *_CONFLICT),), min_room=32),
        Stage(
            "double_check",
            "auditor",
            DoubleCheckOut,
            (_template("double_check", *_CONFLICT, "initial_conflicts_json"),),
            min_room=48,
        ),
        Stage(
            "failure_mode",
            "auditor",
            FailureModesOut,
            (_template("failure_mode", *_CONFLICT, "standing_conflicts_json"),),
            min_room=48,
            optional=True,
        ),
        Stage(
            "trajectory_check",
            "auditor",
            TrajectoryOut,
            (_template("trajectory_check", "player_role", "history_text", "facts", "current_node"),),
            min_room=48,
        ),
        Stage(
            "status_check",
            "auditor",
            StatusOut,
            (_template("status_check", "player_role", "history_text", "facts", *_AUDIT_STORY),),
            min_room=32,
            room_per_commitment=MIN_ROOM_PER_COMMITMENT,
        ),
        # HiAgent's memory block is appended to its narrator prompt (PromptPack.render's `extra`);
        # a pack without `hiagent_narrate` lends it the baseline's narrator template.
        Stage(
            "hiagent_narrate",
            "narrator",
            HiAgentStep,
            (
                _template("hiagent_narrate", *_NARRATE, fallback="narrate"),
                _template("hiagent_memory", "player_role", "working_memory"),
            ),
            min_room=160,
            method="hiagent",
        ),
        Stage(
            "hiagent_summarize",
            "narrator",
            Summary,
            (_template("hiagent_summarize", "subgoal", "history_text"),),
            min_room=96,
            method="hiagent",
        ),
        Stage(
            "build_trajectory",
            "builder",
            BuiltTrajectory,
            (_template("build_trajectory", "player_role", "synopsis"),),
            min_room=256,
        ),
        Stage(
            "build_commitments",
            "builder",
            BuiltCommitments,
            (_template("build_commitments", "player_role", "synopsis", "reference_trajectory"),),
            min_room=256,
        ),
        Stage(
            "build_facts",
            "builder",
            BuiltFacts,
            (_template("build_facts", "player_role", "synopsis", "reference_trajectory", "commitments"),),
            min_room=256,
        ),
    )
}

# Views of the registry.
# mode=build: how many nodes / commitments / facts a built spec may have.
BUILD_SIZES: dict[str, tuple[int, int]] = {s.name: s.size for s in STAGES.values() if s.size is not None}
MIN_ROOM: dict[str, int] = {s.name: s.min_room for s in STAGES.values()}


def _stage(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}") from None


def method_templates(method: str) -> tuple[str, ...]:
    """The templates of a narrator method's own stages (what its class asks a pack for)."""
    return tuple(t.name for s in STAGES.values() if s.method == method for t in s.templates)


def min_room(stage: str, ids: AuditIds) -> int:
    """The least output room in tokens this call's compliant answer needs."""
    s = _stage(stage)
    return s.min_room + s.room_per_commitment * len(ids.commitment_ids)


def regex_for(stage: str, bounds: Bounds = UNBOUNDED) -> str | None:
    """Plain-text stages: under a bound, one line of bounded length, so a small model must stop.
    Its first character is neither blank nor a quote, which the player's clean-up would strip
    (clean_player_text); a label alone ("Action:") is still admitted and rejected after parsing:
    excluding it takes a branch per label prefix, each with its own length counter."""
    s = _stage(stage)
    limit = getattr(bounds, s.plain_bound) if s.plain_bound else None
    if s.output is not None or limit is None:
        return None
    return rf"[^\n{_BLANK_CLASS}{_QUOTES}][^\n]{{0,{limit - 1}}}"


def schema_for(
    stage: str, ids: AuditIds = AuditIds(), bounds: Bounds = UNBOUNDED, id_form: IdForm = "enum"
) -> dict[str, Any] | None:
    """The grammar for one call: only what is valid in form, within the role's bounds; ids as
    `id_form` says (an id that does not exist is then the parser's to reject)."""
    s = _stage(stage)
    return _object(s.output, _Call(ids, bounds, id_form)) if s.output is not None else None


# ---- parsing and checks ---------------------------------------------------

PLAYER_LABELS: tuple[str, ...] = ("action:", "player:", "player input:", "input:")


def clean_player_text(text: str) -> str:
    """The player's text as the narrator gets it: a leading label removed, quotes kept."""
    text = text.strip()
    lowered = text.lower()
    for label in PLAYER_LABELS:
        if lowered.startswith(label):
            return text[len(label) :].strip()
    return text


def parse(stage: str, text: str, ids: AuditIds = AuditIds()) -> Any:
    """Parse and check one answer; raises InvalidOutput with a short reason.

    The grammar (schema_for) is what a constrained engine can produce; this
    is what the rig accepts from any backend: as lenient as the reference where
    it is lenient (status case and order, counts left out) and as strict where
    it is strict (non-empty reasons, counts that match the list when given).
    """
    model = _stage(stage).output
    if model is None:
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
        out = model.model_validate(data)
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
        out = _check_conflicts(out, ids)
    # Said by the grammar too, but not every backend's grammar can carry it (engines/grammar.py).
    _check_sizes(stage, out)
    if isinstance(out, StatusOut):
        out = out.model_copy(
            update={"statuses": _one_each(out.statuses, "id", ids.commitment_ids, "statuses", "commitment")}
        )
    if isinstance(out, FailureModesOut):
        out = out.model_copy(update={"modes": _one_each(out.modes, "conflict", ids.conflict_keys, "modes", "conflict")})
    return out


def _one_each(entries: tuple[_E, ...], field: str, names: tuple[str, ...], listed: str, what: str) -> tuple[_E, ...]:
    """A `OnePerName` list: any order is accepted, each name exactly once; returned in `names`' order."""
    got = [getattr(e, field) for e in entries]
    if sorted(got) != sorted(names):
        raise InvalidOutput(f"{listed} must list each {what} once; got {got}")
    by_name = {getattr(e, field): e for e in entries}
    return tuple(by_name[n] for n in names)


def _check_conflicts(out: ConflictCheckOut, ids: AuditIds) -> ConflictCheckOut:
    conflicts = tuple(c.normalized() for c in out.conflicts)
    targets = conflict_targets(ids)
    for c in conflicts:
        if c.id not in targets[c.type]:
            raise InvalidOutput(f"{c.type} conflict names unknown id {c.id!r}")
    out = out.model_copy(update={"conflicts": conflicts})
    derived = out.counts()
    for key, kind in COUNT_KEYS.items():
        given = getattr(out, key)
        if given is not None and given != derived[kind]:
            raise InvalidOutput(f"{key}={given} does not match the {derived[kind]} listed")
    return out


def _check_sizes(stage: str, out: _Out) -> None:
    for name, size in _sized(type(out)):
        n = len(getattr(out, name))
        if not size.lo <= n <= size.hi:
            raise InvalidOutput(f"{stage}: {n} items, expected {size.lo} to {size.hi}")


def _sizes(stage: str, out: Any) -> list[tuple[str, int]]:
    """(bound name, size) for every bounded part of an answer, in field order."""
    if isinstance(out, str):
        bound = _stage(stage).plain_bound  # as `Stage.bound_names`: none set, nothing to check
        return [(bound, len(out))] if bound else []
    return list(_value_sizes(out, type(out)))


def _value_sizes(value: Any, tp: Any, meta: tuple[Any, ...] = ()) -> Iterator[tuple[str, int]]:
    tp, meta = _unwrap(tp, meta)
    bound = _marker(meta, Bound)
    if bound is not None:
        yield bound.name, len(value)
    if isinstance(value, tuple):
        for v in value:
            yield from _value_sizes(v, get_args(tp)[0])
    elif isinstance(value, _Out):
        for name, f in _asked(type(value)).items():
            yield from _value_sizes(getattr(value, name), *_field(f))


def check_bounds(stage: str, out: Any, b: Bounds) -> None:
    """An answer past its role's bounds is invalid, whichever backend produced it.

    A grammar that carries the bounds never produces one; a backend that could
    not carry them (outlines, see engines/grammar.py) or none (an OpenAI-compatible
    endpoint) is held to the same contract here.
    """
    limits = b.model_dump()
    for name, size in _sizes(stage, out):
        if limits[name] is not None and size > limits[name]:
            raise InvalidOutput(f"{stage}: {name} {size} is over its bound {limits[name]}")


def bound_hits(stage: str, out: Any, b: Bounds) -> tuple[str, ...]:
    """Which bounds this answer reached (so it may have been cut by the grammar).

    Reaching a bound is not a failure, but on a capable model it changes what
    was measured, so the call log and the turn record keep it.
    """
    limits = b.model_dump()
    reached = {name for name, size in _sizes(stage, out) if limits[name] is not None and size >= limits[name]}
    return tuple(f"{stage}:{name}" for name in limits if name in reached)
