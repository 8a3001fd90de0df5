"""Each structured-output backend gets a schema it can compile (offline: no engine), and the contract holds."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ncp_local.engines.grammar import BACKENDS, adapt_schema, unsupported
from ncp_local.protocol.stages import TIGHT, UNBOUNDED, AuditIds, InvalidOutput, parse, schema_for

IDS = AuditIds(fact_ids=("f_0", "f_1"), commitment_ids=("c_0", "c_1"), retrievable=(0,), new_fact_ids=("f_2",))
STAGES = ("opening", "narrate", "fact_update", "conflict_check", "double_check", "trajectory_check", "status_check",
          "hiagent_narrate", "hiagent_summarize", "build_trajectory", "build_commitments", "build_facts")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_stage_schema_compiles_for_every_backend(backend: str) -> None:
    for bounds in (TIGHT, UNBOUNDED):
        problems = {s: unsupported(schema_for(s, IDS, bounds), backend) for s in STAGES}
        assert not any(problems.values()), problems


def test_outlines_loses_item_counts_keeps_string_bounds_the_others_keep_all() -> None:
    schema = schema_for("conflict_check", IDS, TIGHT)
    assert adapt_schema(schema, "xgrammar") is schema and adapt_schema(schema, "guidance") is schema
    adapted = adapt_schema(schema, "outlines")
    assert "maxItems" not in json.dumps(adapted) and 160 in counted(adapted)
    # Unadapted, the 6 conflicts multiply the regex six times over.
    assert len(json.dumps(counted(schema))) >= len(json.dumps(counted(adapted)))
    narration = adapt_schema(schema_for("hiagent_narrate", IDS, TIGHT), "outlines")["properties"]
    assert narration["text"]["maxLength"] == 1000 and narration["subgoal"]["maxLength"] == 200


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
    two_orderings = {"commitments": [
        {"type": "ordering", "description": "d", "satisfaction_condition": "s", "violation_condition": "v"},
        {"type": "achievement", "description": "d", "satisfaction_condition": "s", "violation_condition": "v"}]}
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
