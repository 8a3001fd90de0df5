"""PROTOCOL section 5: metrics from final committed state, hand-computed."""

from __future__ import annotations

import pytest
from helpers import make_spec

from ncp_local import ledger
from ncp_local.episode import EpisodeResult, FactUpdateRecord, TurnRecord
from ncp_local.metrics import aggregate, episode_metrics, survival


def _result(sid: str, termination: str, n_turns: int, nodes: tuple[bool, ...], sat: int,
            conflict_types: tuple[str, ...] = ()) -> EpisodeResult:
    spec = make_spec(sid, n_nodes=len(nodes), types=("ordering", "achievement", "invariant", "achievement"))
    state = ledger.initial_state(spec).model_copy(update={
        "node_occurred": nodes,
        "statuses": tuple((f"c_{i}", "satisfied" if i < sat else "pending") for i in range(4))})
    fu = FactUpdateRecord(add_facts=(), negate_facts=(), reason="")
    turns = [TurnRecord(turn=t, player_input="p", response="r", fact_update=fu, conflict_check={"conflicts": []},
                        double_check=None, conflicts=()) for t in range(n_turns)]
    if conflict_types:
        turns[-1] = turns[-1].model_copy(update={"conflicts": tuple({"type": c, "id": "x", "reason": ""}
                                                                    for c in conflict_types)})
    return EpisodeResult(spec_id=sid, termination=termination, opening="o", opening_update=fu, turns=tuple(turns),
                         final_state=state, max_turns=4)


def test_episode_and_aggregate_metrics() -> None:
    results = [
        _result("a", "conflict", 2, (True, False), 1, ("fact", "commitment")),
        _result("b", "max_turns", 4, (True, True), 2),
        _result("c", "conflict", 1, (False, False), 0, ("player_input",)),
        _result("d", "invalid", 3, (True, False), 4),
    ]
    ms = [episode_metrics(r) for r in results]
    assert (ms[0].turns, ms[0].trajectory_progress, ms[0].satisfied) == (2, 0.5, 0.25)
    assert (ms[0].fact, ms[0].commitment, ms[0].player_input) == (True, True, False)
    agg = aggregate(ms, max_turns=4)
    assert agg.episodes == 4 and agg.scored == 3  # invalid kept apart
    assert agg.avg_turns == pytest.approx(7 / 3)
    assert agg.trajectory_pct == pytest.approx(100 * (0.5 + 1 + 0) / 3)
    assert agg.satisfied_pct == pytest.approx(100 * (0.25 + 0.5 + 0) / 3)
    assert (agg.fact_pct, agg.commitment_pct, agg.player_input_pct) == pytest.approx((100 / 3, 100 / 3, 100 / 3))
    assert agg.conflict_free == 1
    assert agg.terminations == {"conflict": 2, "max_turns": 1, "all_resolved": 0, "invalid": 1}
    assert agg.survival == pytest.approx((1, 1, 2 / 3, 1 / 3, 1 / 3))


def test_survival_edges() -> None:
    assert survival([0, 3], 3) == (1.0, 0.5, 0.5, 0.5)
    assert survival([], 2) == (0.0, 0.0, 0.0)
