"""The rig's JSON schemas as each structured-output backend can take them.

The stage schemas (stages.schema_for) use bounded strings whose first
character is not blank (`minLength`, `maxLength` and a `pattern`), bounded
arrays, `prefixItems`, `anyOf` with `const`, and ids either as enums of the
state under audit or as patterns of their shapes. What each compiler does
with them, and what this module changes so that a grammar never admits an
answer the parser rejects for its form (tests/test_grammar_agreement.py):

- guidance (llguidance) reads all of it as JSON Schema means it: the schema
  goes as it is.
- outlines ignores a string's pattern beside its lengths. So a bounded
  non-blank string becomes one pattern holding both: a first character that
  is not blank, then up to `maxLength - 1` more. outlines pastes the pattern
  into its own regex as the raw text between the quotes, so the pattern
  spells the JSON escapes itself and keeps them.
- xgrammar writes no JSON escape in a string that has a pattern or any
  length bound: a non-blank pattern or `minLength` would forbid straight
  quotes, backslashes and newlines in every narration. So under xgrammar
  free text keeps only a `maxLength` a role sets (the embedded model's
  bounds; none under experiment=paper), and a blank string is admitted,
  which the parser then rejects (an invalid attempt, retried; listed in
  DIFFERENCES).
- outlines builds an automaton over the whole vocabulary for each new
  schema: about 11 s for a double-check schema on the embedded tokenizer,
  34 s with its item counts (issue 26). Ids as enums of the current state
  make nearly every audit call a new schema, so outlines gets ids as
  patterns (`ID_FORM`): each stage's schema is then the same on every call
  of a run (the status check's: on every call of a spec), vLLM's grammar
  cache serves every call after the first, and item counts stay in the
  grammar. `prefixItems` followed by an `items` schema is read by outlines
  as "exactly the prefix", so such an array becomes a plain `items` array
  (only `build_commitments` has one, to say "at least one achievement",
  which the build's cross-check checks anyway).

Where a grammar differs from the parser (guidance and outlines never admit
a leading blank; xgrammar admits a blank string) is listed in `DIFFERENCES`; the parser and
`stages.check_bounds` remain the contract for every backend, and for an
endpoint with no grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

BACKENDS: tuple[str, ...] = ("xgrammar", "guidance", "outlines")

# How each backend's schemas name ids (stages.IdForm): xgrammar and guidance compile an enum of
# the current ids in milliseconds, so they keep the exact enum; outlines compiles for seconds per
# new schema, so it gets the ids' shapes and one schema per stage. The type is stages.IdForm's
# (the engines know no protocol; mypy checks that the two agree where execution passes one on).
IdForm = Literal["enum", "pattern"]
ID_FORM: dict[str, IdForm] = {"xgrammar": "enum", "guidance": "enum", "outlines": "pattern"}

# Where a backend's grammar and the parser differ, and why: the grammar admits less (never more),
# but for the two answers marked "admitted", which the parser rejects after parsing.
_EVERY_BACKEND = (
    "admitted: the player's line may be a label alone (`Action:`), which the player's clean-up "
    "empties; excluding it takes a branch per label prefix, each with its own length counter "
    "(stages.regex_for)",
)
XGRAMMAR_BLANK = (
    "admitted: a blank or whitespace-only string (and one that starts with a blank): xgrammar writes "
    "no JSON escape in a string with a pattern or a minimum length, so either would forbid "
    "straight quotes, backslashes and newlines in every narration, fact and reason; the parser "
    "rejects a blank string, an invalid attempt (retried)"
)
DIFFERENCES: dict[str, tuple[str, ...]] = {
    "xgrammar": (
        XGRAMMAR_BLANK,
        "a string with a length bound (`maxLength`: only where a role sets output bounds, as the "
        "embedded model's do; none under experiment=paper) holds no JSON escape: xgrammar's "
        "counted string admits none",
        "ids as enums: only ids of the state under audit",
        *_EVERY_BACKEND,
    ),
    "guidance": (
        "a string never starts with a blank character (the parser strips it)",
        "ids as enums: only ids of the state under audit",
        *_EVERY_BACKEND,
    ),
    "outlines": (
        "a string never starts with a blank character (the parser strips it)",
        "admitted: an id of the right shape that does not exist (ids as patterns of their shapes, "
        "so that the schema is constant); the parser rejects it, an invalid attempt",
        *_EVERY_BACKEND,
    ),
}

# A JSON string's raw characters as the text between its quotes (outlines' own string class): no
# quote, backslash, control character, DEL or C1 control (outlines leaves those last out too).
_RAW = r'"\\\x00-\x1f\x7f-\x9f'
# The two-character escapes outlines admits; decoded, each is one character.
_ESCAPE = r'\\["\\/bfnrt]'
_ESCAPE_NOT_BLANK = r'\\["\\/b]'  # \f \n \r \t decode to blanks
# A protocol string pattern this module can fold lengths into: "the first character is none of ...".
_FIRST_NOT = re.compile(r"\^\[\^(.+)\]")


def id_form(backend: str) -> IdForm:
    """How `backend`'s schemas name ids (an unknown backend: the exact enum)."""
    return ID_FORM.get(backend, "enum")


def adapt_schema(schema: dict[str, Any], backend: str) -> dict[str, Any]:
    """The schema to hand to `backend` (a copy; the original is what answers are checked against)."""
    if backend == "guidance":
        return schema
    adapted: dict[str, Any] = _adapt(schema, backend)
    return adapted


def _adapt(node: Any, backend: str) -> Any:
    if isinstance(node, list):
        return [_adapt(v, backend) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _adapt(v, backend) for k, v in node.items()}
    if out.get("type") == "string" and "pattern" in out:
        if backend == "xgrammar":
            out = _without_blank_pattern(out)
        else:
            out = _fold_lengths(out)
    if backend == "outlines" and "prefixItems" in out and isinstance(out.get("items"), dict):
        # Any item may be a prefix item or a later one: admitted, then checked after parsing.
        out["items"] = {"anyOf": [*out.pop("prefixItems"), out["items"]]}
    return out


def _without_blank_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """xgrammar: a free-text string loses its non-blank pattern and its `minLength`, and keeps a
    `maxLength` when a role sets one. xgrammar writes no JSON escape in a string that has a
    pattern or any length bound (measured on xgrammar 0.2.8, tests/test_grammar_agreement.py):
    either would forbid every straight quote, backslash and newline in a capable narrator's
    dialogue and paragraphs, which changes the measurement. Unbounded text (experiment=paper)
    therefore keeps every character; a blank answer stays admitted and the parser rejects it (an
    invalid attempt, retried). Both are listed in DIFFERENCES."""
    if _FIRST_NOT.fullmatch(node["pattern"]) is None or "minLength" not in node:
        return node  # an id pattern: kept as it is
    return {k: v for k, v in node.items() if k not in ("pattern", "minLength")}


def _fold_lengths(node: dict[str, Any]) -> dict[str, Any]:
    """A "first character is none of ..." string with lengths, as one full-match pattern over the
    raw text between the quotes, JSON escapes spelled out (each one character)."""
    first = _FIRST_NOT.fullmatch(node["pattern"])
    if first is None or "minLength" not in node:
        return node  # an id pattern: no lengths to keep, the compilers read it as it is
    most = node.get("maxLength")
    more = "*" if most is None else f"{{0,{most - 1}}}"
    head = f"[^{_RAW}{first.group(1)}]"
    unit = f"[^{_RAW}]"
    head, unit = f"({head}|{_ESCAPE_NOT_BLANK})", f"({unit}|{_ESCAPE})"
    rest = {k: v for k, v in node.items() if k not in ("minLength", "maxLength", "pattern")}
    return {**rest, "pattern": f"{head}{unit}{more}"}


def unsupported(schema: dict[str, Any], backend: str) -> str | None:
    """Why `backend` cannot take this (adapted) schema, or None; compiled offline, no engine needed."""
    text = json.dumps(adapt_schema(schema, backend))
    try:
        if backend == "xgrammar":
            import xgrammar

            xgrammar.Grammar.from_json_schema(text, any_whitespace=False)
        elif backend == "guidance":
            import llguidance

            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
            err: str = llguidance.LLMatcher.validate_grammar(grammar, None)
            if err:
                return err.splitlines()[0][:200]
        elif backend == "outlines":
            import outlines_core.json_schema as outlines_schema

            regex = outlines_schema.build_regex_from_schema(text)
            del regex  # built: the schema's features are all ones outlines can express
        else:
            return f"unknown structured-output backend {backend!r} (known: {', '.join(BACKENDS)})"
    except ImportError as exc:
        return f"the {backend} package is not installed ({exc.name})"
    except Exception as exc:  # each compiler raises its own types; the message is what matters
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
