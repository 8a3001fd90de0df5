"""The rig's JSON schemas as each structured-output backend can take them.

The stage schemas (stages.schema_for) use bounded strings and arrays,
`prefixItems`, `anyOf` with `const`, and enums built from the state under
audit. xgrammar and guidance compile all of it. outlines turns a schema into
a regular expression and then into an automaton over the whole vocabulary,
which has two consequences:

- a counted repetition takes it long to compile (a 1000-character narration
  about 20 s on a loaded 2-core machine), longer than vLLM's 5 s default, so
  every call failed before a token was generated. The rig's engines get a
  long compile timeout (engines/vllm.py engine_env) and vLLM caches each
  compiled grammar, so constant schemas (narration, player, builders) pay
  once; schemas built from the state (the audits' ids) pay on most calls:
  outlines is correct here, and slower than xgrammar;
- `maxItems` on an array of objects multiplies the regex by the count, and
  `prefixItems` followed by an `items` schema is read as "exactly the
  prefix". So item counts leave the grammar (the runner checks the role's
  bounds after parsing, `stages.check_bounds`, and `stages.parse` the built
  specs' list sizes), and a `prefixItems` + `items` array becomes a plain
  `items` array (only `build_commitments` has one, to say "at least one
  achievement", which the build's cross-check checks anyway).

Every backend thus answers to the same contract.
"""

from __future__ import annotations

import json
from typing import Any

BACKENDS: tuple[str, ...] = ("xgrammar", "guidance", "outlines")

_COUNTS = ("maxItems",)


def adapt_schema(schema: dict[str, Any], backend: str) -> dict[str, Any]:
    """The schema to hand to `backend` (a copy; the original is what answers are checked against)."""
    if backend != "outlines":
        return schema
    return _for_outlines(schema)


def _for_outlines(node: Any) -> Any:
    if isinstance(node, list):
        return [_for_outlines(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _for_outlines(v) for k, v in node.items() if k not in _COUNTS}
    if "prefixItems" in out and isinstance(out.get("items"), dict):
        # Any item may be a prefix item or a later one: admitted, then checked after parsing.
        out["items"] = {"anyOf": [*out.pop("prefixItems"), out["items"]]}
    return out


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
            err = llguidance.LLMatcher.validate_grammar(grammar, None)
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
