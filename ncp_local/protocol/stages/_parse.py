"""Parsing and checks: what the rig accepts from any backend, and the bounds an answer reached."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any, TypeVar, get_args, get_origin

from pydantic import ValidationError

from ._base import (
    AuditIds,
    Bound,
    Bounds,
    InvalidOutput,
    _fields,
    _marker,
    _Out,
    _sized,
    _unwrap,
    conflict_targets,
)
from ._outputs import COUNT_KEYS, ConflictCheckOut, FailureModesOut, HiAgentStep, Narration, StatusOut, Summary
from ._registry import _stage

# ---- parsing and checks ---------------------------------------------------

_E = TypeVar("_E", bound=_Out)

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
    bound, item = _sizing(tp, meta)
    if bound is not None:
        yield bound, len(value)
    if isinstance(value, tuple):
        for v in value:
            yield from _value_sizes(v, item)
    elif isinstance(value, _Out):
        for name, ftp, fmeta in _fields(type(value)):
            yield from _value_sizes(getattr(value, name), ftp, fmeta)


def _sizing(tp: Any, meta: tuple[Any, ...]) -> tuple[str | None, Any]:
    """(the bound a value of this type reaches, its items' type): read once per type, not per answer."""
    try:
        return _sizing_cached(tp, meta)
    except TypeError:  # an unhashable marker
        return _sizing_now(tp, meta)


@functools.cache
def _sizing_cached(tp: Any, meta: tuple[Any, ...]) -> tuple[str | None, Any]:
    return _sizing_now(tp, meta)


def _sizing_now(tp: Any, meta: tuple[Any, ...]) -> tuple[str | None, Any]:
    tp, meta = _unwrap(tp, meta)
    bound = _marker(meta, Bound)
    return (bound.name if bound is not None else None), (get_args(tp)[0] if get_origin(tp) is tuple else None)


def check_bounds(stage: str, out: Any, b: Bounds) -> tuple[str, ...]:
    """An answer past its role's bounds is invalid, whichever backend produced it; else the bounds it
    reached (`bound_hits`, measured in the same pass: the answer is measured once per call).

    A grammar that carries the bounds never produces one; a backend that could
    not carry them (outlines, see engines/grammar.py) or none (an OpenAI-compatible
    endpoint) is held to the same contract here.
    """
    limits = b.model_dump()
    if all(v is None for v in limits.values()):
        return ()  # unbounded (every role of a large model): nothing to measure
    sizes = _sizes(stage, out)
    for name, size in sizes:
        if limits[name] is not None and size > limits[name]:
            raise InvalidOutput(f"{stage}: {name} {size} is over its bound {limits[name]}")
    return _reached(stage, sizes, limits)


def bound_hits(stage: str, out: Any, b: Bounds) -> tuple[str, ...]:
    """Which bounds this answer reached (so it may have been cut by the grammar).

    Reaching a bound is not a failure, but on a capable model it changes what
    was measured, so the call log and the turn record keep it.
    """
    limits = b.model_dump()
    if all(v is None for v in limits.values()):
        return ()
    return _reached(stage, _sizes(stage, out), limits)


def _reached(stage: str, sizes: list[tuple[str, int]], limits: dict[str, int | None]) -> tuple[str, ...]:
    reached = {name for name, size in sizes if (limit := limits[name]) is not None and size >= limit}
    return tuple(f"{stage}:{name}" for name in limits if name in reached)
