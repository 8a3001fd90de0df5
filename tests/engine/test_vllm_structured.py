"""Grammar-constrained JSON: every output parses and validates against its schema.

Two levels: the grammar xgrammar builds from each schema accepts exactly the
instances `jsonschema` accepts (fast, no engine), and the engine's outputs
under that grammar validate.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncp_local.engines.base import Message, Request

_STATUS = {"type": "string", "enum": ["SATISFIED", "PENDING"]}

SCHEMAS: dict[str, dict] = {
    # An object holding an array of ids drawn from an enum (fact update style).
    "enum_ids": {
        "type": "object",
        "properties": {
            "add_facts": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 2},
            "negate_facts": {
                "type": "array",
                "items": {"type": "string", "enum": ["f_0", "f_1", "f_2"]},
                "maxItems": 3,
            },
        },
        "required": ["add_facts", "negate_facts"],
        "additionalProperties": False,
    },
    # A discriminated union: anyOf objects told apart by a const field.
    "anyof_const": {
        "type": "object",
        "properties": {
            "conflict": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "kind": {"const": "fact"},
                            "fact_id": {"type": "string", "enum": ["f_0", "f_1"]},
                        },
                        "required": ["kind", "fact_id"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {
                            "kind": {"const": "commitment"},
                            "commitment_id": {"type": "string", "enum": ["c_0"]},
                        },
                        "required": ["kind", "commitment_id"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "none"}},
                        "required": ["kind"],
                        "additionalProperties": False,
                    },
                ]
            }
        },
        "required": ["conflict"],
        "additionalProperties": False,
    },
    # One entry per commitment, in order, ids fixed: prefixItems + items false.
    "prefix_items": {
        "type": "object",
        "properties": {
            "statuses": {
                "type": "array",
                "prefixItems": [
                    {
                        "type": "object",
                        "properties": {"id": {"const": cid}, "status": _STATUS},
                        "required": ["id", "status"],
                        "additionalProperties": False,
                    }
                    for cid in ("c_0", "c_1", "c_2")
                ],
                "items": False,
                "minItems": 3,
                "maxItems": 3,
            }
        },
        "required": ["statuses"],
        "additionalProperties": False,
    },
    # Bounded free text (a tiny model can otherwise loop inside a string).
    "bounded_strings": {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": 24},
            "confirmed": {"type": "boolean"},
        },
        "required": ["confirmed", "reason"],
        "additionalProperties": False,
    },
}

PROMPTS = {
    "enum_ids": "Facts: f_0 the door is red; f_1 the hall is dark; f_2 Ana holds a key.\n"
    "Story: Ana paints the door blue.\nWhich facts change? Answer in JSON.",
    "anyof_const": "Facts: f_0 the door is red; f_1 the hall is dark. Commitment c_0: Ana never lies.\n"
    "Story: the red door creaks.\nIs there a conflict? Answer in JSON.",
    "prefix_items": "Commitments: c_0 Ana finds the key; c_1 the door opens; c_2 Ana leaves.\n"
    "Story: Ana finds the key and opens the door.\nRate each commitment. Answer in JSON.",
    "bounded_strings": "Is the sky green? Answer in JSON with a short reason.",
}

# (instance, valid?) pairs probing exactly the features the stage schemas use.
CASES: dict[str, list[tuple[object, bool]]] = {
    "enum_ids": [
        ({"add_facts": [], "negate_facts": []}, True),
        ({"add_facts": ["the door is blue"], "negate_facts": ["f_0", "f_2"]}, True),
        ({"add_facts": [], "negate_facts": ["f_9"]}, False),
        ({"add_facts": [], "negate_facts": ["f_0", "f_0", "f_1", "f_2"]}, False),
        ({"add_facts": ["a", "b", "c"], "negate_facts": []}, False),
        ({"add_facts": [], "negate_facts": [], "extra": 1}, False),
        ({"add_facts": []}, False),
    ],
    "anyof_const": [
        ({"conflict": {"kind": "fact", "fact_id": "f_1"}}, True),
        ({"conflict": {"kind": "commitment", "commitment_id": "c_0"}}, True),
        ({"conflict": {"kind": "none"}}, True),
        ({"conflict": {"kind": "fact", "commitment_id": "c_0"}}, False),
        ({"conflict": {"kind": "commitment", "fact_id": "f_0"}}, False),
        ({"conflict": {"kind": "none", "fact_id": "f_0"}}, False),
        ({"conflict": {"kind": "other"}}, False),
    ],
    "prefix_items": [
        (
            {
                "statuses": [
                    {"id": "c_0", "status": "PENDING"},
                    {"id": "c_1", "status": "SATISFIED"},
                    {"id": "c_2", "status": "PENDING"},
                ]
            },
            True,
        ),
        (
            {
                "statuses": [
                    {"id": "c_1", "status": "PENDING"},
                    {"id": "c_0", "status": "SATISFIED"},
                    {"id": "c_2", "status": "PENDING"},
                ]
            },
            False,
        ),
        ({"statuses": [{"id": "c_0", "status": "PENDING"}, {"id": "c_1", "status": "SATISFIED"}]}, False),
        (
            {
                "statuses": [
                    {"id": "c_0", "status": "PENDING"},
                    {"id": "c_1", "status": "SATISFIED"},
                    {"id": "c_2", "status": "PENDING"},
                    {"id": "c_2", "status": "PENDING"},
                ]
            },
            False,
        ),
        (
            {
                "statuses": [
                    {"id": "c_0", "status": "DONE"},
                    {"id": "c_1", "status": "SATISFIED"},
                    {"id": "c_2", "status": "PENDING"},
                ]
            },
            False,
        ),
        ({"statuses": []}, False),
    ],
    "bounded_strings": [
        ({"reason": "x" * 24, "confirmed": True}, True),
        ({"reason": "", "confirmed": False}, True),
        ({"reason": "x" * 25, "confirmed": True}, False),
        ({"reason": "x", "confirmed": "yes"}, False),
    ],
}


def _compact(instance: object) -> str:
    # The engine emits compact JSON (disable_any_whitespace) with keys in schema order.
    return json.dumps(instance, separators=(",", ":"))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_is_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMAS[name])


@pytest.mark.parametrize(
    "name,instance,valid",
    [(name, inst, ok) for name, cases in CASES.items() for inst, ok in cases],
)
def test_xgrammar_matches_jsonschema(name: str, instance: object, valid: bool) -> None:
    """xgrammar's grammar for the schema accepts an instance iff jsonschema does."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    schema = SCHEMAS[name]
    assert jsonschema.Draft202012Validator(schema).is_valid(instance) is valid
    # The same options vLLM uses when disable_any_whitespace is set.
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    assert _is_grammar_accept_string(grammar, _compact(instance)) is valid


def test_xgrammar_enforces_schema_property_order() -> None:
    """Keys come out in the schema's `properties` order; another order is rejected
    by the grammar although it is valid JSON Schema-wise."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    schema = SCHEMAS["bounded_strings"]
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    assert _is_grammar_accept_string(grammar, '{"reason":"x","confirmed":true}')
    assert not _is_grammar_accept_string(grammar, '{"confirmed":true,"reason":"x"}')


def _request(name: str, seed: int) -> Request:
    return Request(
        messages=(
            Message("system", "You are a careful story auditor. Reply with JSON only."),
            Message("user", PROMPTS[name]),
        ),
        temperature=0.8,
        top_p=0.95,
        max_tokens=96,
        seed=seed,
        json_schema=SCHEMAS[name],
        tags={"stage": name},
    )


def test_engine_outputs_validate(engine) -> None:
    """Every schema, two seeds each, all in flight together; every output validates."""
    names = sorted(SCHEMAS)
    requests = [_request(name, seed) for name in names for seed in (11, 12)]

    completions = engine.generate_all(requests)
    for req, comp in zip(requests, completions, strict=True):
        name = req.tags["stage"]
        assert comp.finish_reason == "stop", f"{name}: cut off ({comp.finish_reason}): {comp.text!r}"
        value = json.loads(comp.text)
        jsonschema.validate(value, SCHEMAS[name])
        # Compact JSON: no whitespace padding between tokens.
        assert comp.text == _compact(value), f"{name}: not compact: {comp.text!r}"


def test_unsupported_schema_feature_is_rejected(engine) -> None:
    """xgrammar on this vLLM rejects uniqueItems (and contains); the engine survives it."""
    schema = {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "uniqueItems": True}
    req = Request(
        messages=(Message("user", "JSON"),), temperature=0.0, top_p=1.0, max_tokens=8, seed=1, json_schema=schema
    )
    # The request's own failure (a failed attempt for the runner), not the end of the run.
    failed = engine.run(engine.backend.generate(req))
    assert failed.finish_reason == "error" and "not supported" in (failed.error or ""), failed
    ok = engine.run(engine.backend.generate(_request("bounded_strings", 3)))
    jsonschema.validate(json.loads(ok.text), SCHEMAS["bounded_strings"])
