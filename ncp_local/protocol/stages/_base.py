"""The vocabulary of the stages: roles, conflict types, ids, output bounds, and the markers an output
model's fields carry (`Bound`, `Names`, ...) with the functions that read them.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field
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


class _Out(BaseModel):
    """An answer: frozen, and no key it does not define."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---- reading the markers --------------------------------------------------


# The markers are read on every call (each schema built, each answer's bounds checked): a model's fields
# and a type's layers never change, so each is read once (functools.cache: classes and frozen markers hash).
@functools.cache
def _asked(model: type[_Out]) -> dict[str, FieldInfo]:
    """The fields an answer is asked for, in order (excluded ones are only accepted). Read only."""
    return {name: f for name, f in model.model_fields.items() if not f.exclude}


@functools.cache
def _fields(model: type[_Out]) -> tuple[tuple[str, Any, tuple[Any, ...]], ...]:
    """(name, type, markers) of each asked field, in order."""
    return tuple((name, *_field(f)) for name, f in _asked(model).items())


def _unwrap(tp: Any, meta: tuple[Any, ...] = ()) -> tuple[Any, tuple[Any, ...]]:
    """A type without its `Annotated` layers, and their markers."""
    try:
        return _unwrap_cached(tp, meta)
    except TypeError:  # an unhashable marker: read it every time
        return _unwrap_layers(tp, meta)


@functools.cache
def _unwrap_cached(tp: Any, meta: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    return _unwrap_layers(tp, meta)


def _unwrap_layers(tp: Any, meta: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    while get_origin(tp) is Annotated:
        base, *more = get_args(tp)
        tp, meta = base, (*meta, *more)
    return tp, meta


_M = TypeVar("_M")


def _marker(meta: tuple[Any, ...], kind: type[_M]) -> _M | None:
    return next((m for m in meta if isinstance(m, kind)), None)


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _field(f: FieldInfo) -> tuple[Any, tuple[Any, ...]]:
    """A field's type and markers (pydantic keeps the outer `Annotated`'s apart, in `metadata`)."""
    return _unwrap(f.annotation, tuple(f.metadata))


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
