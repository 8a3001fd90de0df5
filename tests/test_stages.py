"""PROTOCOL section 4: stage schemas (the grammar), parsing (what the rig accepts) and output bounds."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncp_local.protocol.ledger import FactEntry, FactUpdate, apply_update, next_fact_ids
from ncp_local.protocol.stages import (
    TIGHT,
    UNBOUNDED,
    AuditIds,
    InvalidOutput,
    Narration,
    bound_hits,
    check_bounds,
    parse,
    regex_for,
    schema_for,
)

IDS = AuditIds(fact_ids=("f_0", "f_3"), commitment_ids=("c_0", "c_1"))


def test_status_schema_admits_exactly_one_entry_per_commitment_in_order() -> None:
    schema = schema_for("status_check", IDS)
    good = {
        "statuses": [
            {"id": "c_0", "status": "PENDING", "reason": "r"},
            {"id": "c_1", "status": "SATISFIED", "reason": "r"},
        ]
    }
    jsonschema.validate(good, schema)
    for bad in (
        [good["statuses"][0]],
        good["statuses"][::-1],
        good["statuses"] + good["statuses"][:1],
        [{**good["statuses"][0], "status": "DONE"}, good["statuses"][1]],
        [{**good["statuses"][0], "reason": ""}, good["statuses"][1]],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"statuses": bad}, schema)


def test_status_parse_is_lenient_on_case_and_order_strict_on_coverage_and_reasons() -> None:
    """Without a grammar (openai, scripted) an answer in any order and case is taken, in spec order."""
    out = parse(
        "status_check",
        json.dumps(
            {
                "statuses": [
                    {"id": "c_1", "status": "satisfied", "reason": "b"},
                    {"id": " c_0", "status": "Pending", "reason": "a"},
                ]
            }
        ),
        IDS,
    )
    assert [(e.id, e.status) for e in out.statuses] == [("c_0", "PENDING"), ("c_1", "SATISFIED")]
    for bad, needle in (
        ([{"id": "c_0", "status": "PENDING", "reason": "a"}], "each commitment once"),
        ([{"id": "c_0", "status": "PENDING", "reason": "a"}] * 2, "each commitment once"),
        (
            [{"id": "c_0", "status": "PENDING", "reason": " "}, {"id": "c_1", "status": "PENDING", "reason": "a"}],
            "must not be empty",
        ),
        ([{"id": "c_0", "status": "DONE", "reason": "a"}, {"id": "c_1", "status": "PENDING", "reason": "a"}], "schema"),
    ):
        with pytest.raises(InvalidOutput, match=needle):
            parse("status_check", json.dumps({"statuses": bad}), IDS)


def test_conflict_schema_ties_ids_to_types_with_internal_and_input_ids() -> None:
    schema = schema_for("conflict_check", IDS)
    jsonschema.validate(
        {
            "conflicts": [
                {"type": "fact", "id": "f_3", "reason": "x"},
                {"type": "fact", "id": "response_internal", "reason": "x"},
                {"type": "player_input", "id": "input", "reason": "x"},
                {"type": "player_input", "id": "player_input", "reason": "x"},
            ]
        },
        schema,
    )
    for bad in (
        {"type": "fact", "id": "c_0", "reason": "x"},
        {"type": "commitment", "id": "f_0", "reason": "x"},
        {"type": "commitment", "id": "response_internal", "reason": "x"},
        {"type": "plot", "id": "f_0", "reason": "x"},
        {"type": "fact", "id": "f_0"},
        {"type": "fact", "id": "f_0", "reason": ""},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"conflicts": [bad]}, schema)


def test_player_input_id_is_the_references_either_spelling_accepted() -> None:
    for cid in ("input", "player_input", " input "):
        out = parse(
            "conflict_check", json.dumps({"conflicts": [{"type": "player_input", "id": cid, "reason": "r"}]}), IDS
        )
        assert out.conflicts[0].id == "input"
    internal = parse(
        "conflict_check",
        json.dumps(
            {"conflicts": [{"type": "fact", "id": "response_internal", "reason": "the passage says day, then night"}]}
        ),
        IDS,
    )
    assert internal.counts()["fact"] == 1


def test_no_active_facts_still_offers_internal_contradictions() -> None:
    schema = schema_for("conflict_check", AuditIds(commitment_ids=("c_0",)))
    branches = schema["properties"]["conflicts"]["items"]["anyOf"]
    assert [b["properties"]["type"]["const"] for b in branches] == ["fact", "commitment", "player_input"]
    assert branches[0]["properties"]["id"]["enum"] == ["response_internal"]


def _walk(node: object, found: list[dict]) -> list[dict]:
    if isinstance(node, dict):
        if node.get("type") in ("string", "array"):
            found.append(node)
        for v in node.values():
            _walk(v, found)
    elif isinstance(node, list):
        for v in node:
            _walk(v, found)
    return found


@pytest.mark.parametrize(
    "stage",
    [
        "opening",
        "narrate",
        "fact_update",
        "conflict_check",
        "double_check",
        "trajectory_check",
        "status_check",
        "hiagent_narrate",
        "hiagent_summarize",
    ],
)
def test_tight_bounds_bound_every_string_and_list_and_loose_ones_none(stage: str) -> None:
    """The embedded model's bounds reach every free string and list; unbounded leaves them all open."""
    for node in _walk(schema_for(stage, IDS, TIGHT), []):
        if node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node, (stage, node)
        if node["type"] == "array" and "prefixItems" not in node and "enum" not in node.get("items", {}):
            assert "maxItems" in node, (stage, node)
    loose = json.dumps(schema_for(stage, IDS, UNBOUNDED))
    assert "maxLength" not in loose
    # Only structural limits stay: one status per commitment, each negation id once.
    assert "maxItems" not in loose or stage in ("status_check", "fact_update")


def test_player_regex_only_under_a_bound() -> None:
    assert regex_for("player", TIGHT).endswith(r"[^\n]{0,349}")
    assert regex_for("player", UNBOUNDED) is None


def test_a_long_narration_is_never_cut_under_loose_bounds() -> None:
    long_text = "You walk on. " * 200  # 2,600 characters: past the embedded model's 1,000
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"text": long_text}, schema_for("narrate", bounds=TIGHT))
    jsonschema.validate({"text": long_text}, schema_for("narrate", bounds=UNBOUNDED))
    assert bound_hits("narrate", Narration(text=long_text), UNBOUNDED) == ()
    assert bound_hits("narrate", Narration(text=long_text[:1000]), TIGHT) == ("narrate:text_chars",)


def test_bound_hits_name_each_bound_reached() -> None:
    out = parse(
        "fact_update",
        json.dumps({"add_facts": [f"fact {i}" for i in range(8)], "negate_facts": [], "reason": "r" * 160}),
        IDS,
    )
    assert set(bound_hits("fact_update", out, TIGHT)) == {"fact_update:new_facts", "fact_update:reason_chars"}
    assert bound_hits("fact_update", out, UNBOUNDED) == ()
    nine = schema_for("fact_update", IDS, UNBOUNDED)
    jsonschema.validate({"add_facts": [f"fact {i}" for i in range(9)], "negate_facts": [], "reason": "r"}, nine)


@pytest.mark.parametrize(
    "stage,text,needle",
    [
        ("fact_update", '{"add_facts": [], "negate_facts": [], "reason": ""', "bad JSON"),
        ("fact_update", '{"add_facts": [], "negate_facts": [], "reason": "  "}', "must not be empty"),
        ("fact_update", '["f_0"]', "JSON object"),
        ("conflict_check", '{"conflicts": [{"type": "fact", "id": "f_9", "reason": "r"}]}', "unknown id"),
        (
            "conflict_check",
            '{"conflicts": [{"type": "commitment", "id": "response_internal", "reason": "r"}]}',
            "unknown id",
        ),
        ("conflict_check", '{"conflicts": [], "total_conflict_count": 1}', "does not match"),
        ("status_check", '{"statuses": [{"id": "c_0", "status": "PENDING", "reason": "r"}]}', "each commitment once"),
        ("narrate", '{"text": "   "}', "empty narration"),
        ("narrate", '{"text": "ok", "extra": 1}', "schema"),
        ("player", "   \n", "empty player input"),
        ("player", "Action:", "empty player input"),
        ("player", '""', "empty player input"),
        ("player", "PLAYER:  ''  ", "empty player input"),
    ],
)
def test_invalid_outputs_rejected(stage: str, text: str, needle: str) -> None:
    with pytest.raises(InvalidOutput, match=needle):
        parse(stage, text, IDS)


def test_player_text_keeps_quotes_and_loses_only_a_label() -> None:
    assert parse("player", 'Action: "Open the door," I whisper.') == '"Open the door," I whisper.'
    assert parse("player", '  "I run."  ') == '"I run."'
    assert parse("player", "player: I wait.") == "I wait."


def test_unknown_inactive_and_padded_negations_are_ignored_not_invalid() -> None:
    out = parse(
        "fact_update", json.dumps({"add_facts": [], "negate_facts": ["f_9", " f_0 ", "f_0", "f_1"], "reason": "r"}), IDS
    )
    assert out.negate_facts == ("f_9", "f_0", "f_1")
    facts = (FactEntry(id="f_0", text="a", active=True), FactEntry(id="f_1", text="b", active=False))
    after = apply_update(facts, FactUpdate(negate_facts=out.negate_facts))
    assert [(f.id, f.active) for f in after] == [("f_0", False), ("f_1", False)]


def test_an_update_may_negate_a_fact_it_adds() -> None:
    facts = (FactEntry(id="f_0", text="a", active=True), FactEntry(id="f_1", text="b", active=False))
    new_ids = next_fact_ids(facts, 3)
    assert new_ids == ("f_2", "f_3", "f_4")
    schema = schema_for("fact_update", AuditIds(fact_ids=("f_0",), new_fact_ids=new_ids), TIGHT)
    answer = {"add_facts": ["the door is open", "the lamp is lit"], "negate_facts": ["f_3"], "reason": "r"}
    jsonschema.validate(answer, schema)  # the grammar offers the ids the additions get
    after = apply_update(facts, FactUpdate(add_facts=tuple(answer["add_facts"]), negate_facts=("f_3",)))
    assert [(f.id, f.text, f.active) for f in after][2:] == [
        ("f_2", "the door is open", True),
        ("f_3", "the lamp is lit", False),
    ]


def test_counts_are_derived_and_double_check_semantics() -> None:
    cc = parse(
        "conflict_check",
        json.dumps(
            {
                "conflicts": [
                    {"type": "fact", "id": "f_0", "reason": "a"},
                    {"type": "fact", "id": "f_3", "reason": "b"},
                    {"type": "commitment", "id": "c_1", "reason": "c"},
                ],
                "fact_conflict_count": 2,
                "total_conflict_count": 3,
            }
        ),
        IDS,
    )
    assert cc.counts() == {"fact": 2, "commitment": 1, "player_input": 0, "total": 3}
    assert "fact_conflict_count" not in cc.model_dump()
    overturned = parse(
        "double_check",
        json.dumps(
            {"conflicts": [{"type": "fact", "id": "f_0", "reason": "a"}], "confirmed": False, "review_reason": "no"}
        ),
        IDS,
    )
    assert overturned.standing() == ()
    empty_confirmed = parse(
        "double_check", json.dumps({"conflicts": [], "confirmed": True, "review_reason": "none"}), IDS
    )
    assert empty_confirmed.standing() == ()
    kept = parse(
        "double_check",
        json.dumps(
            {
                "conflicts": [{"type": "commitment", "id": "c_0", "reason": "a"}],
                "confirmed": True,
                "review_reason": "yes",
            }
        ),
        IDS,
    )
    assert [c.id for c in kept.standing()] == ["c_0"]


def test_an_answer_past_its_bound_is_invalid_whichever_backend_made_it() -> None:
    """A backend without the bound in its grammar (outlines, an endpoint) is held to it after parsing."""
    over = Narration(text="x" * 1001)
    with pytest.raises(InvalidOutput, match="text_chars 1001 is over its bound 1000"):
        check_bounds("narrate", over, TIGHT)
    check_bounds("narrate", Narration(text="x" * 1000), TIGHT)
    check_bounds("narrate", over, UNBOUNDED)
    nine = parse(
        "fact_update", json.dumps({"add_facts": [f"f {i}" for i in range(9)], "negate_facts": [], "reason": "r"}), IDS
    )
    with pytest.raises(InvalidOutput, match="new_facts 9"):
        check_bounds("fact_update", nine, TIGHT)
