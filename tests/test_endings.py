"""What ended each story (report/endings.py): Aalen-Johansen cumulative incidence per ending.

A six-episode fixture with ties and censoring is worked out by hand below; a scripted run of the
official dataset checks that the endings and S(t) add up to 1 at every turn, in the report's files.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ncp_local.protocol.metrics import ENDINGS, EpisodeMetrics, km_survival
from ncp_local.report import build_report, load_runs
from ncp_local.report.endings import band_labels, cumulative_incidence, effective_band, endings_by_band
from ncp_local.report.runs import attach_specs


def ep(sid: str, termination: str, turns: int, *types: str) -> EpisodeMetrics:
    return EpisodeMetrics(
        sid, termination, turns, 0.0, 0.0, "fact" in types, "commitment" in types, "player_input" in types
    )


# Six episodes, max_turns = 5:
#   e1 fact conflict at turn 2 and e2 commitment conflict at turn 2 (tied, different endings),
#   e3 context_limit after 2 turns (censored at 2: at risk for the endings at 2, gone before 3),
#   e4 fact + player_input conflict at turn 3 (several types), e5 all_resolved at 4,
#   e6 max_turns (5 turns: censored), e7 invalid (left out).
SIX = [
    ep("e1", "conflict", 2, "fact"),
    ep("e2", "conflict", 2, "commitment"),
    ep("e3", "context_limit", 2),
    ep("e4", "conflict", 3, "fact", "player_input"),
    ep("e5", "all_resolved", 4),
    ep("e6", "max_turns", 5),
    ep("e7", "invalid", 1),
]


def test_six_episodes_with_ties_and_censoring_match_the_hand_computation() -> None:
    # By hand. Turn 2: 6 at risk, 2 end (one fact, one commitment): each adds 1 * 1/6; S after = 4/6.
    # e3 leaves (censored at 2). Turn 3: 3 at risk (e4, e5, e6), e4 ends (several): + 4/6 * 1/3 = 2/9;
    # S after = 4/6 * 2/3 = 4/9. Turn 4: 2 at risk, e5 ends (all_resolved): + 4/9 * 1/2 = 2/9; S = 2/9.
    # F_k(t) counts endings after fewer than t turns, so a turn-n ending shows from t = n + 1; the curves
    # run to t = max_turns + 1 = 6, where e6 (stopped by the limit) is the 2/9 still going.
    expected = {
        "fact": [0, 0, 0, 1 / 6, 1 / 6, 1 / 6, 1 / 6],
        "commitment": [0, 0, 0, 1 / 6, 1 / 6, 1 / 6, 1 / 6],
        "player_input": [0] * 7,
        "several_types": [0, 0, 0, 0, 2 / 9, 2 / 9, 2 / 9],
        "all_resolved": [0, 0, 0, 0, 0, 2 / 9, 2 / 9],
    }
    survival = [1, 1, 1, 4 / 6, 4 / 9, 2 / 9]
    inc = cumulative_incidence(SIX, 5)
    assert inc.episodes == 6 and inc.censored == {"max_turns": 1, "context_limit": 1}
    for ending, values in expected.items():
        assert inc.curves[ending] == pytest.approx(values, abs=1e-12), ending
    km = km_survival([m.turns for m in SIX[:6]], [m.censored for m in SIX[:6]], 5).s
    assert km == pytest.approx(survival, abs=1e-12)
    for t in range(6):
        assert abs(inc.total(t) + km[t] - 1) < 1e-12
    assert inc.final("several_types") == pytest.approx(2 / 9) and inc.still_going == pytest.approx(2 / 9)
    assert inc.lo == inc.hi == {}  # no draws asked for, no band
    # With draws, the same seed gives the same band.
    banded = cumulative_incidence(SIX, 5, resamples=50, seed=3)
    assert banded.hi == cumulative_incidence(SIX, 5, resamples=50, seed=3).hi and set(banded.hi) == set(ENDINGS)


def test_the_order_of_tied_endings_changes_nothing_and_no_global_rng_is_touched() -> None:
    state = np.random.get_state()[1].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lifelines warns when it jitters ties at random: it must not
        forward = cumulative_incidence(SIX, 5)
        backward = cumulative_incidence(SIX[::-1], 5)
    assert forward == backward
    assert (np.random.get_state()[1] == state).all()


def _lifelines_incidence(metrics: list[EpisodeMetrics], max_turns: int) -> dict[str, list[float]]:
    """The oracle: lifelines' AalenJohansenFitter, tied endings spread apart deterministically inside their
    turn (the i-th at n + i * 1e-6), censorings at n + 1/2, each curve read at t - 1/2."""
    from lifelines import AalenJohansenFitter

    scored = [m for m in metrics if m.termination != "invalid"]
    durations, events, placed = [], [], {}
    for m in scored:
        if m.ending in ("max_turns", "context_limit"):
            durations.append(m.turns + 0.5)
            events.append(0)
        else:
            i = placed.get(m.turns, 0)
            placed[m.turns] = i + 1
            durations.append(m.turns + i * 1e-6)
            events.append(ENDINGS.index(m.ending) + 1)
    out = {}
    for k, ending in enumerate(ENDINGS, start=1):
        if k not in events:
            out[ending] = [0.0] * (max_turns + 2)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cdf = AalenJohansenFitter(calculate_variance=False).fit(durations, events, event_of_interest=k)
        cdf = cdf.cumulative_density_
        times, values = list(cdf.index), list(cdf.iloc[:, 0])
        out[ending] = [
            next((v for tt, v in zip(times[::-1], values[::-1], strict=True) if tt <= t - 0.5), 0.0)
            for t in range(max_turns + 2)
        ]
    return out


def test_numpy_aalen_johansen_matches_lifelines_on_random_runs() -> None:
    rng = np.random.default_rng(7)
    kinds = [
        ("conflict", "fact"),
        ("conflict", "commitment"),
        ("conflict", "player_input"),
        ("conflict", "fact", "commitment"),
        ("all_resolved",),
        ("context_limit",),
        ("invalid",),
    ]
    for _ in range(5):
        ms = [
            ep(
                f"s{i}",
                *kinds[rng.integers(0, len(kinds))][:1],
                int(rng.integers(1, 10)),  # lifelines drops one of two endings tied at time 0
                *kinds[rng.integers(0, 4)][1:],
            )
            for i in range(60)
        ]
        ms = [
            m
            if m.termination != "conflict" or m.fact or m.commitment or m.player_input
            else ep(m.spec_id, "conflict", m.turns, "fact")
            for m in ms
        ]
        ms += [ep("late", "max_turns", 10)]
        ours = cumulative_incidence(ms, 10)
        for ending, curve in _lifelines_incidence(ms, 10).items():
            assert ours.curves[ending] == pytest.approx(curve, abs=1e-12), ending


def test_incidence_band_resamples_stories_and_brackets_the_curve() -> None:
    # Two stories of 20 plays each, one ending early by fact, one late by all_resolved: the plays of a story
    # move together, so the band is as wide as drawing 0, 1 or 2 copies of the early story allows.
    plays = [ep("early", "conflict", 1, "fact") for _ in range(20)]
    plays += [ep("late", "all_resolved", 5) for _ in range(20)]
    plays = [
        EpisodeMetrics(
            *[
                getattr(m, f)
                for f in (
                    "spec_id",
                    "termination",
                    "turns",
                    "trajectory_progress",
                    "satisfied",
                    "fact",
                    "commitment",
                    "player_input",
                )
            ],
            trial=i % 20,
        )
        for i, m in enumerate(plays)
    ]
    inc = cumulative_incidence(plays, 6, level=0.95, resamples=400, seed=0)
    assert inc.final("fact") == pytest.approx(0.5)
    # 2 stories: one degree of freedom leaves almost no effective sample, so the band is nearly [0, 1].
    assert inc.lo["fact"][7] < 0.03 and inc.hi["fact"][7] > 0.97
    # As 40 single-play stories the same endings give a narrow band around 1/2.
    single = [
        EpisodeMetrics(f"s{i}", m.termination, m.turns, 0.0, 0.0, m.fact, False, False) for i, m in enumerate(plays)
    ]
    inc1 = cumulative_incidence(single, 6, level=0.95, resamples=400, seed=0)
    assert 0.25 < inc1.lo["fact"][7] < 0.5 < inc1.hi["fact"][7] < 0.75
    for k in ENDINGS:
        for t in range(8):
            assert inc1.lo[k][t] <= inc1.curves[k][t] + 1e-12 and inc1.curves[k][t] <= inc1.hi[k][t] + 1e-12


def test_bands_cover_every_turn_once() -> None:
    assert [b for b, _, _ in band_labels(100, [])] == ["1-5", "6-10", "11-20", "21-50", "51-100"]
    assert [b for b, _, _ in band_labels(8, [ep("x", "invalid", 0)])] == ["0", "1-5", "6-8"]
    assert [b for b, _, _ in band_labels(6, [])] == ["1-5", "6"]
    assert [b for b, _, _ in band_labels(120, [])][-1] == "101-120"
    header, rows = endings_by_band(SIX, 5)
    assert header == ["ending", "1-5", "all"]
    counts = {r[0]: r[1:] for r in rows}
    assert counts["fact"] == [1, 1] and counts["several_types"] == [1, 1] and counts["invalid"] == [1, 1]
    assert counts["all"] == [7, 7]
    assert sum(r[-1] for r in rows if r[0] != "all") == len(SIX)


def test_scripted_official_run_endings_add_up_to_one_minus_survival(
    scripted_official_run: Path, tmp_path: Path
) -> None:
    runs = load_runs([str(scripted_official_run)])
    for r in runs:
        attach_specs(r)
    out = tmp_path / "report"
    rep = build_report(runs, out, resamples=100)
    (ends,) = rep["endings"]
    inc, s = ends.incidence, ends.survival
    # The scripted answers give a mix: several conflict types, stories resolved, stories stopped at the limit.
    finals = {k: inc.final(k) for k in ENDINGS}
    assert sum(v > 0 for v in finals.values()) >= 3 and inc.censored["max_turns"] > 0
    for t in range(16):
        assert abs(inc.total(t) + s[t] - 1) < 1e-9, t
    # Without censoring before the limit, each F_k(t) is the plain share of stories ended by k before t,
    # and what the limit stopped is still going at t = 16.
    ms = runs[0].metrics()
    assert inc.still_going == pytest.approx(sum(m.termination == "max_turns" for m in ms) / len(ms), abs=1e-12)
    for k in ENDINGS:
        for t in (3, 8, 15, 16):
            share = sum(m.ending == k and m.turns < t for m in ms) / len(ms)
            assert math.isclose(inc.curves[k][t], share, abs_tol=1e-12), (k, t)
    # The files carry the same: every row of endings.csv adds up to 1, the band table counts every episode.
    rows = list(csv.DictReader(io.StringIO((out / "endings.csv").read_text())))
    assert [int(r["turns_played"]) for r in rows] == list(range(17))
    for r in rows:
        assert abs(float(r["survival"]) + sum(float(r[f"incidence_{k}"]) for k in ENDINGS) - 1) < 1e-8
    header, band_rows = ends.bands
    assert band_rows[-1] == ["all", *(sum(r[i] for r in band_rows[:-1]) for i in range(1, len(header)))]
    assert band_rows[-1][-1] == 100
    assert "## What ended each story" in (out / "results.md").read_text()
    assert (out / "endings.svg").read_text().count("<svg") == 1 and (out / "endings.png").stat().st_size > 0
    index = (out / "index.html").read_text()
    assert "<h2>What ended each story</h2>" in index and "<table class='counts bands'>" in index


def test_effective_band_by_hand() -> None:
    # Ten stories in 40 episodes, two bootstrap draws per column; t = 0 has no band.
    point = np.array([[0.0, 0.4, 0.0, 0.5, 0.5]])
    many = np.array([[[0.0, 0.3, 0.0, 0.0, 0.5]], [[0.0, 0.5, 0.0, 1.0, 0.5001]]])
    lo, hi = effective_band(point, many, 10, 40, 0.95)
    shrink = (stats.norm.ppf(0.975) / stats.t.ppf(0.975, 9)) ** 2  # a variance from 10 stories: 9 df

    def jeffreys(x: float, n: float) -> tuple[float, float]:
        return stats.beta.ppf(0.025, x + 0.5, n - x + 0.5), stats.beta.ppf(0.975, x + 0.5, n - x + 0.5)

    # 0.4 with draws 0.3 and 0.5: variance 0.01, times 10/9 for 10 stories; n* = 0.24 / that x the shrink.
    n = 0.4 * 0.6 / (0.01 * 10 / 9) * shrink
    assert (lo[0, 1], hi[0, 1]) == pytest.approx(jeffreys(0.4 * n, n), abs=1e-9)
    # Not seen, no spread: Jeffreys' bound for 0 of the 10 stories.
    assert (lo[0, 2], hi[0, 2]) == pytest.approx((0.0, stats.beta.ppf(0.975, 0.5, 10.5)), abs=1e-12)
    # Draws 0 and 1 put n* under 1: one trial, Beta(1, 1)'s quantiles.
    assert (lo[0, 3], hi[0, 3]) == pytest.approx((0.025, 0.975), abs=1e-12)
    # Draws that barely differ put n* above the 40 episodes: 20 of 40.
    assert (lo[0, 4], hi[0, 4]) == pytest.approx(jeffreys(20, 40), abs=1e-12)
    assert lo[0, 0] == hi[0, 0] == 0.0
    # `fading` takes the upper limit at n* times the share (at least 1 trial); the lower limit stays.
    lo_f, hi_f = effective_band(point, many, 10, 40, 0.95, np.array([1.0, 0.5, 0.5, 0.5, 0.25]))
    assert np.array_equal(lo_f, lo)
    assert hi_f[0, 1] == pytest.approx(jeffreys(0.2 * n, 0.5 * n)[1], abs=1e-9)
    assert hi_f[0, 2] == pytest.approx(stats.beta.ppf(0.975, 0.5, 5.5), abs=1e-12)
    assert hi_f[0, 3] == pytest.approx(0.975, abs=1e-12) and hi_f[0, 4] == pytest.approx(jeffreys(5, 10)[1])
