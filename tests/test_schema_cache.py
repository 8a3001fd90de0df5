"""stages.schema_for keeps the schemas it built: a call gets what building it anew gives, whatever
was asked before, and calls that offer the same names share one schema."""

from __future__ import annotations

import json
import random
from itertools import product
from typing import Any

from ncp_local.protocol.stages import ID_FORMS, STAGES, TIGHT, UNBOUNDED, AuditIds, schema_for
from ncp_local.protocol.stages._schema import _SCHEMAS, _Schemas, build_schema


def _ids(rng: random.Random) -> AuditIds:
    def some(prefix: str) -> tuple[str, ...]:
        return tuple(f"{prefix}{i}" for i in sorted(rng.sample(range(40), rng.randrange(0, 5))))

    return AuditIds(
        fact_ids=some("f_"),
        commitment_ids=some("c_"),
        retrievable=tuple(sorted(rng.sample(range(6), rng.randrange(0, 3)))),
        new_fact_ids=some("f_"),
        conflict_keys=some("fact:f_"),
    )


def test_every_stage_gets_what_building_anew_gives_whatever_came_before() -> None:
    rng = random.Random(67)
    calls = [
        (stage, _ids(rng), bounds, form)
        for stage, bounds, form in product([s for s in STAGES if STAGES[s].json], (TIGHT, UNBOUNDED), ID_FORMS)
        for _ in range(12)
    ]
    for _ in range(3):  # in three orders: each call then finds the schemas of others before it
        rng.shuffle(calls)
        for call in calls:
            # As text: key order matters (the grammar and the scripted engine read the schema).
            assert json.dumps(schema_for(*call)) == json.dumps(build_schema(*call)), call


def test_calls_offering_the_same_names_share_one_schema() -> None:
    a = AuditIds(fact_ids=("f_0", "f_1"), commitment_ids=("c_0", "c_1"))
    b = AuditIds(fact_ids=("f_0", "f_1", "f_2"), commitment_ids=("c_0", "c_1"))
    # status_check names commitments only: a new fact changes nothing.
    assert schema_for("status_check", a, TIGHT) is schema_for("status_check", b, TIGHT)
    assert schema_for("conflict_check", a, TIGHT) is not schema_for("conflict_check", b, TIGHT)
    assert schema_for("status_check", a, TIGHT) is not schema_for("status_check", a, UNBOUNDED)
    assert schema_for("narrate", a, TIGHT) is schema_for("narrate", AuditIds(), TIGHT)


def test_the_least_recently_asked_for_leaves_first() -> None:
    kept = _Schemas(2)
    model = STAGES["conflict_check"].output
    assert model is not None
    one, two, three = (AuditIds(fact_ids=(f"f_{i}",)) for i in range(3))

    def get(ids: AuditIds) -> dict[str, Any]:
        return kept.get(model, ids, TIGHT, "enum")

    first, second = get(one), get(two)
    assert get(one) is first  # asked for again: now the most recent
    get(three)  # two leaves
    assert get(one) is first and get(two) is not second
    assert len(kept._held) == 2 and _SCHEMAS.kept >= 256
