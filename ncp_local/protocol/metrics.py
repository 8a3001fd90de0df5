"""Per-episode and aggregate metrics (PROTOCOL section 5).

Everything is computed from an episode's final committed state and its turn
records. `invalid` episodes are counted but kept out of the averages.

Survival and censoring. PROTOCOL section 5 defines S(t) as the share of
episodes with turns >= t: the distribution of the story's length T (turn
records, the conflicting one included), however it ended. So `conflict`,
`max_turns` and `all_resolved` are all observed lengths: each one's story
ended at its turn count, and with only these S(t) is exactly that share.
`context_limit` is the one right-censored termination: the episode stopped
because a call no longer fit the model's window, not because the story
ended, and its length is only known from below. It had `n` committed turns
and turn `n` was under way when the call failed, so T > n: it is censored at
n, at risk for every t <= n + 1 (S(t) = P(T >= t) = P(T > t - 1)). Dropping
such episodes (as `invalid`) would remove exactly the longest survivors.

The Kaplan-Meier estimate is scipy's (`stats.ecdf` on `CensoredData`). Its
band is scipy's Greenwood log-log band when each story was played once (with an exact bound from
the count at risk where Greenwood's variance is 0: `_bounded`), and a bootstrap over stories
(`protocol/resample.py`) when a story was played more than once: its plays are correlated, and
Greenwood's variance, which takes every play for an independent episode, would be up to 1/sqrt(k) too narrow.
That band is the draws' percentile band widened on the log-log scale for the fewness of the stories
(`_widened`, `few_stories_factor`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .records import Checkpoint, EpisodeResult
from .resample import clusters, draws, few_stories_factor, percentile
from .stages import CONFLICT_TYPES

# Every termination a report counts, in table order.
TERMINATIONS: tuple[str, ...] = ("conflict", "max_turns", "all_resolved", "context_limit", "invalid")
# An episode with a checkpoint and no result (still playing, or stopped mid-story): not a termination a
# result can hold, only what a report calls it when it counts such an episode (report/in_flight.py).
IN_FLIGHT = "in_flight"
# A play whose ending conflict a re-auditor did not uphold (report/reaudit_runs.py): nothing was narrated
# after it, so the story is censored there. Not the window's `context_limit`: a comparison says which.
OVERRULED = "overruled"
# Terminations whose story did not end: right-censored at their turn count.
CENSORED: frozenset[str] = frozenset({"context_limit", IN_FLIGHT, OVERRULED})

# What ended a story, for competing risks (report/endings.py): a conflict by its type (two or more
# types in the ending turn: `several_types`), or every achievement resolved. `max_turns` is not an
# ending there but administrative censoring (the story was stopped, not ended), and `context_limit`
# censoring as above; `invalid` episodes stay out, as from every average.
ENDINGS: tuple[str, ...] = ("fact", "commitment", "player_input", "several_types", "all_resolved")
ENDING_CENSORED: tuple[str, ...] = ("max_turns", "context_limit")


@dataclass(frozen=True)
class EpisodeMetrics:
    spec_id: str
    termination: str
    turns: int
    trajectory_progress: float
    satisfied: float
    fact: bool
    commitment: bool
    player_input: bool
    bound_hits: int = 0  # outputs of this episode (opening included) that reached a configured bound
    trial: int = 0  # which play of the story (protocol/trials.py)

    @property
    def censored(self) -> bool:
        return self.termination in CENSORED

    @property
    def ending(self) -> str:
        """An ENDINGS value, else the termination itself (`max_turns`, `context_limit`, `invalid`)."""
        if self.termination != "conflict":
            return self.termination
        hits = {"fact": self.fact, "commitment": self.commitment, "player_input": self.player_input}
        types = [t for t in CONFLICT_TYPES if hits[t]]
        if not types:  # cannot happen: the conflict-check schema admits only these types
            raise ValueError(f"{self.spec_id}: a conflict termination with no conflict type")
        return types[0] if len(types) == 1 else "several_types"


def in_flight_metrics(cp: Checkpoint) -> EpisodeMetrics:
    """An unfinished episode as of its last committed turn: censored there (T > n, as `context_limit`).
    Only its turns count; what the per-episode averages take (progress, conflicts) is not known yet,
    so `aggregate` keeps it out of them."""
    return EpisodeMetrics(
        spec_id=cp.spec_id,
        termination=IN_FLIGHT,
        turns=len(cp.turns),
        trajectory_progress=0.0,
        satisfied=0.0,
        fact=False,
        commitment=False,
        player_input=False,
        trial=cp.trial,
    )


def episode_metrics(result: EpisodeResult) -> EpisodeMetrics:
    state = result.final_state
    nodes = state.node_occurred
    statuses = [s for _, s in state.statuses]
    flags = {t: False for t in CONFLICT_TYPES}
    if result.termination == "conflict":
        # By type: a `response_internal` fact conflict (a contradiction inside
        # the narration) is a fact conflict, an `input` / `player_input` id a
        # player-input one.
        for c in result.turns[-1].conflicts:
            flags[c.type] = True
    return EpisodeMetrics(
        spec_id=result.spec_id,
        termination=result.termination,
        turns=len(result.turns),
        trajectory_progress=sum(nodes) / len(nodes) if nodes else 0.0,
        satisfied=statuses.count("satisfied") / len(statuses) if statuses else 0.0,
        fact=flags["fact"],
        commitment=flags["commitment"],
        player_input=flags["player_input"],
        bound_hits=len(opening_bound_hits(result)) + sum(len(turn_bound_hits(t)) for t in result.turns),
        trial=result.trial,
    )


# Read with defaults: results written before these fields carry none.
def turn_bound_hits(record: object) -> tuple[str, ...]:
    """A turn record's outputs that reached a bound, as "stage:bound" (e.g. "narrate:text_chars")."""
    return tuple(getattr(record, "bound_hits", None) or ())


def opening_bound_hits(result: object) -> tuple[str, ...]:
    """The same for the opening and its fact update."""
    return tuple(getattr(result, "opening_bound_hits", None) or ())


@dataclass(frozen=True)
class Aggregate:
    episodes: int  # all, invalid included
    scored: int  # the ones the averages are over (censored ones included, at their committed turns)
    censored: int  # scored episodes ended by `context_limit`: their turns are a lower bound
    avg_turns: float
    trajectory_pct: float
    satisfied_pct: float
    fact_pct: float
    commitment_pct: float
    player_input_pct: float
    conflict_free: int
    terminations: dict[str, int]
    survival: tuple[float, ...]  # Kaplan-Meier S(t) for t = 0..max_turns
    survival_lo: tuple[float, ...]  # its confidence band, same t
    survival_hi: tuple[float, ...]
    bound_hits: int = 0  # over every episode's committed turns, invalid ones included
    in_flight: int = 0  # unfinished episodes counted in S(t) only, censored at their last committed turn


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def survival(turns: Iterable[int], max_turns: int) -> tuple[float, ...]:
    """PROTOCOL section 5 as written: the share of episodes with turns >= t (no censoring)."""
    turns = list(turns)
    if not turns:
        return tuple(0.0 for _ in range(max_turns + 1))
    return tuple(sum(n >= t for n in turns) / len(turns) for t in range(max_turns + 1))


@dataclass(frozen=True)
class SurvivalCurve:
    s: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]


def at_risk(turns: np.ndarray, size: int) -> np.ndarray:
    """Per turn n = 0..size-1, the episodes that played n turns or more (at risk of turn n's endings)."""
    return np.bincount(turns, minlength=size)[::-1].cumsum()[::-1][:size].astype(float)


def product_limit(turns: np.ndarray, ended: np.ndarray, max_turns: int) -> np.ndarray:
    """S(t) = P(T >= t), t = 0..max_turns, by the product limit over (weighted) endings, in numpy.

    Episode i ends at turns[i] with weight ended[i] and, with weight 1 - ended[i], is still going
    after turns[i] (censored there: at risk for that turn's endings, gone before the next). With
    weights 0 and 1 this is Kaplan-Meier with the module's censoring rule; fractional weights are
    the auditor-corrected curve (report/precision.py). Fast enough to run per bootstrap draw.
    """
    size = max_turns + 1
    turns = np.asarray(turns, dtype=np.intp)
    risk = at_risk(turns, size)
    ends = np.bincount(turns, weights=np.asarray(ended, dtype=float), minlength=size)[:size]
    factor = np.ones(size)
    live = risk > 0
    factor[live] = 1.0 - ends[live] / risk[live]
    # S(t) = P(T > t - 1): the endings of turns 0..t-1 have happened.
    return np.concatenate([[1.0], np.cumprod(factor[:max_turns])])


def identified_to(turns: np.ndarray, ended: np.ndarray, max_turns: int) -> int:
    """The last t <= max_turns at which S(t) rests on the data: the turn after the last anyone was followed
    (S(L + 1) takes turn L's endings, the last turn with someone at risk), or `max_turns` once S has fallen
    to 0 by then (nobody left to follow). Past it the curve is not estimable: the stories still going
    after turn L might all end at L + 1 or none before the cap (docs/guide: no figure past the data)."""
    turns = np.asarray(turns, dtype=np.intp)
    if not len(turns):
        return 0
    last = int(turns.max())
    if last + 1 >= max_turns:
        return max_turns
    return max_turns if product_limit(turns, ended, last + 1)[-1] == 0 else last + 1


def seen_since_last_ending(turns: np.ndarray, codes: np.ndarray, max_turns: int) -> np.ndarray:
    """Per t = 0..max_turns + 1, the share of the episodes still watched after the last ending before t that
    censoring left at risk by t: r(a) / (r(e) - d(e)), at most 1; e the last turn before t with an ending of
    any kind, d(e) its endings, a the last turn before t anyone was at risk, r the episodes at risk. 1 where
    nothing has ended yet, or nobody was censored since.

    `codes`: >= 0 an ending (of any kind), < 0 censored. S(t) and F_k(t) and their variances change only at
    turns with endings, so between the last ending and t they stand still while the stories still watched
    fall away to censoring: at the turn limit of a run with half its plays censored, one or two of 50 are
    left, and the band is as narrow as just after the last ending. Dorey and Korn (1987) scale the variance
    of the Kaplan-Meier lower limit by the fall of the number at risk since the last death for that reason
    (R's survival package, `conf.lower = "modified"`); here the fall counts censoring only (the endings at
    e are in the variance already). The lost stories might have ended by k: an ending's incidence takes
    its upper limit at n* times the share (report/endings.py, `effective_band`).
    """
    size = max_turns + 2
    out = np.ones(size)
    risk = at_risk(turns, size)
    ends = np.bincount(turns[codes >= 0], minlength=size)[:size]
    watched_after_ending = 0.0  # r(e) - d(e) of the last turn e with an ending so far
    for t in range(1, size):
        n = t - 1  # F_k(t) sums the endings of turns n < t
        if ends[n]:
            watched_after_ending = risk[n] - ends[n]
        if risk[n] > 0 and watched_after_ending > 0:
            out[t] = min(1.0, risk[n] / watched_after_ending)
        elif watched_after_ending > 0:  # nobody at risk any more: the share of the last turn anyone was
            out[t] = out[t - 1]
    return out


def km_survival(
    turns: Sequence[int],
    censored: Sequence[bool],
    max_turns: int,
    level: float = 0.95,
    stories: Sequence[str] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> SurvivalCurve:
    """Kaplan-Meier S(t) = P(T >= t), t = 0..max_turns, with a `level` confidence band.

    A censored episode of n turns counts as T > n (module docstring). Without
    censoring this is `survival()` (the product-limit steps telescope to the
    share). `stories` names each episode's story: when one has several plays,
    the band is the percentile band of `resamples` bootstrap draws over stories
    (`protocol/resample.py`), widened on the log-log scale by the small-sample factor of a bootstrap over
    that few stories (`_widened`). Otherwise it is Greenwood's variance on the
    log-log scale (stays in [0, 1] and holds its level better than the linear
    one on the 20-100 episodes of a run). Where that is undefined, before the
    first end (S = 1) or once every episode still at risk has ended (S = 0),
    and where every bootstrap draw agrees, the band is a bound from the count
    at risk (`_bounded`), never the point itself; past the last turn anyone
    was watched its lower limit is 0.
    """
    if len(turns) != len(censored):
        raise ValueError("km_survival: turns and censored differ in length")
    horizon = range(max_turns + 1)
    if not turns:
        zeros = tuple(0.0 for _ in horizon)
        return SurvivalCurve(zeros, zeros, zeros)

    data = stats.CensoredData(
        uncensored=[n for n, c in zip(turns, censored, strict=True) if not c],
        right=[n for n, c in zip(turns, censored, strict=True) if c],
    )
    sf = stats.ecdf(data).sf
    # S(t) = P(T >= t) = P(T > t - 1): scipy's sf is P(T > x).
    at = [t - 1 for t in horizon]
    point = [float(v) for v in sf.evaluate(at)]
    groups = clusters(stories) if stories is not None else None
    t_arr = np.asarray(turns, dtype=np.intp)
    if groups is not None and groups.clustered:
        ended = 1.0 - np.asarray(censored, dtype=float)
        curves = np.asarray([product_limit(t_arr[i], ended[i], max_turns) for i in draws(groups, resamples, seed)])
        low, high = _widened(
            np.asarray(point), *percentile(curves, level), few_stories_factor(len(groups.plays), level)
        )
        # Where every draw agrees (S = 0 or 1) the band has no width; the stories at risk bound it instead.
        names = list(stories or ())
        risk = np.asarray([len({names[i] for i in np.flatnonzero(t_arr >= n)}) for n in horizon], dtype=float)
        return _bounded(point, low, high, risk, level)
    with warnings.catch_warnings():
        # scipy warns where the band is undefined; handled below.
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(confidence_level=level, method="log-log")
        lo, hi = band.low.evaluate(at), band.high.evaluate(at)
    return _bounded(
        point, np.asarray(lo, dtype=float), np.asarray(hi, dtype=float), at_risk(t_arr, max_turns + 1), level
    )


def _widened(point: np.ndarray, low: np.ndarray, high: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentile band's ends moved away from the point `factor` times as far on the log-log scale
    (log(-log S), the scale of the single-play band), where the point and the end are inside (0, 1); an end
    at 0, 1 or NaN stays (`_bounded` handles those). The percentile band over 30-50 stories covered 91-93%
    where 95% was asked (docs/measurements/2026-12-05-estimators.md); `few_stories_factor` is the widening."""

    def loglog(s: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.log(-np.log(s))
        return out

    def move(end: np.ndarray) -> np.ndarray:
        inside = (point > 0) & (point < 1) & (end > 0) & (end < 1)
        safe = np.where(inside, end, 0.5)
        mid = np.where(inside, point, 0.5)
        moved = np.exp(-np.exp(loglog(mid) + factor * (loglog(safe) - loglog(mid))))
        out: np.ndarray = np.where(inside, moved, end)
        return out

    return move(low), move(high)


def _bounded(point: list[float], lo: np.ndarray, hi: np.ndarray, risk: np.ndarray, level: float) -> SurvivalCurve:
    """The band, with a bound where it is undefined (NaN): before the first ending (S = 1) or once every
    episode at risk has ended (S = 0), where Greenwood's variance is 0 and the log-log band undefined.

    There the turn's r episodes at risk (stories, for a clustered band) all went one way, and the exact
    binomial bound for r of r (Clopper and Pearson 1934) bounds the step: S(t) = 1 is bounded below by
    (alpha/2)^(1/r) with r at risk of turn t - 1's endings (the fewest so far: censoring only takes away),
    and S(t) = 0 above by the band's top at the turn n it fell from times 1 - (alpha/2)^(1/r_n). With no
    one at risk the bound is the whole range. S(0) = 1 by definition, with no band.

    Where no one was at risk at turn t - 1, the run watched no story into turn t: S(t) is the curve's last
    value carried on, and the stories censored before might all have ended since, so nothing bounds S(t)
    from below but 0 (the bound the data identify, Manski 1989). The Greenwood band carried on with the
    point covered 91% at the turn limit of 50 single-play stories with half the plays censored, missing
    low (docs/measurements/2026-12-05-estimators.md).
    """
    alpha = (1 - level) / 2
    lo_t, hi_t = [1.0], [1.0]
    for t in range(1, len(point)):
        p = point[t]
        low, high = float(lo[t]), float(hi[t])
        # scipy leaves the log-log band NaN at S = 0 and gives [1, 1] at S = 1: both are the point itself.
        if math.isnan(low) or math.isnan(high) or (low == high == p and p in (0.0, 1.0)):
            if p == 1.0:
                low, high = (alpha ** (1 / risk[t - 1]) if risk[t - 1] > 0 else 0.0), 1.0
            elif p == 0.0:
                n = max(u for u in range(t) if point[u] > 0)  # the turn whose endings took it to 0
                low, high = 0.0, (hi_t[n] * (1 - alpha ** (1 / risk[n])) if risk[n] > 0 else 1.0)
            else:
                low, high = p, p  # not reached: only S = 0 or 1 leave the band undefined
        if risk[t - 1] == 0:
            low = 0.0
        lo_t.append(low)
        hi_t.append(high)
    return SurvivalCurve(tuple(point), tuple(lo_t), tuple(hi_t))


@dataclass(frozen=True)
class RestrictedMean:
    """The restricted mean ("turns kept"): the area under S(t) up to `horizon`, with its band."""

    value: float  # NaN where the horizon is past the data (`identified_to`): lo and hi then bound it
    lo: float
    hi: float
    horizon: int
    known_to: int = -1  # the last turn S(t) rests on the data, where that is before the horizon


def restricted_mean_point(turns: np.ndarray, ended: np.ndarray, horizon: int) -> float:
    """E[min(T, horizon)] = sum over t = 1..horizon of S(t), S by `product_limit` (weights allowed).

    T counts whole turns, so the area under the step function S(t) = P(T >= t) from 0 to the horizon
    is this sum. Without censoring and with the horizon at the turn cap it is exactly avg turns; with
    censored episodes it counts each one's unseen turns by the curve instead of stopping them at
    their committed count, which is what keeps it unbiased where avg turns is low.
    """
    if horizon <= 0 or len(turns) == 0:
        return 0.0
    return float(product_limit(turns, ended, horizon)[1:].sum())


def restricted_mean(
    turns: Sequence[int],
    censored: Sequence[bool],
    horizon: int,
    level: float = 0.95,
    stories: Sequence[str] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> RestrictedMean:
    """The restricted mean of the Kaplan-Meier S(t) to `horizon` turns, with a story-bootstrap band.

    The band is the percentile band of `resamples` draws of stories with all their plays
    (`protocol/resample.py`), also for single-play runs: unlike S(t) at one turn there is no closed
    form the rig already trusts here, and the bootstrap is the one rule every other interval uses.
    Each end is then moved `few_stories_factor` times as far from the point (the factor the clustered
    S(t) band takes, on the mean's own linear scale): the plain band over 30 stories covered 92.5-92.7%
    with 8 plays or 1 (docs/measurements/2026-12-05-estimators.md). Single-play runs take it too: the
    factor corrects a bootstrap over few independent units, and a single-play run's stories are those
    units (S(t)'s single-play band is Greenwood's, not a bootstrap, so it has nothing to correct).
    An empty sample gives 0 [0, 0]. A horizon past the data (`identified_to`: nobody followed that far
    and S(t) not yet 0) gives no point: NaN, with lo and hi the least and most the area can be.
    """
    if len(turns) != len(censored):
        raise ValueError("restricted_mean: turns and censored differ in length")
    if horizon < 0:
        raise ValueError(f"restricted_mean: horizon {horizon} is negative")
    t_arr = np.asarray(turns, dtype=np.intp)
    ended = 1.0 - np.asarray(censored, dtype=float)
    point = restricted_mean_point(t_arr, ended, horizon)
    if not len(t_arr):
        return RestrictedMean(0.0, 0.0, 0.0, horizon)
    known = identified_to(t_arr, ended, horizon)
    if known < horizon:
        # Past the last turn anyone was followed the area is not identified: every story still going ends at
        # once (the least) or none before the horizon (the most). The bounds, not a point (Manski 1989).
        s = product_limit(t_arr, ended, known)
        least = float(s[1:].sum())
        return RestrictedMean(math.nan, least, least + (horizon - known) * float(s[known]), horizon, known)
    groups = clusters(stories if stories is not None else [str(i) for i in range(len(t_arr))])
    values = np.asarray([restricted_mean_point(t_arr[i], ended[i], horizon) for i in draws(groups, resamples, seed)])
    low, high = (float(v) for v in percentile(values, level))
    factor = few_stories_factor(len(groups.plays), level)
    # Widened, the band stays where a restricted mean can be: 0 to the horizon.
    lo_end, hi_end = point - factor * (point - low), point + factor * (high - point)
    return RestrictedMean(point, max(lo_end, 0.0), min(hi_end, float(horizon)), horizon)


def aggregate(
    metrics: list[EpisodeMetrics],
    max_turns: int,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    in_flight: Sequence[EpisodeMetrics] = (),
) -> Aggregate:
    """The finished episodes' averages and counts; S(t) over them and the `in_flight` ones (censored)."""
    scored = [m for m in metrics if m.termination != "invalid"]
    terms = {k: sum(m.termination == k for m in metrics) for k in TERMINATIONS}
    at_risk_of = [*scored, *in_flight]
    curve = km_survival(
        [m.turns for m in at_risk_of],
        [m.censored for m in at_risk_of],
        max_turns,
        level,
        stories=[m.spec_id for m in at_risk_of],
        resamples=resamples,
        seed=seed,
    )
    return Aggregate(
        episodes=len(metrics),
        scored=len(scored),
        censored=sum(m.censored for m in scored),
        avg_turns=_mean([m.turns for m in scored]),
        trajectory_pct=100 * _mean([m.trajectory_progress for m in scored]),
        satisfied_pct=100 * _mean([m.satisfied for m in scored]),
        fact_pct=100 * _mean([float(m.fact) for m in scored]),
        commitment_pct=100 * _mean([float(m.commitment) for m in scored]),
        player_input_pct=100 * _mean([float(m.player_input) for m in scored]),
        conflict_free=sum(m.termination != "conflict" for m in scored),
        terminations=terms,
        survival=curve.s,
        survival_lo=curve.lo,
        survival_hi=curve.hi,
        bound_hits=sum(m.bound_hits for m in metrics),
        in_flight=len(in_flight),
    )


TABLE_HEADER = (
    "| run | episodes | avg turns | traj % | sat % | fact % | commit % | player % "
    "| conflict-free plays | conflict | max_turns | all_resolved | context_limit | invalid | bound hits |"
)


def table_row(name: str, a: Aggregate) -> str:
    t = a.terminations
    return (
        f"| {name} | {a.episodes} | {a.avg_turns:.2f} | {a.trajectory_pct:.2f} | {a.satisfied_pct:.2f} "
        f"| {a.fact_pct:.0f} | {a.commitment_pct:.0f} | {a.player_input_pct:.0f} | {a.conflict_free} "
        f"| {t['conflict']} | {t['max_turns']} | {t['all_resolved']} | {t['context_limit']} | {t['invalid']} "
        f"| {a.bound_hits} |"
    )


def censored_note(a: Aggregate) -> str:
    """The line under a table that says what the averages of censored episodes mean ('' when none)."""
    if not a.censored:
        return ""
    return (
        f"{a.censored} of {a.scored} scored episode(s) censored (context_limit): averaged at their committed "
        "turns (a lower bound); S(t) is the Kaplan-Meier estimate with them censored"
    )


def results_table(rows: list[tuple[str, Aggregate]]) -> str:
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(TABLE_HEADER.count("|") - 1)) + "|"
    notes = [f"{n}: {note}" for n, a in rows if (note := censored_note(a))]
    return "\n".join([TABLE_HEADER, sep, *(table_row(n, a) for n, a in rows), *notes])
