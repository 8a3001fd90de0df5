"""The estimators where real runs are (issue 58): small samples, late turns, heavy censoring.

pass^k as a weighted share that needs no cap, and where it is not estimable; the incidence band at the
effective sample size and its bound at zero events; the noise table's zero variances; the re-audit
agreement resampled by story. These start nothing and run in a few seconds: they are also the suite
the mutation run uses (docs/development/testing.md).
"""

from __future__ import annotations

import math
from dataclasses import astuple
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import optimize, stats

from ncp_local.protocol import metrics, resample
from ncp_local.protocol.metrics import (
    ENDINGS,
    EpisodeMetrics,
    aggregate,
    km_survival,
    restricted_mean_point,
    seen_since_last_ending,
)
from ncp_local.protocol.resample import percentile
from ncp_local.report import auditors, precision
from ncp_local.report.endings import cumulative_incidence
from ncp_local.report.trials import (
    NOISE_METRICS,
    RunTrials,
    Story,
    censoring_survival,
    effective_pass_k_band,
    fates,
    noise_floor,
    not_estimable,
    observed_counts,
    pass_k_band,
    pass_k_curve,
    pass_k_draws,
)
from ncp_local.report.trials_doc import noise_table, trials_notes


def play(story: str, trial: int, turns: int, termination: str = "conflict", fact: bool = True) -> EpisodeMetrics:
    conflict = termination == "conflict"
    return EpisodeMetrics(story, termination, turns, 0.0, 0.0, conflict and fact, False, conflict and not fact,
                          trial=trial)  # fmt: skip


def test_pass_k_needs_no_cap_under_heavy_censoring() -> None:
    # Story a's four plays are all censored after 1 turn, story b's all play 6 turns. The share seen surviving
    # t = 4 is 0 for a and 1 for b; censoring hid 4 of the 8 plays, so G(4) = 1/2. Dividing the mean share by
    # G^2 gave (1/2) / (1/4) = 2 (shown as 1 by a cap that biased everything it touched). As a ratio, only b's
    # pairs have known fates, all surviving: exactly 1, and the same for pass^1 (Kaplan-Meier's S(4) = 1).
    a = Story("a", tuple(play("a", i, 1, "context_limit") for i in range(4)))
    b = Story("b", tuple(play("b", i, 6, "max_turns") for i in range(4)))
    for k in (1, 2, 4):
        assert pass_k_curve([a, b], k, 6)[4] == pytest.approx(1.0)
    # Random heavy censoring: always a share in [0, 1], and pass^k never above pass^(k-1).
    rng = np.random.default_rng(3)
    stories = []
    for s in range(30):
        plays = []
        for j in range(4):
            censored = rng.random() < 0.6
            plays.append(play(f"s{s}", j, int(rng.integers(1, 12)), "context_limit" if censored else "conflict"))
        stories.append(Story(f"s{s}", tuple(plays)))
    curves = [pass_k_curve(stories, k, 12) for k in (1, 2, 3, 4)]
    for c in curves:
        ok = ~np.isnan(c)
        assert ok[:8].all() and (c[ok] >= 0).all() and (c[ok] <= 1 + 1e-12).all()
    lo, hi = pass_k_band(stories, 2, 12, 200, 0, 0.95)
    assert np.nanmax(hi) <= 1 + 1e-12 and (lo[:8] <= curves[1][:8] + 1e-12).all()


def test_censoring_survival_by_hand() -> None:
    # Plays of 2 (censored), 2 (ended), 4 (ended), 5 (censored) and 6 (the limit) turns. Censoring after n
    # turns competes with the endings of turn n among the plays that did not end at n: at n = 2, 1 of the 4
    # plays that played 2 or more and did not end there (the one that ended at 2 is out); at n = 5, 1 of 2.
    # G(t) takes the factors of turns 0..t-2: G = 1, 1, 1, 1, 3/4, 3/4, 3/4 (the 1/2 of turn 5 counts from 7).
    plays = [play("a", 0, 2, "context_limit"), play("a", 1, 2), play("a", 2, 4), play("a", 3, 5, "context_limit")]
    plays.append(play("a", 4, 6, "max_turns"))
    assert tuple(censoring_survival(plays, 6)) == pytest.approx((1, 1, 1, 1, 0.75, 0.75, 0.75))
    assert tuple(censoring_survival(plays, 7))[7] == pytest.approx(0.375)


def test_pass_k_is_undefined_where_censoring_hid_every_play_and_weighs_each_story_once() -> None:
    # One play ends at turn 1, the other is censored after 3 turns: the last play at risk was censored, so
    # G(5) = 0 and nothing can be known at t = 5.
    lone = Story("a", (play("a", 0, 1), play("a", 1, 3, "context_limit")))
    assert pass_k_curve([lone], 1, 5)[3] == pytest.approx(0.5) and math.isnan(pass_k_curve([lone], 1, 5)[5])
    # Stories of 2 and 4 plays, none censored: a's 2 plays survive t = 3, 1 of b's 4 does. Each story weighs
    # one, however many plays it has: pass^2 = (1 + 0) / 2, pass^1 = (1 + 1/4) / 2.
    a = Story("a", (play("a", 0, 5, "max_turns"), play("a", 1, 5, "max_turns")))
    b = Story("b", (play("b", 0, 5, "max_turns"), play("b", 1, 1), play("b", 2, 2), play("b", 3, 1)))
    assert pass_k_curve([a, b], 2, 5)[3] == pytest.approx(0.5)
    assert pass_k_curve([a, b], 1, 5)[3] == pytest.approx(0.625)
    # Everything ended before t: 0, not undefined.
    assert pass_k_curve([b], 1, 5)[4] == pytest.approx(0.25) and pass_k_curve([Story("c", b.plays[1:])], 1, 5)[4] == 0


def test_pass_k_is_not_estimable_where_few_stories_are_observed_and_says_why() -> None:
    # 12 stories of 2 plays, max_turns 10: the first 12 - survivors end both plays at turn 3, the rest play all 10.
    def stories(censor_late: bool = False, survivors: int = 6, count: int = 12) -> list[Story]:
        out = []
        for s in range(count):
            long = s >= count - survivors
            second = play(f"s{s}", 1, 2, "context_limit") if long and censor_late else None
            plays = [play(f"s{s}", j, 10 if long else 3, "max_turns" if long else "conflict") for j in range(2)]
            out.append(Story(f"s{s}", (plays[0], second or plays[1])))
        return out

    assert not_estimable(stories(), 2, 10) == ("",) * 11  # pass^k(0) = 1 by definition; 12 observed throughout
    # Censor the second play of each long story after 2 turns: from t = 4 on their fates are unknown, so only
    # stories 0-5 have 2 plays observed.
    assert not_estimable(stories(censor_late=True), 2, 10)[4] == "6 stories with 2 plays observed at t=4 (needs 10)"
    # What the observed stories showed does not count (h58e): none, 1 or every one of 12 surviving is estimable,
    # where the rule before asked for 5 on each side and so showed pass^k only in the runs with many survivors.
    for survivors in (0, 1, 3, 12):
        assert not_estimable(stories(survivors=survivors), 2, 10)[4] == ""
    assert not_estimable(stories(count=10), 2, 10)[4] == ""  # at the limit
    assert not_estimable(stories(count=9), 2, 10)[4] == "9 stories with 2 plays observed at t=4 (needs 10)"
    # k larger than any story's plays: nothing observed.
    assert not_estimable(stories(), 3, 10)[5] == "0 stories with 3 plays observed at t=5 (needs 10)"
    # Positivity: 12 stories end both plays at turn 3, 8 have both plays censored after 4 turns. At t = 8 the 12
    # that ended are observed (a share of 0 there), but censoring hid every play still going: G(8) = 0, and no
    # survivor could have been seen. At t = 5 the 8 are seen surviving (censored after 4: T > 4) and G = 1.
    hidden = [Story(f"e{s}", (play(f"e{s}", 0, 3), play(f"e{s}", 1, 3))) for s in range(12)]
    hidden += [Story(f"c{s}", tuple(play(f"c{s}", j, 4, "context_limit") for j in range(2))) for s in range(8)]
    why = not_estimable(hidden, 2, 10)
    assert why[5] == "" and pass_k_curve(hidden, 2, 10)[5] == pytest.approx(0.4)
    assert why[8] == "censoring leaves 0.0 stories' 2 plays followed through t=8 (needs 10)"
    # G(6) = 1 - 16/16 = 0 from t = 6 on; with 8 of the 16 censored instead, G = 1/2 and 20 x (1/2)^2 = 5.
    half = hidden[:12] + [
        Story(f"c{s}", (play(f"c{s}", 0, 4, "context_limit"), play(f"c{s}", 1, 10, "max_turns"))) for s in range(8)
    ]
    assert not_estimable(half, 2, 10)[8] == "censoring leaves 5.0 stories' 2 plays followed through t=8 (needs 10)"


def test_pass_k_band_is_jeffreys_at_the_effective_sample_size_by_hand() -> None:
    # t = 0..4: pass^k(0) = 1 (no band); 0.3 with bootstrap draws of known spread over 20 observed stories and
    # 40 plays with known fates; 0.3 again with draws so tight that n* would pass the 25 plays (capped there);
    # 0 and 1 with no spread: Jeffreys' bound for 0 of n* and n* of n*, n* the binomial one of the 15 (12) observed
    # through the same corrections, 15 x 14/15 x (z / t_14)^2 = 11.6 (and 8.8 of 12), not the 30 or 24 plays.
    point = np.array([1.0, 0.3, 0.3, 0.0, 1.0])
    spread = np.array([0.0, 0.1, 0.01, 0.0, 0.0])
    many = point + spread * np.array([[-1.0], [1.0]])  # two draws, point -+ spread: variance spread^2
    observed, plays = np.array([20, 20, 20, 15, 12]), np.array([40, 40, 25, 30, 24])
    lo, hi = effective_pass_k_band(point, many, observed, plays, 0.95)
    z, t19 = stats.norm.ppf(0.975), stats.t.ppf(0.975, 19)
    n1 = 0.3 * 0.7 / (0.01 * 20 / 19) * (z / t19) ** 2  # 17.4 of the 40
    beta = stats.beta
    assert (lo[0], hi[0]) == (1.0, 1.0)
    assert (lo[1], hi[1]) == pytest.approx(
        (beta.ppf(0.025, 0.3 * n1 + 0.5, 0.7 * n1 + 0.5), beta.ppf(0.975, 0.3 * n1 + 0.5, 0.7 * n1 + 0.5))
    )
    assert (lo[2], hi[2]) == pytest.approx((beta.ppf(0.025, 7.5 + 0.5, 17.5 + 0.5), beta.ppf(0.975, 8.0, 18.0)))
    n3, n4 = 14 * (z / stats.t.ppf(0.975, 14)) ** 2, 11 * (z / stats.t.ppf(0.975, 11)) ** 2
    assert (lo[3], hi[3]) == pytest.approx((0.0, beta.ppf(0.975, 0.5, n3 + 0.5)))  # about 0.19, never [0, 0]
    assert (lo[4], hi[4]) == pytest.approx((beta.ppf(0.025, n4 + 0.5, 0.5), 1.0))  # about 0.75, never [1, 1]
    assert 0.15 < hi[3] < 0.25 and 0.7 < lo[4] < 0.8
    # Undefined where pass^k is (no story has k plays known).
    nan_lo, nan_hi = effective_pass_k_band(np.array([1.0, np.nan]), np.ones((2, 2)), np.zeros(2), np.zeros(2), 0.95)
    assert np.isnan(nan_lo[1]) and np.isnan(nan_hi[1])


def test_pass_k_band_of_a_run_takes_its_spread_from_the_stories_bootstrap() -> None:
    # 17 stories of 8 plays that share their fate: 3 play all 10 turns, 14 end at turn 4. pass^8(10) = 3/17;
    # the band is Jeffreys' at the effective size the stories' draws give: a binomial's over 17 stories, whose
    # variance p (1 - p) / 17 is taken times 17/16 and n* shrunk by (z / t_16)^2, so n* is about 13.7.
    ss = [
        Story(
            f"s{s}", tuple(play(f"s{s}", j, 10 if s < 3 else 4, "max_turns" if s < 3 else "conflict") for j in range(8))
        )
        for s in range(17)
    ]
    point = pass_k_curve(ss, 8, 10)
    lo, hi = pass_k_band(ss, 8, 10, 400, 1, 0.95)
    many = pass_k_draws(ss, 8, 10, 400, 1)
    assert point[10] == pytest.approx(3 / 17)
    f = fates(ss, 10)
    observed, surviving, ended, plays = observed_counts(f, 8)
    assert (observed[10], surviving[10], ended[10], plays[10]) == (17, 3, 14, 136)
    assert all(
        (a == b).all() for a, b in zip((lo, hi), effective_pass_k_band(point, many, observed, plays, 0.95), strict=True)
    )
    n = 16 * (stats.norm.ppf(0.975) / stats.t.ppf(0.975, 16)) ** 2
    x = 3 / 17 * n
    exact = stats.beta.ppf([0.025, 0.975], x + 0.5, n - x + 0.5)
    assert lo[10] == pytest.approx(exact[0], abs=0.01) and hi[10] == pytest.approx(
        exact[1], abs=0.025
    )  # the draws vary
    # All surviving at t = 4 (no story has ended before 4): Jeffreys' n of n at the same n*, not 100 [100, 100].
    assert hi[4] == 1.0 and lo[4] == pytest.approx(stats.beta.ppf(0.025, n + 0.5, 0.5))


def _rt(story_list: list[Story], curves: dict[int, tuple[float, ...]], bands: dict, why: dict) -> RunTrials:
    return RunTrials("r", 2, 4, story_list, curves, (1.0,) * 5, noise_floor(story_list), bands, why)


def test_the_noise_table_shows_a_zero_variance_as_zero_and_its_notes_say_what_it_means() -> None:
    # Conflict-free shares (0, 0, 100) and (0, 0, 0): the stories' means differ exactly as much as their
    # plays' noise predicts, so the between-story variance is 0; float arithmetic leaves 2.3e-13 of it, which
    # the table once printed as a ratio of 7.3e15.
    a = Story("a", (play("a", 0, 5), play("a", 1, 5), play("a", 2, 5, "max_turns")))
    b = Story("b", tuple(play("b", i, 5) for i in range(3)))
    free = next(n for n in noise_floor([a, b]) if n.metric == "conflict_free_pct")
    assert free.between == 0.0 and math.isinf(free.ratio) and free.within == pytest.approx(10000 / 3 / 2)
    assert free.mean == pytest.approx(100 / 6) and free.label == "conflict-free %"
    turns = next(n for n in noise_floor([a, b]) if n.metric == "avg_turns")
    assert turns.within == 0.0 and turns.between == 0.0 and math.isnan(turns.ratio)  # no spread at all
    rt = _rt([a, b], {1: (1.0, 1.0, 0.9, 0.9, 0.9)}, {1: ((1.0, 1.0, 0.9, 0.9, 0.9),) * 2}, {1: ("",) * 5})
    row = next(r for r in noise_table(rt, 0.95)[1] if r[0] == "conflict-free %")
    assert row[3:5] == ["0.00", "inf"]
    notes = " ".join(trials_notes(rt))
    assert "Between-story variance 0 for turns, traj %" in notes and "(within / between: inf)" in notes
    assert "Within-story variance 0 for turns" in notes and "with 2 stories" in notes
    # Bands of zero width are named with the number of stories behind them.
    assert "Interval of zero width (pass^1 at t=1, pass^1 at t=2, pass^1 at t=3, pass^1 at t=4)" in notes
    assert "of the 2 stories gave the same value" in notes
    # Where pass^k is not estimable the cell says so and the note gives the reason.
    nan = (math.nan,) * 5
    rt = _rt([a, b], {1: nan}, {1: (nan, nan)}, {1: ("",) + ("2 stories with 1 plays observed at t=1 (needs 10)",) * 4})
    notes = trials_notes(rt)
    assert notes[0].startswith("pass^1 not estimable at t=1: 2 stories with 1 plays observed at t=1 (needs 10);")
    assert not any("zero width" in n for n in notes)


def test_incidence_band_holds_at_zero_events_and_for_a_rare_ending() -> None:
    # 40 single-play stories: one ends by player input, 19 by fact, 20 reach the limit.
    ms = [play(f"s{i}", 0, 3 + i % 4) for i in range(19)]
    ms += [play("s19", 0, 2, fact=False)]
    ms += [play(f"s{i}", 0, 8, "max_turns") for i in range(20, 40)]
    inc = cumulative_incidence(ms, 8, 0.95, 400, 0)
    # No commitment ending at all: never [0, 0], but Jeffreys' bound for 0 of 40 stories.
    assert inc.final("commitment") == 0.0 and inc.lo["commitment"][-1] == 0.0
    assert inc.hi["commitment"][-1] == pytest.approx(stats.beta.ppf(0.975, 0.5, 40.5))
    assert inc.hi["commitment"][0] == 0.0  # F(0) = 0 by definition
    # 1 of 40: the percentile band of the draws stops near 0.075; Jeffreys' interval of 1 in 40 reaches 0.11.
    rare = inc.final("player_input")
    assert rare == pytest.approx(1 / 40) and 0 < inc.lo["player_input"][-1] < rare
    assert inc.hi["player_input"][-1] == pytest.approx(stats.beta.ppf(0.975, 1.5, 39.5), abs=0.02)
    # A common ending: about Jeffreys' interval of 19 of 40 (0.33, 0.63), widened a little for 39 degrees of
    # freedom.
    assert inc.lo["fact"][-1] == pytest.approx(0.325, abs=0.02) and inc.hi["fact"][-1] == pytest.approx(0.63, abs=0.02)


def _auditor(label: str, by_story: dict[str, list[bool]], narration: str = "same") -> auditors.Auditor:
    """An auditor of 5 plays per story, each play judged `conflict` on its 4 turns as given per story."""
    aud = auditors.Auditor(label, Path(f"/{label}"), narration)
    for story, judged in by_story.items():
        for trial in range(5):
            per_turn = tuple((t, judged[t]) for t in range(4))
            turns = next((t + 1 for t in range(4) if judged[t]), 4) + trial % 2  # a play differs a little
            types = frozenset({"fact"}) if any(judged) else frozenset()
            aud.episodes[f"{story}~t{trial}"] = auditors.Judged(turns, types, per_turn, story)
    return aud


def test_reaudit_agreement_resamples_stories_with_all_their_plays() -> None:
    # Six stories of five plays; the two auditors agree on four stories and disagree on two. A story's plays
    # are judged alike, so they are one observation five times over: by story the intervals are about
    # sqrt(5) wider than by episode.
    a = {"s0": [0, 0, 1, 0], "s1": [0, 0, 0, 0], "s2": [1, 0, 0, 0], "s3": [0, 1, 0, 0], "s4": [0, 0, 0, 1]}
    a["s5"] = [0, 0, 0, 0]
    b = dict(a) | {"s4": [0, 0, 0, 0], "s5": [0, 1, 0, 0]}
    a_bool = {s: [bool(x) for x in v] for s, v in a.items()}
    b_bool = {s: [bool(x) for x in v] for s, v in b.items()}
    clustered = auditors.table([_auditor("A", a_bool), _auditor("B", b_bool)], 1000, 0, 0.95)
    assert clustered == auditors.table([_auditor("A", a_bool), _auditor("B", b_bool)], 1000, 0, 0.95)  # seeded
    # Each auditor's rates: A found a conflict (a fact one) in 4 of the 6 stories, every play alike.
    row = clustered["auditors"][0]
    assert (row["auditor"], row["path"], row["episodes"]) == ("A", "/A", 30)
    assert row["fact"]["point"] == pytest.approx(400 / 6) and row["conflict"]["point"] == pytest.approx(400 / 6)
    assert row["commitment"]["point"] == row["player_input"]["point"] == 0.0
    assert (clustered["pairs"][0]["a"], clustered["pairs"][0]["b"], clustered["pairs"][0]["episodes"]) == ("A", "B", 30)
    # The level asked for: a 50% interval is narrower than the 95% one.
    half = auditors.table([_auditor("A", a_bool), _auditor("B", b_bool)], 1000, 0, 0.5)
    for key in ("kappa", "pearson"):
        assert (
            half["pairs"][0][key]["hi"] - half["pairs"][0][key]["lo"]
            < clustered["pairs"][0][key]["hi"] - clustered["pairs"][0][key]["lo"]
        )
    assert half["auditors"][0]["fact"]["hi"] < clustered["auditors"][0]["fact"]["hi"]
    flat_a, flat_b = _auditor("A", a_bool), _auditor("B", b_bool)
    for aud in (flat_a, flat_b):  # the same episodes, each its own story
        aud.episodes = {k: auditors.Judged(j.turns, j.types, j.per_turn, k) for k, j in aud.episodes.items()}
    flat = auditors.table([flat_a, flat_b], 1000, 0, 0.95)
    assert (clustered["stories"], flat["stories"]) == (6, 30)

    def width(iv: dict) -> float:
        return iv["hi"] - iv["lo"]

    pair, flat_pair = clustered["pairs"][0], flat["pairs"][0]
    assert pair["kappa"]["point"] == pytest.approx(flat_pair["kappa"]["point"])
    for key in ("kappa", "pearson", "spearman"):
        assert width(pair[key]) > 1.5 * width(flat_pair[key]), key
    rates, flat_rates = clustered["auditors"][0], flat["auditors"][0]
    for key in ("fact", "conflict", "turns"):
        assert width(rates[key]) > 1.5 * width(flat_rates[key]), key


def _precision_run() -> tuple[SimpleNamespace, list[precision.Verdict]]:
    """One story of 10 plays (max_turns 4): 4 end in one fact conflict at turn 2, 1 in a fact and a commitment
    conflict at turn 2, 1 in two fact conflicts at turn 3, 2 are censored after 3 turns, 2 reach the limit.
    A sheet upholds 8 of 10 fact conflicts and 1 of 2 commitment ones."""

    def result(i: int, termination: str, turns: int, conflicts: tuple[str, ...]) -> SimpleNamespace:
        last = SimpleNamespace(
            conflicts=[SimpleNamespace(type=t, target_id=f"{t}{j}") for j, t in enumerate(conflicts)]
        )
        return SimpleNamespace(spec_id="s", trial=i, termination=termination,
                               turns=[SimpleNamespace(conflicts=[])] * (turns - 1) + [last])  # fmt: skip

    rows = [result(i, "conflict", 2, ("fact",)) for i in range(4)]
    rows += [result(4, "conflict", 2, ("fact", "commitment")), result(5, "conflict", 3, ("fact", "fact"))]
    rows += [result(6 + i, "context_limit", 3, ()) for i in range(2)]
    rows += [result(8 + i, "max_turns", 4, ()) for i in range(2)]
    run = SimpleNamespace(results={f"s~t{r.trial}": r for r in rows}, label="toy", max_turns=4, path=Path("/toy"))
    verdicts = [precision.Verdict("/toy", "s", "fact", "f", i < 8) for i in range(10)]
    verdicts += [precision.Verdict("/toy", "s", "commitment", "c", i < 1) for i in range(2)]
    return run, verdicts


def test_corrected_figures_by_hand_and_their_interval_from_the_precisions_posterior() -> None:
    run, verdicts = _precision_run()
    prec = precision.precisions(verdicts, 0.9)
    fact, commit, player = prec["fact"], prec["commitment"], prec["player_input"]
    assert (fact.reviewed, fact.upheld, fact.value, commit.value, player.value) == (10, 8, 0.8, 0.5, None)
    # Clopper-Pearson at the level asked for (90%): the beta quantiles.
    assert (fact.lo, fact.hi) == pytest.approx((stats.beta.ppf(0.05, 8, 3), stats.beta.ppf(0.95, 9, 2)))
    assert (fact.type, player.type, player.reviewed, player.upheld) == ("fact", "player_input", 0, 0)
    assert math.isnan(player.lo) and math.isnan(player.hi)
    # The point (draws or none): a play with c_k conflicts of type k really ended by k with chance
    # 1 - (1 - p_k)^c_k, (1 - p_k)^c_k estimated without bias by C(m - u, c) / C(m, c): 2 / 10 for one fact
    # conflict, C(2, 2) / C(10, 2) = 1 / 45 for two (not 0.2^2, biased up by p (1 - p) / m).
    # Fact: 4 x 0.8 + 0.8 + 44 / 45 over 10 plays = 49.78%; commitment 0.5 / 10 = 5%.
    # By any conflict: 4 x 0.8 + (1 - 0.2 x 0.5) + 44 / 45 = 5.0778, so 4.9222 plays conflict-free.
    plug = precision.correct(run, prec, verdicts, 0, 0, 0.95)
    assert (plug.label, plug.scored, plug.uncorrected_types) == ("toy", 10, ("player_input",))
    assert plug.rates["fact_pct"][1].point == pytest.approx(10 * (4 + 44 / 45))
    assert plug.rates["commitment_pct"][1].point == pytest.approx(5.0)
    assert plug.rates["player_input_pct"][1].point == 0.0
    assert plug.conflict_free[1].point == pytest.approx(10 - 4.1 - 44 / 45) and math.isnan(plug.conflict_free[1].lo)
    # As judged (every conflict real): 6 of 10 with a fact conflict, 1 with a commitment one, 4 conflict-free.
    assert (plug.rates["fact_pct"][0], plug.rates["commitment_pct"][0], plug.conflict_free[0]) == (60.0, 10.0, 4.0)
    # S(t): turn 2 has 10 at risk and endings weighing 3.2 + 0.9; turn 3 has 5 at risk (the two censored
    # plays among them, weighing 0) and 44 / 45. As judged: 5 of 10, then 1 of 5.
    judged_s, corr_s, lo_s, hi_s = plug.survival
    assert judged_s == pytest.approx((1, 1, 1, 0.5, 0.4))
    assert corr_s == pytest.approx((1, 1, 1, 0.59, 0.59 * (1 - 44 / 45 / 5)))
    assert len(lo_s) == len(hi_s) == 5
    # With draws: one story, so every draw takes the same plays and only the precisions vary. The fact rate
    # f(p) = 10 (5 p + 1 - (1 - p)^2) rises with p, so the draws' band is f at the quantiles of Jeffreys'
    # Beta(8.5, 2.5); the interval holds it (and Jeffreys' interval at the draws' effective sample size, the
    # wider of the two), and the point stays the unbiased one, not the draws' median.
    drawn = precision.correct(run, prec, verdicts, 4000, 0, 0.95).rates["fact_pct"][1]

    def f(p: float) -> float:
        return 10 * (5 * p + 1 - (1 - p) ** 2)

    lo_q, hi_q = stats.beta(8.5, 2.5).ppf([0.025, 0.975])
    assert drawn.lo <= f(lo_q) + 0.3 and drawn.hi >= f(hi_q) - 0.3
    assert drawn.lo < drawn.point == plug.rates["fact_pct"][1].point < drawn.hi
    assert drawn == precision.correct(run, prec, verdicts, 4000, 0, 0.95).rates["fact_pct"][1]  # seeded
    # A type with no reviewed item is taken as judged, in the point and in every draw: one more play ending in
    # a player-input conflict gives 1 in 11, corrected or not.
    last = SimpleNamespace(conflicts=[SimpleNamespace(type="player_input", target_id="p0")])
    extra = SimpleNamespace(spec_id="s", trial=10, termination="conflict", turns=[SimpleNamespace(conflicts=[]), last])
    run.results["s~t10"] = extra
    for draws in (0, 200):
        rate = precision.correct(run, prec, verdicts, draws, 0, 0.95).rates["player_input_pct"]
        assert rate[0] == rate[1].point == pytest.approx(100 / 11)
        # (With draws its band holds it; one story leaves the bootstrap no spread, so Jeffreys' interval for
        # 1 of 11 at one trial, the story, widens it.)
        assert draws == 0 or rate[1].lo < 100 / 11 < rate[1].hi


def test_survival_bounds_at_zero_and_one_by_hand() -> None:
    # Six episodes of 1 (ended), 2 (censored), 4, 4 (ended both: everyone at risk of turn 4), max_turns 6:
    # S falls to 0 after turn 4 with 2 at risk, so S(5) and S(6) are bounded above by S(4)'s top times
    # 1 - 0.025^(1/2), at 95%; at 90% by 1 - 0.05^(1/2).
    turns, censored = [1, 2, 4, 4], [False, True, False, False]
    for level, alpha in ((0.95, 0.025), (0.9, 0.05)):
        c = km_survival(turns, censored, 6, level)
        assert c.s[5:] == (0.0, 0.0) and c.lo[5:] == (0.0, 0.0)
        assert c.hi[5] == c.hi[6] == pytest.approx(c.hi[4] * (1 - alpha**0.5))
        # S(1) = 1 with 4 at risk of turn 0's endings: bounded below by alpha^(1/4).
        assert c.lo[1] == pytest.approx(alpha**0.25) and c.hi[1] == 1.0
    # Greenwood's band at the level asked for: narrower at 90% than at 95%.
    assert km_survival(turns, censored, 6, 0.9).lo[3] > km_survival(turns, censored, 6).lo[3]
    # Nobody at risk any more and nothing ended: nothing bounds S from below.
    assert km_survival([1], [True], 4).lo[3:] == (0.0, 0.0)
    # Empty: zeros, band included.
    empty = km_survival([], [], 2)
    assert empty.s == empty.lo == empty.hi == (0.0, 0.0, 0.0)
    # With several plays a story, the bootstrap band where every draw agrees (S = 0 after both stories'
    # plays ended) is bounded by the stories at risk, and the same seed gives the same band.
    stories = ["a", "a", "b", "b"]
    c = km_survival([1, 2, 2, 2], [False] * 4, 4, stories=stories, resamples=200)
    assert c.s[3:] == (0.0, 0.0) and c.hi[3] > 0 and c.lo[3] == 0.0
    assert c == km_survival([1, 2, 2, 2], [False] * 4, 4, stories=stories, resamples=200)


def test_restricted_mean_of_nothing_is_zero() -> None:
    assert restricted_mean_point(np.array([], dtype=np.intp), np.array([]), 5) == 0.0


def test_noise_floor_with_too_few_plays_three_stories_and_its_power_columns() -> None:
    # No story with two plays: no within-story spread, every figure NaN, one row per metric.
    single = [Story(f"s{i}", (play(f"s{i}", 0, i + 1),)) for i in range(3)]
    rows = noise_floor(single)
    assert [n.metric for n in rows] == [m for m, _ in NOISE_METRICS]
    assert all(math.isnan(x) for n in rows for x in astuple(n)[2:])
    assert [n.label for n in rows] == [label for _, label in NOISE_METRICS]
    # One story of two plays beside one of one: one degree of freedom is enough for a within-story variance.
    one = noise_floor([Story("a", (play("a", 0, 1), play("a", 1, 3))), Story("b", (play("b", 0, 4),))])
    assert next(n for n in one if n.metric == "avg_turns").within == pytest.approx(2.0)
    # Three stories of two plays: turns (1, 3), (5, 7), (2, 2). Within: (2 + 2 + 0) / 3 = 4/3; the story
    # means 2, 6, 2 vary by 16/3; between = 16/3 - (4/3) / 2 = 14/3. At the default 95% level.
    three = [Story("a", (play("a", 0, 1), play("a", 1, 3))), Story("b", (play("b", 0, 5), play("b", 1, 7)))]
    three.append(Story("c", (play("c", 0, 2), play("c", 1, 2))))
    turns = next(n for n in noise_floor(three) if n.metric == "avg_turns")
    z, z80 = stats.norm.ppf(0.975), stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert (turns.within, turns.between, turns.ratio) == pytest.approx((4 / 3, 14 / 3, 2 / 7))
    se_replay, se_runs = math.sqrt(2 * (4 / 3) / 6), math.sqrt(2 * ((14 / 3) / 3 + (4 / 3) / 6))
    assert (turns.mdd_replay, turns.mdd_runs) == pytest.approx((z * se_replay, z * se_runs))
    assert (turns.mdd_replay_80, turns.mdd_runs_80) == pytest.approx((z80 * se_replay, z80 * se_runs))
    # A between-story variance of 1 still gives a ratio (not inf): (1, 3) and (3, 5), within 2, between 2 - 1.
    small = [Story("a", (play("a", 0, 1), play("a", 1, 3))), Story("b", (play("b", 0, 3), play("b", 1, 5)))]
    t_small = next(n for n in noise_floor(small) if n.metric == "avg_turns")
    assert (t_small.within, t_small.between, t_small.ratio) == pytest.approx((2.0, 1.0, 2.0))


def test_percentile_interval_and_seeded_bands() -> None:
    values = np.arange(1001, dtype=float)[:, None]
    lo, hi = percentile(values, 0.95)
    assert (lo[0], hi[0]) == pytest.approx((25.0, 975.0))
    assert tuple(x[0] for x in percentile(values, 0.5)) == pytest.approx((250.0, 750.0))
    # pass^k's band and the main table's S(t) band with trials: the same seed, the same band.
    stories = [Story(f"s{i}", tuple(play(f"s{i}", j, 1 + (i * j) % 6) for j in range(3))) for i in range(12)]
    first = pass_k_band(stories, 2, 6, 100, 4, 0.95)
    assert all((a == b).all() for a, b in zip(first, pass_k_band(stories, 2, 6, 100, 4, 0.95), strict=True))
    nan = pass_k_band([], 2, 4, 100, 0, 0.95)
    assert all(len(x) == 5 and np.isnan(x).all() for x in nan) and np.isnan(pass_k_curve([], 2, 4)).all()
    ms = [m for s in stories for m in s.plays]
    agg = aggregate(ms, 6, 0.9, 150, 3)
    km = km_survival([m.turns for m in ms], [m.censored for m in ms], 6, 0.9, [m.spec_id for m in ms], 150, 3)
    assert (agg.survival, agg.survival_lo, agg.survival_hi) == (km.s, km.lo, km.hi)


def test_pass_k_weighs_an_ended_play_by_the_censoring_survival_at_its_end() -> None:
    # A play that ended at turn n weighs 1/G(n + 1): censoring before its end (here after 3 turns, before the
    # ending at 4) raises its weight, censoring after it (a play ending at 2) does not. Either way pass^1 is
    # Kaplan-Meier's S(t).
    for first_end in (2, 3, 4):
        plays = (play("x", 0, first_end), play("x", 1, 3, "context_limit"))
        plays += (play("x", 2, 8, "max_turns"), play("x", 3, 8, "max_turns"))
        km = km_survival([m.turns for m in plays], [m.censored for m in plays], 8).s
        assert (
            pass_k_curve([Story("x", plays)], 1, 8)[7]
            == pytest.approx(km[7])
            == pytest.approx({2: 0.75, 3: 0.75, 4: 2 / 3}[first_end])
        )


def test_corrected_survival_weighs_a_story_that_ended_unconflicted_fully_and_leaves_invalid_plays_out() -> None:
    # The toy run plus a play that ended with every achievement resolved at turn 2 (weight 1: nothing to
    # doubt) and an invalid play with a fact conflict at turn 1 (out of every figure, as from the report's).
    run, verdicts = _precision_run()
    last = SimpleNamespace(conflicts=[SimpleNamespace(type="fact", target_id="f9")])
    run.results["s~t10"] = SimpleNamespace(spec_id="s", trial=10, termination="all_resolved",
                                           turns=[SimpleNamespace(conflicts=[])] * 2)  # fmt: skip
    run.results["s~t11"] = SimpleNamespace(spec_id="s", trial=11, termination="invalid", turns=[last])
    plug = precision.correct(run, precision.precisions(verdicts, 0.95), verdicts, 0, 0, 0.95)
    assert plug.scored == 11 and plug.rates["fact_pct"][1].point == pytest.approx(100 * (4 + 44 / 45) / 11)
    # Turn 2: 11 at risk, endings weighing 4 x 0.8 + 0.9 + 1 (the resolved play) = 5.1; turn 3: 5 at risk, 0.96.
    judged_s, corr_s, _, _ = plug.survival
    assert corr_s == pytest.approx((1, 1, 1, 5.9 / 11, 5.9 / 11 * (1 - 44 / 45 / 5)))
    assert judged_s == pytest.approx((1, 1, 1, 5 / 11, 5 / 11 * 4 / 5))


def test_a_clustered_survival_band_is_the_percentile_band_widened_for_few_stories_on_the_log_log_scale() -> None:
    # 12 stories of 3 plays, ends spread over turns 1-6, two plays censored: the band is the stories'
    # percentile band with each end moved sqrt(G/(G-1)) t_{G-1}/z times as far from S(t) on log(-log S).
    g, level = 12, 0.95
    assert resample.few_stories_factor(g, level) == pytest.approx(
        math.sqrt(12 / 11) * stats.t.ppf(0.975, 11) / stats.norm.ppf(0.975)
    )
    assert resample.few_stories_factor(1, level) == 1.0
    # The figures docs/guide/trials.md gives: 30, 50 and 100 stories.
    assert [resample.few_stories_factor(n, level) for n in (30, 50, 100)] == pytest.approx(
        [1.061, 1.036, 1.018], abs=6e-4
    )
    turns = [1 + (3 * s + p) % 6 for s in range(g) for p in range(3)]
    cens = [i in (4, 20) for i in range(3 * g)]
    names = [f"s{s}" for s in range(g) for _ in range(3)]
    band = metrics.km_survival(turns, cens, 6, level, names, resamples=300, seed=1)
    ended = 1.0 - np.asarray(cens, dtype=float)
    groups = resample.clusters(names)
    t_arr = np.asarray(turns)
    curves = np.asarray([metrics.product_limit(t_arr[i], ended[i], 6) for i in resample.draws(groups, 300, 1)])
    low, high = resample.percentile(curves, level)

    def loglog(x: float) -> float:
        return math.log(-math.log(x))

    factor = resample.few_stories_factor(g, level)
    for t in range(2, 6):
        s = band.s[t]
        assert 0 < low[t] < s < high[t] < 1, t
        assert loglog(band.lo[t]) - loglog(s) == pytest.approx(factor * (loglog(low[t]) - loglog(s)))
        assert loglog(band.hi[t]) - loglog(s) == pytest.approx(factor * (loglog(high[t]) - loglog(s)))
        assert band.lo[t] < low[t] and band.hi[t] > high[t]


def test_a_clustered_band_keeps_the_draws_top_where_s_fell_to_0_but_some_draws_did_not() -> None:
    # 12 stories of 2 plays, max_turns 6: s0's plays both end at turn 5, the last endings; s1 has a play
    # censored after 4 turns. S(6) = 0, but a draw without s0 and with s1 keeps S(6) > 0: the band's top is
    # the draws' own (nothing to widen on log(-log S) at S = 0, and no need for the at-risk bound).
    turns = [5, 5, 4, 2] + [1 + (s % 3) for s in range(2, 12) for _ in range(2)]
    cens = [False, False, True, False] + [False] * 20
    names = [f"s{i // 2}" for i in range(24)]
    band = metrics.km_survival(turns, cens, 6, 0.95, names, resamples=400, seed=3)
    ended = 1.0 - np.asarray(cens, dtype=float)
    t_arr = np.asarray(turns)
    groups = resample.clusters(names)
    curves = np.asarray([metrics.product_limit(t_arr[i], ended[i], 6) for i in resample.draws(groups, 400, 3)])
    _, high = resample.percentile(curves, 0.95)
    assert band.s[6] == 0.0 and high[6] > 0
    assert (band.lo[6], band.hi[6]) == (0.0, high[6])
    # Two stories: the t quantile with 1 degree of freedom.
    assert resample.few_stories_factor(2, 0.95) == pytest.approx(
        math.sqrt(2) * stats.t.ppf(0.975, 1) / stats.norm.ppf(0.975)
    )


def test_censoring_after_the_last_ending_is_measured_by_the_share_left_at_risk() -> None:
    # max_turns = 6. A fact ending at turn 1, a commitment one at 2; three plays censored at 3, 3 and 4; one
    # stopped by the turn limit. At risk per turn 0..7: 6 6 5 4 2 1 1 0. After the last ending (turn 2) 4 are
    # still watched; by turn 4 censoring left 2 of them (t = 5: 1/2), by turns 5 and 6 one (t = 6, 7: 1/4).
    turns = np.array([1, 2, 3, 3, 4, 6])
    codes = np.array([ENDINGS.index("fact"), ENDINGS.index("commitment"), -1, -1, -1, -1])
    assert seen_since_last_ending(turns, codes, 6).tolist() == [1, 1, 1, 1, 1, 0.5, 0.25, 0.25]
    # The turn limit alone censors nobody early: every play reached turn 6, the last one ending there.
    assert seen_since_last_ending(np.array([6, 6, 6]), np.array([0, -1, -1]), 6).tolist() == [1.0] * 8
    # Three watched after the last ending (turn 1), censored at 2, 2 and 3: one left at turn 3 (t = 4), and
    # nobody at risk at turn 4: F_fact(5) is F_fact(4), with the share of the last turn anyone was at risk.
    fading = seen_since_last_ending(np.array([1, 2, 2, 3]), np.array([0, -1, -1, -1]), 4)
    assert fading.tolist() == [1, 1, 1, 1, 1 / 3, 1 / 3]
    # An ending in the opening (turn 0) counts: two watched after it, one censored at 2, one at 3.
    assert seen_since_last_ending(np.array([0, 2, 3]), np.array([0, -1, -1]), 4).tolist() == [1, 1, 1, 1, 0.5, 0.5]
    # A last ending that takes everyone still at risk leaves nobody unwatched: 1 again, whatever censoring
    # took before it (three watched after turn 1, two censored at 2: 1/3 at t = 4; the one left ends at 4).
    late = seen_since_last_ending(np.array([1, 2, 2, 4]), np.array([0, -1, -1, 1]), 5)
    assert late.tolist() == [1, 1, 1, 1, 1 / 3, 1, 1]
    assert seen_since_last_ending(np.array([], dtype=np.intp), np.array([], dtype=np.intp), 2).tolist() == [1.0] * 4


def test_incidence_upper_limit_widens_where_the_watched_stories_were_censored() -> None:
    # 40 single-play stories: 20 end by fact over turns 1-4; then 20 more are watched, and either the context
    # fills up (censored at turns 5-8, one left at the limit of 10) or the turn limit stops them at 10.
    ended = [play(f"s{i}", 0, 1 + i % 4) for i in range(20)]
    censored = ended + [play(f"s{i}", 0, 5 + (i - 20) // 5, "context_limit") for i in range(20, 39)]
    censored += [play("s39", 0, 10, "max_turns")]
    limited = ended + [play(f"s{i}", 0, 10, "max_turns") for i in range(20, 40)]
    for ms, share in ((censored, 1 / 20), (limited, 1.0)):
        inc = cumulative_incidence(ms, 10, 0.95, 400, 0)
        # F_fact stops growing after turn 4: at t = 5 and at t = 11 the point and every draw are the same, so
        # are the lower limits; the upper limit at 11 is Jeffreys' at n* x (1 of the 20 watched still at risk).
        p = inc.final("fact")
        assert p == pytest.approx(0.5) and inc.curves["fact"][5] == p and inc.lo["fact"][11] == inc.lo["fact"][5]
        n_up = max(_n_star(p, inc.hi["fact"][5]) * share, 1.0)
        assert inc.hi["fact"][11] == pytest.approx(_jeffreys(p, n_up)[1], abs=1e-9)
        assert (inc.hi["fact"][11] > inc.hi["fact"][5] + 0.1) == (share < 1)


def _jeffreys(p: float, n: float) -> tuple[float, float]:
    x = p * n
    return float(stats.beta.ppf(0.025, x + 0.5, n - x + 0.5)), float(stats.beta.ppf(0.975, x + 0.5, n - x + 0.5))


def _n_star(p: float, hi: float) -> float:
    """The n at which Jeffreys' upper limit of the share p is `hi` (the band's effective size, found back)."""
    return float(optimize.brentq(lambda n: _jeffreys(p, n)[1] - hi, 1.0, 10_000.0))


def test_effective_pass_k_band_by_hand() -> None:
    # Columns: t = 0; 0.4 over 10 observed stories (draws 0.3, 0.5); 0.05 (x = p n* under 1); draws 0 and 1
    # (n* under 1: one trial); 2 stories observed; none all surviving (no spread); all surviving; draws that
    # barely differ (n* capped at the 12 plays with known fates).
    point = np.array([1.0, 0.4, 0.05, 0.5, 0.5, 0.0, 1.0, 0.5])
    many = np.array([[1.0, 0.3, 0.0, 0.0, 0.4, 0.0, 1.0, 0.5], [1.0, 0.5, 0.1, 1.0, 0.6, 0.0, 1.0, 0.5001]])
    observed = np.array([10, 10, 10, 10, 2, 10, 10, 10])
    plays = np.array([40, 40, 40, 40, 8, 40, 40, 12])
    lo, hi = effective_pass_k_band(point, many, observed, plays, 0.95)
    z = stats.norm.ppf(0.975)
    shrink = (z / stats.t.ppf(0.975, 9)) ** 2

    def jeffreys(p: float, n: float) -> tuple[float, float]:
        x = p * n
        return stats.beta.ppf(0.025, x + 0.5, n - x + 0.5), stats.beta.ppf(0.975, x + 0.5, n - x + 0.5)

    assert lo[0] == hi[0] == 1.0
    n1 = 0.24 / (0.01 * 10 / 9) * shrink
    assert (lo[1], hi[1]) == pytest.approx(jeffreys(0.4, n1), abs=1e-9)
    n2 = 0.05 * 0.95 / (0.0025 * 10 / 9) * shrink
    assert 0 < 0.05 * n2 < 1 and (lo[2], hi[2]) == pytest.approx(jeffreys(0.05, n2), abs=1e-9)
    assert (lo[3], hi[3]) == pytest.approx((0.025, 0.975), abs=1e-12)
    # Two stories: variance times 2/1, the shrink on 1 degree of freedom; n* = 0.30 falls to one trial.
    assert 0.25 / (0.01 * 2) * (z / stats.t.ppf(0.975, 1)) ** 2 < 1 and (lo[4], hi[4]) == pytest.approx((0.025, 0.975))
    plain = 10 * 9 / 10 * shrink  # no spread: a binomial share's n* over the 10 stories, through both corrections
    assert (lo[5], hi[5]) == pytest.approx((0.0, stats.beta.ppf(0.975, 0.5, plain + 0.5)), abs=1e-12)
    assert (lo[6], hi[6]) == pytest.approx((stats.beta.ppf(0.025, plain + 0.5, 0.5), 1.0), abs=1e-12)
    assert (lo[7], hi[7]) == pytest.approx(jeffreys(0.5, 12), abs=1e-12)


def test_the_corrected_points_factor_is_unbiased_at_every_small_sheet() -> None:
    # E[C(m - U, c) / C(m, c)] = (1 - p)^c exactly when U ~ Binomial(m, p) and c <= m: summed over every sheet
    # outcome at m = 2, 3, 6 items; the plug-in (1 - U / m)^c is not, for c >= 2.
    for m in (1, 2, 3, 6):
        for p in (0.3, 0.5, 0.8, 0.95):
            mean = sum(stats.binom.pmf(u, m, p) * precision.unbiased_miss(u, m, 3) for u in range(m + 1))
            for c in range(min(m, 3) + 1):
                assert mean[c] == pytest.approx((1 - p) ** c, abs=1e-12)
            plug = sum(stats.binom.pmf(u, m, p) * (1 - u / m) ** 2 for u in range(m + 1))
            assert m < 2 or plug == pytest.approx((1 - p) ** 2 + p * (1 - p) / m)
    # No reviewed item: taken as judged, every conflict real.
    assert list(precision.unbiased_miss(0, 0, 2)) == [1.0, 0.0, 0.0]


def test_no_figure_past_the_last_turn_anyone_was_followed() -> None:
    # Three episodes in flight at 1, 1 and 2 committed turns (censored), cap 8: S(t) rests on the data to t = 3
    # (turn 2's endings, none, are the last seen); turns kept to 8 has no point, only bounds: every story
    # still going ending at turn 3 (S(1..3) = 1: 3 turns) or none before the cap (8 turns).
    turns, censored = [1, 1, 2], [True, True, True]
    assert metrics.identified_to(np.asarray(turns), np.zeros(3), 8) == 3
    rm = metrics.restricted_mean(turns, censored, 8, resamples=20)
    assert math.isnan(rm.value) and (rm.lo, rm.hi, rm.known_to) == (3.0, 8.0, 3)
    # Two at turn 2, one of them ended: S(3) = 1/2, still past the data; least 1 + 1 + 1/2, most that + 5 x 1/2.
    rm = metrics.restricted_mean([1, 2, 2], [True, True, False], 8, resamples=20)
    assert math.isnan(rm.value) and (rm.lo, rm.hi) == pytest.approx((2.5, 5.0))
    # Everyone followed to the end (the last at risk ended): the curve is 0 from there on, a point again.
    done = metrics.restricted_mean([1, 2, 2], [True, False, False], 8, resamples=20)
    assert done.value == pytest.approx(2.0) and done.known_to == -1
    assert metrics.identified_to(np.asarray([1, 2, 2]), np.asarray([0.0, 1.0, 1.0]), 8) == 8
    # The endings at the turn limit: n/e with the share ended by t = 3 and that plus the share still going.
    plays = [EpisodeMetrics(f"s{i}", "context_limit", n, 0.0, 0.0, False, False, False) for i, n in enumerate(turns)]
    inc = cumulative_incidence(plays, 8)
    assert inc.known_to == 3
