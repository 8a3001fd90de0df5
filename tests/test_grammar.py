"""Each structured-output backend gets a schema it can compile (offline: no engine), and the contract holds."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncp_local.engines.grammar import BACKENDS, adapt_schema, unsupported
from ncp_local.protocol.stages import TIGHT, UNBOUNDED, AuditIds, InvalidOutput, check_bounds, parse, schema_for

IDS = AuditIds(
    fact_ids=("f_0", "f_1"),
    commitment_ids=("c_0", "c_1"),
    retrievable=(0,),
    new_fact_ids=("f_2",),
    conflict_keys=("fact:f_0", "player_input:input"),
)
STAGES = (
    "opening",
    "narrate",
    "fact_update",
    "conflict_check",
    "double_check",
    "trajectory_check",
    "status_check",
    "hiagent_narrate",
    "hiagent_summarize",
    "build_trajectory",
    "build_commitments",
    "build_facts",
)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.engine_libs
def test_every_stage_schema_compiles_for_every_backend(backend: str) -> None:
    for bounds in (TIGHT, UNBOUNDED):
        problems = {s: unsupported(schema_for(s, IDS, bounds), backend) for s in STAGES}
        assert not any(problems.values()), problems


@pytest.mark.engine_libs
def test_outlines_keeps_item_counts_and_string_bounds_guidance_gets_the_schema_as_is() -> None:
    schema = schema_for("conflict_check", IDS, TIGHT, "pattern")
    assert adapt_schema(schema, "guidance") is schema
    adapted = adapt_schema(schema, "outlines")
    assert adapted["properties"]["conflicts"]["maxItems"] == 6
    # 6 conflicts: the first and up to 5 more; each reason a first character and up to 159 more.
    assert {5, 159} <= set(counted(adapted))
    narration = adapt_schema(schema_for("hiagent_narrate", IDS, TIGHT), "outlines")["properties"]
    assert narration["text"]["pattern"].endswith("{0,999}") and narration["subgoal"]["pattern"].endswith("{0,199}")
    assert "maxLength" not in narration["text"] and "minLength" not in narration["text"]


def test_xgrammar_free_text_keeps_only_a_set_maximum() -> None:
    """xgrammar writes no escape in a string with a pattern or a length bound: free text keeps only
    the role's maxLength (none under experiment=paper), so unbounded narrations keep quotes and newlines."""
    reason = adapt_schema(schema_for("trajectory_check", IDS, TIGHT), "xgrammar")["properties"]["trigger"]
    assert reason["properties"]["reason"] == {"type": "string", "maxLength": 160}
    unbounded = adapt_schema(schema_for("trajectory_check", IDS, UNBOUNDED), "xgrammar")["properties"]["trigger"]
    assert unbounded["properties"]["reason"] == {"type": "string"}
    # The schema the answer is checked against keeps its non-blank rule.
    assert "pattern" in schema_for("trajectory_check", IDS, UNBOUNDED)["properties"]["trigger"]["properties"]["reason"]


@pytest.mark.parametrize("stage", ("fact_update", "conflict_check", "double_check", "status_check"))
def test_outlines_audit_schemas_are_the_same_call_after_call(stage: str) -> None:
    """Ids as patterns: the state under audit grows (facts added, negated, new ids) and the
    schema does not, so vLLM compiles it once; as enums it changes with every fact."""
    early = AuditIds(fact_ids=("f_0", "f_1", "f_2"), commitment_ids=("c_0", "c_1"), new_fact_ids=("f_3",))
    later = AuditIds(
        fact_ids=("f_1", "f_2", "f_5", "f_11", "f_12"), commitment_ids=("c_0", "c_1"), new_fact_ids=("f_13", "f_14")
    )
    assert schema_for(stage, early, TIGHT, "pattern") == schema_for(stage, later, TIGHT, "pattern")
    if stage != "status_check":  # one entry per commitment: the same either way
        assert schema_for(stage, early, TIGHT) != schema_for(stage, later, TIGHT)


def test_negations_are_capped_by_the_bound_and_under_enums_by_the_ids() -> None:
    ids = AuditIds(fact_ids=tuple(f"f_{i}" for i in range(12)))
    negations = lambda form, b: schema_for("fact_update", ids, b, form)["properties"]["negate_facts"]  # noqa: E731
    assert negations("enum", TIGHT)["maxItems"] == 8 and negations("enum", UNBOUNDED)["maxItems"] == 12
    assert negations("pattern", TIGHT)["maxItems"] == 8 and "maxItems" not in negations("pattern", UNBOUNDED)
    assert negations("pattern", TIGHT)["items"] == {"type": "string", "pattern": "^(f_[0-9]+)$"}
    with pytest.raises(InvalidOutput, match="negations 9 is over its bound 8"):
        check_bounds(
            "fact_update",
            parse(
                "fact_update",
                json.dumps({"add_facts": [], "negate_facts": [f"f_{i}" for i in range(9)], "reason": "r"}),
                ids,
            ),
            TIGHT,
        )


def test_an_id_of_the_right_shape_that_does_not_exist_is_an_invalid_attempt() -> None:
    answer = {"conflicts": [{"type": "fact", "id": "f_99", "reason": "r"}]}
    schema = schema_for("conflict_check", IDS, TIGHT, "pattern")
    jsonschema.validate(answer, schema)  # the pattern admits it ...
    with pytest.raises(InvalidOutput, match="unknown id 'f_99'"):  # ... the parser does not
        parse("conflict_check", json.dumps(answer), IDS)


def counted(schema: dict) -> list[int]:
    import re

    import outlines_core.json_schema as outlines_schema

    regex = outlines_schema.build_regex_from_schema(json.dumps(schema))
    return sorted({int(m.group(2)) for m in re.finditer(r"\{(\d+),(\d+)\}", regex)})


def test_outlines_prefix_items_become_any_item_and_the_rest_is_checked_after_parsing() -> None:
    original = schema_for("build_commitments", IDS, TIGHT)
    adapted = adapt_schema(original, "outlines")
    items = adapted["properties"]["commitments"]
    assert "prefixItems" not in items and len(items["items"]["anyOf"]) == 2
    two_orderings = {
        "commitments": [
            {"type": "ordering", "description": "d", "satisfaction_condition": "s", "violation_condition": "v"},
            {"type": "achievement", "description": "d", "satisfaction_condition": "s", "violation_condition": "v"},
        ]
    }
    jsonschema.validate(two_orderings, adapted)  # admitted by the adapted grammar ...
    assert len(parse("build_commitments", json.dumps(two_orderings)).commitments) == 2  # ... and by the contract
    one = {"commitments": two_orderings["commitments"][:1]}
    with pytest.raises(InvalidOutput, match="expected 2 to 12"):
        parse("build_commitments", json.dumps(one))
    # The status check's exact sequence (prefixItems, no further items) is kept as it is.
    status = schema_for("status_check", IDS, TIGHT)
    assert adapt_schema(status, "outlines")["properties"]["statuses"]["prefixItems"]


def test_unknown_backend_is_named() -> None:
    assert "unknown structured-output backend 'lmfe'" in unsupported(schema_for("narrate"), "lmfe")
