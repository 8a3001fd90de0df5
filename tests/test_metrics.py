"""PROTOCOL section 5: metrics from final committed state, hand-computed."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from helpers import first_check, make_spec
from ncp_local.protocol import ledger
from ncp_local.protocol.metrics import (
    TABLE_HEADER,
    aggregate,
    episode_metrics,
    km_survival,
    opening_bound_hits,
    restricted_mean,
    restricted_mean_point,
    results_table,
    survival,
    turn_bound_hits,
)
from ncp_local.protocol.records import ConflictRecord, EpisodeResult, FactUpdateRecord, TurnRecord


def _result(
    sid: str,
    termination: str,
    n_turns: int,
    nodes: tuple[bool, ...] = (False,),
    sat: int = 0,
    conflicts: tuple[tuple[str, str], ...] = (),
    max_turns: int = 4,
    bound_hits: dict[int, tuple[str, ...]] | None = None,
) -> EpisodeResult:
    spec = make_spec(sid, n_nodes=len(nodes), types=("ordering", "achievement", "invariant", "achievement"))
    state = ledger.initial_state(spec).model_copy(
        update={
            "node_occurred": nodes,
            "statuses": tuple((f"c_{i}", "satisfied" if i < sat else "pending") for i in range(4)),
        }
    )
    fu = FactUpdateRecord(add_facts=(), negate_facts=(), reason="")
    turns = [
        TurnRecord(
            turn=t,
            player_input="p",
            response="r",
            fact_update=fu,
            conflict_check=first_check(),
            double_check=None,
            conflicts=(),
        )
        for t in range(n_turns)
    ]
    if conflicts:
        turns[-1] = turns[-1].model_copy(
            update={"conflicts": tuple(ConflictRecord(type=c, id=i, reason="") for c, i in conflicts)}
        )
    for t, hits in (bound_hits or {}).items():
        # `bound_hits` is read with a default (records written before it have none), so set it as a
        # record that has it would carry it.
        turns[t] = turns[t].model_copy(update={"bound_hits": hits})
    return EpisodeResult(
        spec_id=sid,
        termination=termination,
        opening="o",
        opening_update=fu,
        turns=tuple(turns),
        final_state=state,
        max_turns=max_turns,
    )


def test_episode_and_aggregate_metrics() -> None:
    results = [
        _result("a", "conflict", 2, (True, False), 1, (("fact", "f_0"), ("commitment", "c_1"))),
        _result("b", "max_turns", 4, (True, True), 2),
        _result("c", "conflict", 1, (False, False), 0, (("player_input", "player_input"),)),
        _result("d", "invalid", 3, (True, False), 4),
    ]
    ms = [episode_metrics(r) for r in results]
    assert (ms[0].turns, ms[0].trajectory_progress, ms[0].satisfied) == (2, 0.5, 0.25)
    assert (ms[0].fact, ms[0].commitment, ms[0].player_input) == (True, True, False)
    agg = aggregate(ms, max_turns=4)
    assert agg.episodes == 4 and agg.scored == 3 and agg.censored == 0  # invalid kept apart
    assert agg.avg_turns == pytest.approx(7 / 3)
    assert agg.trajectory_pct == pytest.approx(100 * (0.5 + 1 + 0) / 3)
    assert agg.satisfied_pct == pytest.approx(100 * (0.25 + 0.5 + 0) / 3)
    assert (agg.fact_pct, agg.commitment_pct, agg.player_input_pct) == pytest.approx((100 / 3, 100 / 3, 100 / 3))
    assert agg.conflict_free == 1
    assert agg.terminations == {"conflict": 2, "max_turns": 1, "all_resolved": 0, "context_limit": 0, "invalid": 1}
    assert agg.survival == pytest.approx((1, 1, 2 / 3, 1 / 3, 1 / 3))


def test_survival_edges() -> None:
    assert survival([0, 3], 3) == (1.0, 0.5, 0.5, 0.5)
    assert survival([], 2) == (0.0, 0.0, 0.0)
    assert km_survival([], [], 2).s == (0.0, 0.0, 0.0)
    # Only censored episodes: nothing ended and S stays 1, but its band is no point: no ending among the r
    # at risk of turn t - 1's endings bounds S(t) below by the exact 0-of-r bound, 0.025^(1/r) (2, 2, then 1).
    only = km_survival([1, 2], [True, True], 3)
    assert only.s == only.hi == (1.0, 1.0, 1.0, 1.0)
    assert only.lo == pytest.approx((1.0, 0.025**0.5, 0.025**0.5, 0.025))
    # With several plays a story, the stories at risk bound it (both stories have a play of 2 turns: r = 2).
    two = km_survival([1, 2, 1, 2], [True] * 4, 3, stories=["a", "a", "b", "b"], resamples=50)
    assert two.s == two.hi == (1.0, 1.0, 1.0, 1.0)
    assert two.lo == pytest.approx((1.0, 0.025**0.5, 0.025**0.5, 0.025**0.5))
    with pytest.raises(ValueError, match="differ in length"):
        km_survival([1], [], 2)


def test_kaplan_meier_by_hand() -> None:
    """Five episodes of 2, 3 (censored), 3, 5 (censored) and 7 turns; S(t) = P(T >= t).

    A censored episode of n turns had turn n under way: T > n, so it is at
    risk at every ending time <= n. Product-limit over the ending times
    (an episode ending at T is still counted in S(T), gone from S(T + 1)):
      T = 2: at risk 5 (all), 1 ends -> 1 * (1 - 1/5) = 0.8   = S(3)
      T = 3: at risk 4 (3c, 3, 5c, 7), 1 ends -> 0.8 * (1 - 1/4) = 0.6   = S(4)
             3c leaves the risk set after T = 3
      T = 5: only 5c, censored: no step (S(6) = 0.6); at risk after it: the 7
      T = 7: at risk 1, 1 ends -> 0.6 * (1 - 1/1) = 0   = S(8)
    Hence S(0..8) = 1, 1, 1, 0.8, 0.6, 0.6, 0.6, 0.6, 0.
    """
    turns = [2, 3, 3, 5, 7]
    censored = [False, True, False, True, False]
    curve = km_survival(turns, censored, 8)
    assert curve.s == pytest.approx((1, 1, 1, 0.8, 0.6, 0.6, 0.6, 0.6, 0.0), abs=1e-12)
    # Read as ending there (no censoring), the share of turns >= t is lower from t = 4 on.
    assert survival(turns, 8) == pytest.approx((1, 1, 1, 0.8, 0.4, 0.4, 0.2, 0.2, 0.0))

    # The band, Greenwood on the log-log scale: V = sum d / (n (n - d)) over the steps so far,
    # se = sqrt(V) / |ln S|, band = S ** exp(+-z se).
    z = 1.959963984540054

    def band(s: float, v: float) -> tuple[float, float]:
        se = math.sqrt(v) / abs(math.log(s))
        return s ** math.exp(z * se), s ** math.exp(-z * se)

    v2 = 1 / (5 * 4)
    v3 = v2 + 1 / (4 * 3)
    assert (curve.lo[3], curve.hi[3]) == pytest.approx(band(0.8, v2), rel=1e-9)
    for t in (4, 5, 6, 7):
        assert (curve.lo[t], curve.hi[t]) == pytest.approx(band(0.6, v3), rel=1e-9)
    # Undefined where nothing ended yet (S = 1) or everyone at risk ended (S = 0): never the point itself, but
    # the exact bound of r of r at risk. S(1), S(2): 5 at risk, none ended, so S >= 0.025^(1/5). S(8): the
    # one at risk of turn 7 ended, so S(8) <= S(7)'s top * (1 - 0.025^(1/1)).
    assert curve.hi[:3] == (1.0, 1.0, 1.0) and curve.lo[0] == 1.0
    assert curve.lo[1:3] == pytest.approx((0.025**0.2, 0.025**0.2))
    assert (curve.lo[8], curve.hi[8]) == pytest.approx((0.0, curve.hi[7] * 0.975))
    for lo, s, hi in zip(curve.lo, curve.s, curve.hi, strict=True):
        assert 0 <= lo <= s <= hi <= 1


def test_kaplan_meier_without_censoring_is_the_protocol_share() -> None:
    rng = random.Random(3)
    for _ in range(50):
        max_turns = rng.randint(1, 12)
        turns = [rng.randint(0, max_turns) for _ in range(rng.randint(1, 30))]
        assert km_survival(turns, [False] * len(turns), max_turns).s == pytest.approx(
            survival(turns, max_turns), abs=1e-12
        )


def test_context_limit_is_censored_and_counted() -> None:
    results = [
        _result("a", "conflict", 2, conflicts=(("fact", "f_0"),), max_turns=8),
        _result("b", "context_limit", 3, max_turns=8),
        _result("c", "conflict", 3, conflicts=(("commitment", "c_0"),), max_turns=8),
        _result("d", "context_limit", 5, max_turns=8),
        _result("e", "max_turns", 7, max_turns=7),  # T = 7 observed: a finished story ends
        _result("f", "invalid", 4, max_turns=8),
    ]
    agg = aggregate([episode_metrics(r) for r in results], max_turns=8)
    assert (agg.episodes, agg.scored, agg.censored) == (6, 5, 2)
    assert agg.terminations["context_limit"] == 2 and agg.terminations["invalid"] == 1
    assert agg.avg_turns == pytest.approx((2 + 3 + 3 + 5 + 7) / 5)  # censored ones at their committed turns
    assert agg.conflict_free == 3
    assert agg.survival == pytest.approx((1, 1, 1, 0.8, 0.6, 0.6, 0.6, 0.6, 0.0), abs=1e-12)
    table = results_table([("run-x", agg)])
    assert "| context_limit |" in table.splitlines()[0]
    assert "| run-x | 6 | 4.00 |" in table and "| 3 | 2 | 1 | 0 | 2 | 1 | 0 |" in table
    assert "run-x: 2 of 5 scored episode(s) censored (context_limit)" in table


def test_conflict_ids_of_the_reference() -> None:
    internal = episode_metrics(_result("a", "conflict", 1, conflicts=(("fact", "response_internal"),)))
    assert (internal.fact, internal.commitment, internal.player_input) == (True, False, False)
    for pid in ("input", "player_input"):
        m = episode_metrics(_result("b", "conflict", 2, conflicts=(("player_input", pid),)))
        assert (m.fact, m.commitment, m.player_input) == (False, False, True)


def test_bound_hits_counted_per_episode_and_run() -> None:
    hit = _result(
        "a",
        "max_turns",
        3,
        bound_hits={0: ("narrate:text_chars",), 2: ("fact_update:add_facts_items", "narrate:text_chars")},
    )
    old = _result("b", "max_turns", 3)  # a record without the field
    ms = [episode_metrics(hit), episode_metrics(old)]
    assert [m.bound_hits for m in ms] == [3, 0]
    agg = aggregate(ms, max_turns=4)
    assert agg.bound_hits == 3
    assert results_table([("r", agg)]).splitlines()[2].endswith("| 3 |")


def test_restricted_mean_by_hand() -> None:
    """The area under S(t) of test_kaplan_meier_by_hand: S(1..8) = 1, 1, 0.8, 0.6, 0.6, 0.6, 0.6, 0.

    Turns are whole, so the area from 0 to a horizon h is S(1) + ... + S(h): 5.2 to 8 turns, 3.4 to
    4; past the last observed turn S stays 0, so a horizon of 12 adds nothing. avg turns is
    (2 + 3 + 3 + 5 + 7) / 5 = 4.0: the two censored episodes' unseen turns are what it leaves out.
    """
    turns = [2, 3, 3, 5, 7]
    censored = [False, True, False, True, False]
    assert restricted_mean(turns, censored, 8).value == pytest.approx(5.2)
    assert restricted_mean(turns, censored, 4).value == pytest.approx(3.4)
    assert restricted_mean(turns, censored, 12).value == pytest.approx(5.2)
    assert restricted_mean(turns, censored, 0).value == 0.0
    rm = restricted_mean(turns, censored, 8, resamples=400)
    assert rm.horizon == 8
    assert rm.lo <= rm.value <= rm.hi and rm.lo < rm.hi
    assert restricted_mean([], [], 8) == type(rm)(0.0, 0.0, 0.0, 8)
    with pytest.raises(ValueError, match="differ in length"):
        restricted_mean([1, 2], [False], 4)


def test_restricted_mean_matches_lifelines() -> None:
    """lifelines' RMST (the integral of its Kaplan-Meier step function) is the oracle."""
    from lifelines import KaplanMeierFitter
    from lifelines.utils import restricted_mean_survival_time

    rng = random.Random(58)
    for _ in range(40):
        max_turns = rng.randint(2, 30)
        n = rng.randint(1, 25)
        turns = [rng.randint(0, max_turns) for _ in range(n)]
        censored = [rng.random() < 0.35 for _ in range(n)]
        horizon = rng.randint(1, max_turns)
        kmf = KaplanMeierFitter().fit(turns, event_observed=[not c for c in censored])
        want = restricted_mean_survival_time(kmf, t=horizon)
        rm = restricted_mean(turns, censored, horizon, resamples=1)
        if rm.known_to < 0:
            assert rm.value == pytest.approx(want, abs=1e-9)
        else:  # past the data: lifelines carries the curve flat, the most the area can be
            assert math.isnan(rm.value) and rm.hi == pytest.approx(want, abs=1e-9) and rm.lo <= want


def test_restricted_mean_uncensored_is_avg_turns_and_its_band_the_mean_bootstrap() -> None:
    """No censoring, horizon at the cap: the restricted mean is avg turns, draw by draw."""
    from ncp_local.protocol.resample import clusters, draws, few_stories_factor, percentile

    rng = random.Random(5)
    turns = [rng.randint(1, 20) for _ in range(30)]
    rm = restricted_mean(turns, [False] * 30, 20, resamples=300, seed=4)
    assert rm.value == pytest.approx(sum(turns) / 30)
    arr = np.asarray(turns, dtype=float)
    means = np.asarray([arr[i].mean() for i in draws(clusters([str(i) for i in range(30)]), 300, 4)])
    lo, hi = percentile(means, 0.95)
    # The mean's bootstrap band, widened for 30 stories (few_stories_factor) around the mean.
    f, mean = few_stories_factor(30, 0.95), sum(turns) / 30
    assert (rm.lo, rm.hi) == pytest.approx((mean - f * (mean - float(lo)), mean + f * (float(hi) - mean)))


def test_restricted_mean_band_draws_stories_with_their_plays() -> None:
    """Four plays of each of 10 stories, plays of a story alike: the band is that of 10 stories, not 40."""
    rng = random.Random(9)
    per_story = [rng.randint(1, 30) for _ in range(10)]
    turns = [t for t in per_story for _ in range(4)]
    stories = [f"s{i}" for i in range(10) for _ in range(4)]
    clustered = restricted_mean(turns, [False] * 40, 30, stories=stories, resamples=1000)
    as_episodes = restricted_mean(turns, [False] * 40, 30, resamples=1000)
    once = restricted_mean(per_story, [False] * 10, 30, resamples=1000)
    assert clustered.value == pytest.approx(once.value)
    width = clustered.hi - clustered.lo
    # Taken as 40 independent episodes the band is about half as wide (1/sqrt(4)).
    assert as_episodes.hi - as_episodes.lo < 0.7 * width
    assert width == pytest.approx(once.hi - once.lo, rel=0.25)


def test_restricted_mean_band_is_the_story_percentile_band_widened_for_few_stories() -> None:
    """12 stories of 3 plays, two censored: each end of the band sits few_stories_factor(12) times as far from
    the point as the stories' percentile band's; the same plays as 36 single-play stories, factor(36) times."""
    from ncp_local.protocol.resample import clusters, draws, few_stories_factor, percentile

    turns = [1 + (3 * s + p) % 6 for s in range(12) for p in range(3)]
    cens = [i in (4, 20) for i in range(36)]
    names = [f"s{s}" for s in range(12) for _ in range(3)]
    t_arr, ended = np.asarray(turns), 1.0 - np.asarray(cens, dtype=float)

    def plain(groups: list[str]) -> tuple[float, float]:
        vals = [restricted_mean_point(t_arr[i], ended[i], 6) for i in draws(clusters(groups), 300, 2)]
        lo, hi = percentile(np.asarray(vals), 0.95)
        return float(lo), float(hi)

    rm = restricted_mean(turns, cens, 6, 0.95, names, resamples=300, seed=2)
    lo, hi = plain(names)
    factor = few_stories_factor(12, 0.95)
    assert factor > 1.1
    assert rm.value - rm.lo == pytest.approx(factor * (rm.value - lo))
    assert rm.hi - rm.value == pytest.approx(factor * (hi - rm.value))
    single = restricted_mean(turns, cens, 6, 0.95, [str(i) for i in range(36)], resamples=300, seed=2)
    lo1, hi1 = plain([str(i) for i in range(36)])
    f1 = few_stories_factor(36, 0.95)
    assert single.value == rm.value
    assert (single.lo, single.hi) == pytest.approx((rm.value - f1 * (rm.value - lo1), rm.value + f1 * (hi1 - rm.value)))
    # Widening never takes the band past what a restricted mean can be: 0 to the horizon.
    two = restricted_mean([1, 6], [False, False], 6, 0.95, ["a", "b"], resamples=200, seed=0)
    assert (two.lo, two.hi) == (0.0, 6.0)  # unclipped: 3.5 -+ 9.2 x 2.5


def test_an_empty_state_a_trial_and_the_opening_hits_reach_the_metrics() -> None:
    # No nodes and no commitments: both shares are 0, not a division by zero nor 1.
    r = _result("e", "max_turns", 2)
    r = r.model_copy(
        update={
            "final_state": r.final_state.model_copy(update={"node_occurred": (), "statuses": ()}),
            "trial": 2,
            "opening_bound_hits": ("opening:text_chars",),
        }
    )
    m = episode_metrics(r)
    assert (m.spec_id, m.trial, m.trajectory_progress, m.satisfied, m.bound_hits) == ("e", 2, 0.0, 0.0, 1)
    # A record written before the fields existed has none, and the readers say so rather than fail.
    assert opening_bound_hits(object()) == () and turn_bound_hits(object()) == ()
    assert opening_bound_hits(r) == ("opening:text_chars",)
    # Nothing scored: the averages are 0, not an error.
    agg = aggregate([episode_metrics(_result("x", "invalid", 1))], max_turns=4)
    assert (agg.scored, agg.avg_turns, agg.trajectory_pct, agg.fact_pct) == (0, 0.0, 0.0, 0.0)


def test_results_table_layout_and_its_censoring_note() -> None:
    ms = [episode_metrics(_result("a", "context_limit", 2)), episode_metrics(_result("b", "conflict", 3))]
    lines = results_table([("r", aggregate(ms, max_turns=4))]).split("\n")
    columns = TABLE_HEADER.count("|") - 1
    assert lines[0] == TABLE_HEADER and lines[1] == "|---|" + "---:|" * (columns - 1)
    assert lines[2].startswith("| r | 2 | 2.50 |")
    assert lines[3:] == [
        "r: 1 of 2 scored episode(s) censored (context_limit): averaged at their committed turns (a lower bound); "
        "S(t) is the Kaplan-Meier estimate with them censored"
    ]
    # No censoring, no note.
    assert len(results_table([("r", aggregate(ms[1:], max_turns=4))]).split("\n")) == 3


def test_length_mismatches_are_named() -> None:
    with pytest.raises(ValueError, match="^km_survival: turns and censored differ in length$"):
        km_survival([1, 2], [False], 4)
    with pytest.raises(ValueError, match="^restricted_mean: turns and censored differ in length$"):
        restricted_mean([1, 2], [False], 4)
    with pytest.raises(ValueError, match="^restricted_mean: horizon -1 is negative$"):
        restricted_mean([1], [False], -1)


def test_past_the_last_turn_anyone_was_watched_s_has_no_lower_bound_but_0() -> None:
    # Four single plays: ends at 2, censored at 3, ends at 3, censored at 5; max_turns = 8. S(t) = 3/4 from
    # t = 3, 1/2 from t = 4 on; the last play watched is the one censored at 5 (at risk of turn 5's endings).
    # From t = 7 no one was at risk at turn t - 1: S(7) and S(8) carry 1/2 on, and the lower limit is 0
    # (either story censored might have ended since); the upper limit is the band's as carried on.
    curve = km_survival([2, 3, 3, 5], [False, True, False, True], 8)
    assert curve.s[4:] == pytest.approx((0.5,) * 5)
    assert 0 < curve.lo[6] < 0.5 and curve.lo[7] == curve.lo[8] == 0.0
    assert curve.hi[7] == curve.hi[8] == curve.hi[6] and curve.hi[6] > 0.5
    # The same with several plays a story: the stories at risk count. With six more stories watched to the turn
    # limit someone is at risk, and the lower limit carries on with the point.
    names = ["a", "b", "a", "b"]
    clustered = km_survival([2, 3, 3, 5], [False, True, False, True], 8, stories=names, resamples=200)
    assert clustered.lo[7] == clustered.lo[8] == 0.0
    more = [f"s{i // 2}" for i in range(12)]  # six stories of two plays each, all reaching the turn limit
    watched = km_survival([2, 3, 3, 5, *[8] * 12], [False, True, False, True, *[True] * 12], 8, stories=names + more)
    assert watched.lo[8] == watched.lo[7] == watched.lo[6] > 0
