"""The schema walker: a stage's JSON schema (and regex) built from its output model, once per call that
offers something new to name."""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from ._base import (
    _BLANK_CLASS,
    _QUOTES,
    NON_BLANK_START,
    UNBOUNDED,
    AuditIds,
    Bound,
    Bounds,
    FirstIs,
    IdForm,
    Names,
    NamesPer,
    OnePerName,
    Size,
    _asked,
    _field,
    _fields,
    _is_optional,
    _marker,
    _Out,
    _unwrap,
)
from ._registry import _stage

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
    fields = _fields(model)
    for name, _, meta in fields:
        per = _marker(meta, NamesPer)
        if per is not None and name not in given:
            return {"anyOf": _branches(model, name, per, c, given)}
    return _obj({name: given[name] if name in given else _schema(tp, meta, c) for name, tp, meta in fields})


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
    `id_form` says (an id that does not exist is then the parser's to reject).

    Calls that offer the same names get the same dict: read it, never change it (a backend adapts a
    copy, engines/grammar.py)."""
    s = _stage(stage)
    if s.output is None:
        return None
    return _SCHEMAS.get(s.output, ids, bounds, id_form)


def build_schema(
    stage: str, ids: AuditIds = AuditIds(), bounds: Bounds = UNBOUNDED, id_form: IdForm = "enum"
) -> dict[str, Any] | None:
    """`schema_for` built anew (what the cache must give back)."""
    s = _stage(stage)
    return _object(s.output, _Call(ids, bounds, id_form)) if s.output is not None else None


# Building a schema was a tenth of the rig's CPU per call at GPU speed (the walker reads every field's
# markers). Most calls offer what a recent call offered: the same commitments (status_check's entry per
# commitment is most of the cost; stories often share their commitments' ids), no ids at all (the
# narration), facts that did not change. The least recently asked for leaves first. Measured on the
# rig-alone bench (20 stories x 100 turns, 10,040 schemas asked for): 2,213 built keeping 2,048
# (7.1 MB), 3,337 keeping 512 (1.9 MB); the facts' schemas fill the rest, most never asked for again.
_KEPT = 512


class _Schemas:
    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._held: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()  # a pre-flight may build schemas off the loop's thread

    def get(self, model: type[_Out], ids: AuditIds, bounds: Bounds, form: IdForm) -> dict[str, Any]:
        key = (model, bounds, form, _offered(model, ids))
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
                return held
        built = _object(model, _Call(ids, bounds, form))
        with self._lock:
            self._held[key] = built
            if len(self._held) > self.kept:
                self._held.popitem(last=False)
        return built


_SCHEMAS = _Schemas(_KEPT)


def _offered(model: type[_Out], ids: AuditIds) -> tuple[Any, ...]:
    """All the walker reads of `ids`: what each `Names` and `NamesPer` in the model offers the call."""
    return tuple(m.of(ids) if isinstance(m, Names) else tuple(m.of(ids).items()) for m in _name_markers(model))


@functools.cache
def _name_markers(model: type[_Out]) -> tuple[Names | NamesPer, ...]:
    """Every `Names` and `NamesPer` anywhere in the model's fields, their items and nested models: the
    walker reads the call's ids only through these."""
    return tuple(dict.fromkeys(_markers_in(model, ())))


def _markers_in(tp: Any, meta: tuple[Any, ...]) -> Iterator[Names | NamesPer]:
    tp, meta = _unwrap(tp, meta)
    yield from (m for m in meta if isinstance(m, Names | NamesPer))
    if isinstance(tp, type) and issubclass(tp, _Out):
        for _, field_tp, field_meta in _fields(tp):
            yield from _markers_in(field_tp, field_meta)
    elif get_origin(tp) is not Literal:
        for arg in get_args(tp):  # a tuple's items, an optional's value
            if arg is not Ellipsis:
                yield from _markers_in(arg, ())
