"""PROTOCOL section 4: stage schemas, parsing and semantic checks."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncp_local.stages import AuditIds, InvalidOutput, parse, schema_for

IDS = AuditIds(fact_ids=("f_0", "f_3"), commitment_ids=("c_0", "c_1"))


def test_status_schema_admits_exactly_one_entry_per_commitment_in_order() -> None:
    schema = schema_for("status_check", IDS)
    good = {"statuses": [{"id": "c_0", "status": "PENDING", "reason": ""},
                         {"id": "c_1", "status": "SATISFIED", "reason": ""}]}
    jsonschema.validate(good, schema)
    for bad in ([good["statuses"][0]], good["statuses"][::-1], good["statuses"] + good["statuses"][:1],
                [{**good["statuses"][0], "status": "DONE"}, good["statuses"][1]]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"statuses": bad}, schema)


def test_conflict_schema_ties_ids_to_types() -> None:
    schema = schema_for("conflict_check", IDS)
    jsonschema.validate({"conflicts": [{"type": "fact", "id": "f_3", "reason": "x"},
                                       {"type": "player_input", "id": "player_input", "reason": "x"}]}, schema)
    for bad in ({"type": "fact", "id": "c_0", "reason": "x"}, {"type": "commitment", "id": "f_0", "reason": "x"},
                {"type": "plot", "id": "f_0", "reason": "x"}, {"type": "fact", "id": "f_0"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"conflicts": [bad]}, schema)


def test_no_active_facts_means_no_fact_branch() -> None:
    schema = schema_for("conflict_check", AuditIds(commitment_ids=("c_0",)))
    types = [b["properties"]["type"]["const"] for b in schema["properties"]["conflicts"]["items"]["anyOf"]]
    assert types == ["commitment", "player_input"]


def test_strings_and_lists_are_bounded() -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string":
                assert "maxLength" in node, node
            if node.get("type") == "array":
                assert "maxItems" in node, node
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for stage in ("opening", "narrate", "fact_update", "conflict_check", "double_check", "trajectory_check",
                  "status_check"):
        walk(schema_for(stage, IDS))


@pytest.mark.parametrize("stage,text,needle", [
    ("fact_update", '{"add_facts": [], "negate_facts": ["f_1"], "reason": ""}', "schema"),
    ("fact_update", '{"add_facts": [], "negate_facts": [], "reason": ""', "bad JSON"),
    ("conflict_check", '{"conflicts": [{"type": "fact", "id": "f_9", "reason": ""}]}', "schema"),
    ("status_check", '{"statuses": [{"id": "c_0", "status": "PENDING", "reason": ""}]}', "schema"),
    ("narrate", '{"text": "   "}', "empty narration"),
    ("narrate", '{"text": "ok", "extra": 1}', "schema"),
    ("player", "   \n", "empty player input"),
])
def test_invalid_outputs_rejected(stage: str, text: str, needle: str) -> None:
    with pytest.raises(InvalidOutput, match=needle):
        parse(stage, text, IDS)


def test_counts_are_derived_and_double_check_semantics() -> None:
    cc = parse("conflict_check", json.dumps({"conflicts": [
        {"type": "fact", "id": "f_0", "reason": "a"}, {"type": "fact", "id": "f_3", "reason": "b"},
        {"type": "commitment", "id": "c_1", "reason": "c"}]}), IDS)
    assert cc.counts() == {"fact": 2, "commitment": 1, "player_input": 0, "total": 3}
    overturned = parse("double_check", json.dumps({"conflicts": [{"type": "fact", "id": "f_0", "reason": "a"}],
                                                   "confirmed": False, "review_reason": "no"}), IDS)
    assert overturned.standing() == ()
    empty_confirmed = parse("double_check", json.dumps({"conflicts": [], "confirmed": True, "review_reason": ""}), IDS)
    assert empty_confirmed.standing() == ()
    kept = parse("double_check", json.dumps({"conflicts": [{"type": "commitment", "id": "c_0", "reason": "a"}],
                                             "confirmed": True, "review_reason": "yes"}), IDS)
    assert [c.id for c in kept.standing()] == ["c_0"]
