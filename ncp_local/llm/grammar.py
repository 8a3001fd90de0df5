"""The rig's JSON schemas as each structured-output backend can take them.

The stage schemas (stages.schema_for) use bounded strings and arrays,
`prefixItems`, `anyOf` with `const`, and enums built from the state under
audit. xgrammar and guidance compile all of it. outlines turns a schema into
a regular expression and then into an automaton over the whole vocabulary:
a counted repetition (`maxLength: 1000` becomes `{1,1000}`) takes it longer
than vLLM's regex-compilation timeout (5 s by default), so every call fails
before a token is generated; and `prefixItems` followed by an `items`
schema is read as "exactly the prefix". For outlines the schema is therefore
adapted: lengths and item counts leave the grammar (the runner checks the
role's bounds after parsing, `stages.check_bounds`, so the contract is the
same), and a `prefixItems` + `items` array becomes a plain `items` array
(the one stage that uses it, `build_commitments`, puts an achievement first
only to say "at least one achievement", which the build's cross-check
checks anyway). Whatever the adapted schema no longer says is checked
after parsing (`stages.parse`: list sizes of built specs; `check_bounds`:
the role's bounds), so every backend answers to the same contract.
"""

from __future__ import annotations

import json
import re
from typing import Any

BACKENDS: tuple[str, ...] = ("xgrammar", "guidance", "outlines")
_COUNTS = ("maxLength", "maxItems")
_COUNTED = re.compile(r"\{(\d+),(\d+)\}")


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


def adapt_regex(regex: str, backend: str) -> str:
    """A plain-text constraint for `backend`: outlines gets `{1,N}` as `+` (the bound is checked after parsing)."""
    if backend != "outlines":
        return regex
    return _COUNTED.sub(lambda m: "+" if m.group(1) != "0" else "*", regex)


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
            big = [int(m.group(2)) for m in _COUNTED.finditer(regex) if int(m.group(2)) > 64]
            if big:
                return f"a counted repetition of {max(big)} (too slow for outlines' regex compiler)"
        else:
            return f"unknown structured-output backend {backend!r} (known: {', '.join(BACKENDS)})"
    except ImportError as exc:
        return f"the {backend} package is not installed ({exc.name})"
    except Exception as exc:  # each compiler raises its own types; the message is what matters
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
