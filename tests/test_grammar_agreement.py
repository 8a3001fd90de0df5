"""No answer a backend's grammar admits is one the parser rejects for its form (issue 26).

For every JSON stage and every backend, the schema the engine would send (ids in the backend's
form, the embedded model's tight bounds) is asked, through the compiler itself
(tests/grammar_oracles.py), about the adversarial corners of each field: blank, whitespace-only
and leading-blank strings in every kind of Unicode blank the parser strips, strings at and past
their maximal length (in ASCII, accented and astral characters), quotes, backslashes and
newlines, ids that exist, that do not, that are padded or of another kind, lists empty, full and
one past full, statuses missing, repeated or out of order; each written compact, with
\\u-escapes and with the spacing outlines allows. Every text a grammar admits must pass
`stages.parse` and `stages.check_bounds`; the only rejection allowed is an id of the right shape
that does not exist, under the id-pattern form (the parser's existence check). And the grammar
must not be needlessly stricter at the bounds: the longest string and the fullest list are
admitted.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from grammar_oracles import oracle
from ncp_local.engines.grammar import BACKENDS, DIFFERENCES, XGRAMMAR_BLANK, id_form
from ncp_local.protocol.stages import (
    BLANK_CHARS,
    STAGES,
    TIGHT,
    UNBOUNDED,
    AuditIds,
    InvalidOutput,
    check_bounds,
    parse,
    regex_for,
    schema_for,
)

IDS = AuditIds(
    fact_ids=("f_0", "f_1", "f_12"),
    commitment_ids=("c_0", "c_1"),
    retrievable=(0,),
    new_fact_ids=("f_13",),
    conflict_keys=("fact:f_0", "commitment:c_1"),
)
JSON_STAGES = tuple(s.name for s in STAGES.values() if s.json)
# Whole-spec builders hold up to 20 objects of 3-4 strings: their corners are the same kinds,
# at many times the cost; build_commitments stays for its prefixItems.
CHECKED = tuple(s for s in JSON_STAGES if s not in ("build_trajectory", "build_facts"))

BLANKS = ("", *BLANK_CHARS)
Path = tuple[Any, ...]

# Every test here compiles grammars with vLLM's backends (xgrammar, outlines, guidance).
pytestmark = pytest.mark.engine_libs


def _example_id(pattern: str) -> str:
    """An id the pattern names (the first shape with each digit run as 0)."""
    first = pattern.removeprefix("^(").removesuffix(")$").split("|")[0]
    return re.sub(r"\[(.)\]", r"\1", first.replace("[0-9]+", "0"))


def base(schema: dict[str, Any]) -> Any:
    """The least answer the schema admits."""
    if "anyOf" in schema:
        return base(schema["anyOf"][0])
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {k: base(v) for k, v in schema["properties"].items()}
    if kind == "array":
        prefix = [base(p) for p in schema.get("prefixItems", [])]
        more = schema.get("minItems", 0) - len(prefix)
        return prefix + ([base(schema["items"])] * more if more > 0 else [])
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "string":
        if schema.get("maxLength") == 0:
            return ""
        if "minLength" not in schema:  # an id pattern
            return _example_id(schema["pattern"])
        return "x"
    raise AssertionError(f"no base for {schema}")


def _set(value: Any, path: Path, new: Any) -> Any:
    out = copy.deepcopy(value)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return out


def corners(schema: dict[str, Any], value: Any, path: Path = ()) -> Iterator[tuple[str, Any, bool]]:
    """(what, answer, at a bound?) for each corner of each field of `value` under `schema`;
    `at a bound`: an answer the grammar must admit (the longest string, the fullest list)."""
    if "anyOf" in schema:
        for i, branch in enumerate(schema["anyOf"]):
            branched = base(branch)
            yield f"{path} branch {i}", _set(value, path, branched) if path else branched, True
        schema = schema["anyOf"][0]
    kind = schema.get("type")
    if kind == "object":
        for k, sub in schema["properties"].items():
            yield from corners(sub, value, (*path, k))
        yield f"{path} extra key", _set(value, (*path, "extra"), 1), False
    elif kind == "array":
        yield from _array_corners(schema, value, path)
    elif kind == "string" and "minLength" in schema:
        yield from _string_corners(schema, value, path)
    elif kind == "string" and "pattern" in schema:
        known = [*IDS.fact_ids, *IDS.new_fact_ids, *IDS.commitment_ids, "input", "player_input", "response_internal"]
        for other in (*known, "f_99", "c_9", " f_0", "f_0 ", "F_0", "", "f_", "x"):
            yield f"{path} id {other!r}", _set(value, path, other), False
    elif "enum" in schema:
        for other in (*schema["enum"], "pending", "DONE", "f_99", ""):
            yield f"{path} enum {other!r}", _set(value, path, other), False
    elif kind == "boolean":
        yield f"{path} false", _set(value, path, False), False


def _string_corners(schema: dict[str, Any], value: Any, path: Path) -> Iterator[tuple[str, Any, bool]]:
    most = schema.get("maxLength", 40)
    for blank in BLANKS:
        yield f"{path} blank {blank!r}", _set(value, path, blank * 2), False
        if not blank:
            continue
        yield f"{path} leading blank {blank!r}", _set(value, path, f"{blank}x"), False
        yield f"{path} trailing blank {blank!r}", _set(value, path, f"x{blank}"), False
    for text, bound in (
        ("x", True),
        ("x" * most, True),
        ("x" * (most + 1), False),
        ("é" * most, False),
        ("é" * (most + 1), False),
        ("\U0001f600" * most, False),
        ("\U0001f600" * (most + 1), False),
        ('say "no"', False),
        ("a\\b", False),
        ("a\nb", False),
        ("a\x01b", False),
        ("\x08", False),
        ('"', False),
        ("\\", False),
    ):
        yield f"{path} text {text[:12]!r}x{len(text)}", _set(value, path, text), bound


def _array_corners(schema: dict[str, Any], value: Any, path: Path) -> Iterator[tuple[str, Any, bool]]:
    items = _get(value, path)
    prefix = schema.get("prefixItems")
    if prefix and schema.get("items") is False:  # one entry per commitment
        yield f"{path} one missing", _set(value, path, items[:-1]), False
        yield f"{path} one repeated", _set(value, path, [*items, items[-1]]), False
        yield f"{path} reversed", _set(value, path, items[::-1]), False
        for i, p in enumerate(prefix):
            yield from corners(p, _set(value, path, items), (*path, i))
        return
    item = base(schema["items"])
    most = schema.get("maxItems")
    head = [base(p) for p in prefix or ()]  # a list's required first items

    def filled(n: int) -> list[Any]:
        return head + [item] * (n - len(head))

    yield f"{path} empty", _set(value, path, []), "minItems" not in schema
    if most is not None:
        yield f"{path} full", _set(value, path, filled(most)), True
        yield f"{path} one past full", _set(value, path, filled(most + 1)), False
    else:
        yield f"{path} many", _set(value, path, [item] * 12), False
    # The fields of an item: the last of the least list (past any prefix item), or of a list of one.
    some = list(items) or [item]
    yield from corners(schema["items"], _set(value, path, some), (*path, len(some) - 1))


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def writings(answer: Any) -> dict[str, str]:
    """The texts an answer can be: compact (as xgrammar and guidance write it), every non-ASCII
    character escaped, and with the optional single spaces outlines allows."""
    return {
        "compact": json.dumps(answer, separators=(",", ":"), ensure_ascii=False),
        "escaped": json.dumps(answer, separators=(",", ":")),
        "spaced": json.dumps(answer, separators=(", ", ": "), ensure_ascii=False),
    }


def verdict(stage: str, text: str) -> str | None:
    """None when the parser and the role's bounds take the text, else why not."""
    try:
        check_bounds(stage, parse(stage, text, IDS), TIGHT)
    except InvalidOutput as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stage", CHECKED)
def test_grammar_admits_nothing_the_parser_rejects(backend: str, stage: str) -> None:
    schema = schema_for(stage, IDS, TIGHT, id_form(backend))
    cases = [(what, answer, bound) for what, answer, bound in corners(schema, base(schema))]
    texts = {(what, how): text for what, answer, _ in cases for how, text in writings(answer).items()}
    admits = oracle(backend, schema, {c for t in texts.values() for c in t})
    admitted = {key for key, text in texts.items() if admits(text)}
    wrong = {}
    blank_admitted = XGRAMMAR_BLANK in DIFFERENCES[backend]
    for key in admitted:
        why = verdict(stage, texts[key])
        if why is None or (id_form(backend) == "pattern" and "names unknown id" in why):
            continue
        if blank_admitted and "blank" in key[0]:
            continue  # the listed difference: xgrammar admits a blank string, the parser rejects it
        wrong[key] = (texts[key][:120], why)
    assert not wrong, wrong
    # Not vacuous, and not needlessly strict: the least answer and every answer at a bound are admitted.
    must = {(what, "compact") for what, _, bound in cases if bound} | {("least", "compact")}
    texts[("least", "compact")] = writings(base(schema))["compact"]
    assert admits(texts[("least", "compact")])
    refused = {key: texts[key][:120] for key in must if key != ("least", "compact") and key not in admitted}
    assert not refused, refused
    blank = {key for key in admitted if "blank" in key[0] and "trailing" not in key[0]}
    if not blank_admitted:
        # Blank strings are refused, however they are written.
        assert not blank, blank


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stage", ("narrate", "fact_update", "trajectory_check"))
def test_unbounded_text_keeps_quotes_backslashes_and_newlines(backend: str, stage: str) -> None:
    """Under experiment=paper (no output bounds) a narrator's dialogue and paragraphs, and an auditor's
    quoted reasons, pass every backend's grammar: a grammar that forbade them would change the measurement."""
    schema = schema_for(stage, IDS, UNBOUNDED, id_form(backend))
    value = base(schema)
    texts = []
    for path in _string_paths(schema):
        for text in ('She said "stay" and left.', "a\\b", "One.\n\nTwo."):
            texts.append(writings(_set(value, path, text))["compact"])
    assert texts
    admits = oracle(backend, schema, {c for t in texts for c in t} | set("0123456789_fc"))  # ids' shapes too
    assert all(verdict(stage, t) is None for t in texts)
    refused = [t for t in texts if not admits(t)]
    assert not refused, refused


def _string_paths(schema: dict[str, Any], path: Path = ()) -> Iterator[Path]:
    """Paths to the free-text strings of a schema's least answer (ids and enums left out)."""
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema and "minLength" in schema:
        yield path
    for key, sub in (schema.get("properties") or {}).items():
        yield from _string_paths(sub, (*path, key))


# The player's bounded line: a label alone is the one answer its regex admits and the parser
# rejects (stages.regex_for says why; engines/grammar.DIFFERENCES lists it).
LABEL_ONLY = ("Action:", "PLAYER:", "input: ", "Player input: '")


@pytest.mark.parametrize("backend", BACKENDS)
def test_player_line_admits_nothing_the_parser_rejects_but_a_label_alone(backend: str) -> None:
    most = TIGHT.player_chars
    texts = [
        *(b * 2 for b in BLANKS),
        *(f"{b}I run" for b in BLANKS if b),
        *(f"{q}I run{q}" for q in "\"'`"),
        '""',
        "''",
        "``",
        "I run",
        "x",
        "x" * most,
        "x" * (most + 1),
        "é" * most,
        "\U0001f600" * most,
        "I run\nI hide",
        "Action: I run",
        "action:I run",
        *LABEL_ONLY,
        "Actions speak",
        "input",
        "I",
    ]
    regex = regex_for("player", TIGHT)
    admits = oracle(backend, None, {c for t in texts for c in t}, regex=regex)
    wrong = [t for t in texts if admits(t) and verdict("player", t) is not None and t not in LABEL_ONLY]
    assert not wrong, wrong
    assert all(admits(t) for t in ("I run", "x", "x" * most, "Action: I run", "Actions speak", "I")), regex
    assert not any(admits(t) for t in ("x" * (most + 1), " I run", '"I run"', "I run\nI hide"))
