"""Does a structured-output backend's grammar admit this text? Asked of the compilers themselves,
offline: xgrammar's own matcher, llguidance's matcher over a byte-level tokenizer, and an outlines
index over a vocabulary of single characters (outlines builds the same automaton vLLM builds,
only over fewer tokens). The schema given is the protocol's; each backend gets it adapted as the
engine sends it (engines/grammar.adapt_schema)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ncp_local.engines.grammar import adapt_schema

Oracle = Callable[[str], bool]


def oracle(backend: str, schema: dict[str, Any] | None, alphabet: Iterable[str], regex: str | None = None) -> Oracle:
    """A function text -> admitted?, for one schema (or a plain-text `regex`) on one backend (the
    grammar compiled once). `alphabet`: every character the texts asked about may hold (outlines'
    vocabulary)."""
    text = json.dumps(adapt_schema(schema, backend)) if schema is not None else None
    return {"xgrammar": _xgrammar, "guidance": _guidance, "outlines": _outlines}[backend](text, alphabet, regex)


def _xgrammar(schema: str | None, alphabet: Iterable[str], regex: str | None) -> Oracle:
    import xgrammar
    from xgrammar.testing import _get_matcher_from_grammar

    # As vLLM compiles it with disable_any_whitespace (engines/vllm_args.py engine_kwargs).
    if schema is None:
        grammar = xgrammar.Grammar.from_regex(regex)
    else:
        grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    matcher = _get_matcher_from_grammar(grammar)  # compiled once, reset per text

    def admits(s: str) -> bool:
        matcher.reset()
        return matcher.accept_string(s) and matcher.is_terminated()

    return admits


class _ByteTokenizer:
    """One token per byte, and an end token: llguidance then sees the text byte by byte."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, s: str | bytes) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode())


def _guidance(schema: str | None, alphabet: Iterable[str], regex: str | None) -> Oracle:
    import llguidance

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    # As vLLM compiles it with disable_any_whitespace (vllm/v1/structured_output/backend_guidance.py).
    if schema is None:
        grammar = llguidance.LLMatcher.grammar_from_regex(regex)
    else:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})

    def admits(s: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        ids = list(s.encode())
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    return admits


def _outlines(schema: str | None, alphabet: Iterable[str], regex: str | None) -> Oracle:
    import outlines_core
    import outlines_core.json_schema as outlines_schema

    # As vLLM builds it (vllm/v1/structured_output/backend_outlines.py): default whitespace.
    if schema is not None:
        regex = outlines_schema.build_regex_from_schema(schema)
    chars = sorted(set(alphabet))
    token = {c: i for i, c in enumerate(chars)}
    index = outlines_core.Index(regex, outlines_core.Vocabulary(len(chars), {c: [i] for c, i in token.items()}))

    def admits(s: str) -> bool:
        guide = outlines_core.Guide(index)
        for c in s:
            if c not in token or token[c] not in guide.get_tokens():
                return False
            guide.advance(token[c])
        return guide.is_finished()

    return admits
