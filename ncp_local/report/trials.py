"""Trials in the report: pass^k(t), the noise floor, and each story's plays (docs/guide/trials.md).

A run with `trials.count=k` plays each story k times. From a story's plays this reads:

- pass^k'(t), for k' = 1..k: the chance that k' plays of a story all survive t turns. A story with
  c of its n plays surviving t contributes C(c, k') / C(n, k'), the share of its k'-subsets of plays
  that all survive, which is an unbiased estimate of p^k' for a story whose plays survive with
  probability p (each play drawn independently); the stories are averaged, each with one weight.
  A play survives t when it played t turns or more (S(t) = P(T >= t), PROTOCOL section 5);
  `invalid` plays are left out, as from every average.
  Censoring (`context_limit`). A play censored after n turns is known to survive t only up to
  t = n + 1; past that, whether it would have survived is unknown. Leaving it out there (as this
  module once did) drops exactly the plays that were still going, and biases pass^k down (-15% for
  pass^1, -27% for pass^2 at 30% censoring: docs/measurements/2026-12-04-coverage.md). So pass^k is
  an inverse-probability-of-censoring weighted share (Robins and Rotnitzky 1992; for a survival
  probability, Satten and Datta 2001): a play's fate at t is known when it is seen surviving t or
  seen ending before t, which censoring allows with chance G(min(n + 1, t)) for a play that played
  n turns (G: the Kaplan-Meier chance that censoring has not yet hidden a play's fate, pooled over
  the run's plays: `censoring_survival`); a k-subset of a story's plays whose fates are all known
  weighs the product of its plays' 1/G, and pass^k(t) is the weighted share of those subsets that all
  survive, each story weighing one (its subsets' weights over C(n, k)). It is a ratio (Hajek's form of
  the weighting), so it stays in [0, 1] with nothing to cap: the earlier form divided the share seen
  surviving by G(t)^k and capped the result at 1, which biased it down wherever the cap bit
  (docs/measurements/2026-12-05-estimators.md). pass^1 is exactly the Kaplan-Meier S(t) when every
  story has as many plays; with no censoring every weight is 1 and it is C(c, k)/C(n, k) averaged.
- Not estimable. pass^k(t) is reported (point and interval) only where at least `MIN_OBSERVED` (10)
  stories have k plays whose fates at t are known ("observed") and censoring follows at least 10
  stories' k plays through t (the stories with k plays times G(t)^k, `followed`: the weighting's
  positivity; where censoring hides nearly every play still going, the observed stories are those that
  ended and the share reads near 0); elsewhere the table says "not estimable" and why. The rule counts
  stories and censoring, never what the stories showed: an earlier rule also asked for
  5 stories with k plays all surviving and 5 with a play ended, and so showed pass^8(10) over 30
  stories of 8 plays only in the 1 run in 10 where the survivors came out many, reading twice the
  truth and covering 83% there (docs/measurements/2026-12-05-estimators.md).
- pass^k's interval: Jeffreys' interval at the effective sample size (Korn and Graubard 1998; Brown,
  Cai and DasGupta 2001), as the endings' incidence band: the variance from a bootstrap over stories
  (`protocol/resample.py`, each draw recomputing G from the drawn plays), n* = p (1 - p) / v over the
  observed stories, and the quantiles of Beta(n* p + 1/2, n* (1 - p) + 1/2) (`effective_pass_k_band`).
  Where no story (or every story) is seen all surviving it is Jeffreys' bound for 0 (or n) of the n
  observed, never 0 [0, 0] or 100 [100, 100]: the percentile band it replaced collapsed onto the
  point there, which is what the old rule's five on each side guarded against.
  A variance that float arithmetic leaves as a residue of 0 is 0, and the table's notes say where a
  variance is 0 or a band has no width (the sample shows no spread there, not that there is none).
- the noise floor of each main metric (one-way random effects over stories): the within-story
  variance sigma_w^2 (pooled over the stories' plays: the sampling noise of one play), the
  between-story variance sigma_b^2 = max(0, var(story means) - sigma_w^2 * mean(1/n_s)), their ratio,
  and two smallest differences the noise allows to call real at the report's level (z = the normal
  quantile): between two replays of the same stories, z * sqrt(2 * sigma_w^2 / (S * k)), and
  between two runs of S other stories each, z * sqrt(2 * (sigma_b^2 / S + sigma_w^2 / (S * k))),
  with S stories and k plays per story (the harmonic mean of the n_s when they differ). That is
  the difference a test at the report's level calls real half the time (50% power); to find it
  80% of the time the difference must be (z + z_0.80) / z times larger (2.80 / 1.96 = 1.43 at 95%),
  or, for the same difference, about (2.80 / 1.96)^2 = 2.04 times as many plays. The table gives both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import special, stats

from ..protocol.metrics import EpisodeMetrics
from ..protocol.resample import clusters, draws, jeffreys_band
from .runs import Run
from .tables import table_columns

# The main table's per-episode values (tables.table_columns), and the share of plays that ended without a
# conflict, as percentages: the metrics whose noise floor is reported.
NOISE_METRICS: tuple[tuple[str, str], ...] = (
    ("avg_turns", "turns"),
    ("trajectory_pct", "traj %"),
    ("satisfied_pct", "sat %"),
    ("fact_pct", "fact %"),
    ("commitment_pct", "commit %"),
    ("player_input_pct", "player %"),
    ("conflict_free_pct", "conflict-free %"),
)


@dataclass(frozen=True)
class Story:
    """One story's scored plays, in trial order."""

    spec_id: str
    plays: tuple[EpisodeMetrics, ...]


def stories(run: Run) -> list[Story]:
    """The run's stories with their scored plays (`invalid` ones left out), in dataset order."""
    by: dict[str, list[EpisodeMetrics]] = {}
    for m in run.metrics():
        plays = by.setdefault(m.spec_id, [])
        if m.termination != "invalid":
            plays.append(m)
    return [Story(sid, tuple(sorted(ps, key=lambda m: m.trial))) for sid, ps in by.items()]


def trials_of(run: Run) -> int:
    """How many times the run played its stories (the most trials any story has)."""
    return 1 + max((r.trial for r in run.results.values()), default=0)


def seen_surviving(m: EpisodeMetrics, t: int) -> bool:
    """Whether the play is known to have survived t turns: it played t, or it was censored after t - 1
    (a `context_limit` play of n turns had turn n + 1 under way: T > n)."""
    return m.turns + int(m.censored) >= t


def _turn_counts(plays: Sequence[EpisodeMetrics], max_turns: int) -> np.ndarray:
    """[plays, plays ended, plays censored] by turns played, 0..max_turns + 1 (3 x (max_turns + 2))."""
    size = max_turns + 2
    turns = np.minimum(np.asarray([m.turns for m in plays], dtype=np.intp), size - 1)
    cens = np.asarray([m.censored for m in plays], dtype=float)
    return np.stack(
        [
            np.bincount(turns, minlength=size).astype(float),
            np.bincount(turns, weights=1.0 - cens, minlength=size),
            np.bincount(turns, weights=cens, minlength=size),
        ]
    )


def _censoring_from(counts: np.ndarray, max_turns: int) -> np.ndarray:
    plays, ended, hidden = counts
    left = plays[::-1].cumsum()[::-1] - ended  # played n turns or more, and did not end at n
    factor = np.ones(len(plays))
    live = left > 0
    factor[live] = 1.0 - hidden[live] / left[live]
    # G(0) = G(1) = 1; G(t) = the product of the factors of turns 0..t-2.
    return np.concatenate([[1.0, 1.0], np.cumprod(factor[: max(max_turns - 1, 0)])])[: max_turns + 1]


def censoring_survival(plays: Sequence[EpisodeMetrics], max_turns: int) -> np.ndarray:
    """G(t), t = 0..max_turns: the Kaplan-Meier chance that censoring has not hidden a play's survival at t.

    Censoring after n turns hides survival from t = n + 2 on; it competes with the endings of turn n
    (the play was at risk of them and survived them), so its risk set is the plays that played n
    turns and did not end at n. The product telescopes: (plays seen surviving t) = N S(t) G(t), S
    being the Kaplan-Meier S(t) of protocol/metrics.py.
    """
    return _censoring_from(_turn_counts(plays, max_turns), max_turns)


@dataclass(frozen=True)
class Fates:
    """What pass^k reads from a run's plays, per story (rows), play (columns, padded to the most plays a
    story has) and t = 0..max_turns (last axis)."""

    seen: np.ndarray  # bool: the play is seen surviving t
    known: np.ndarray  # bool: its fate at t is known (seen surviving t, or seen ending before t)
    at: np.ndarray  # int: the turn whose censoring survival G weights it, min(turns + 1, t)
    plays: np.ndarray  # int, per story: its scored plays
    counts: np.ndarray  # per story, its _turn_counts (for G, recomputed per bootstrap draw)
    max_turns: int


def fates(story_list: Sequence[Story], max_turns: int) -> Fates:
    most = max((len(s.plays) for s in story_list), default=0)
    shape = (len(story_list), most)
    turns = np.zeros(shape, dtype=np.intp)
    cens = np.zeros(shape, dtype=bool)
    real = np.zeros(shape, dtype=bool)
    for i, s in enumerate(story_list):
        for j, m in enumerate(s.plays):
            turns[i, j], cens[i, j], real[i, j] = m.turns, m.censored, True
    t = np.arange(max_turns + 1)
    seen = real[..., None] & (turns[..., None] + cens[..., None] >= t)
    # An uncensored play that played n < t turns ended at n: its fate at t is known (it did not survive).
    known = seen | ((real & ~cens)[..., None] & (turns[..., None] < t))
    at = np.minimum(turns[..., None] + 1, t)
    counts = np.zeros((len(story_list), 3, max_turns + 2))
    for i, s in enumerate(story_list):
        counts[i] = _turn_counts(s.plays, max_turns)
    return Fates(seen, known, at, real.sum(axis=1), counts, max_turns)


def _pass_k(f: Fates, idx: np.ndarray, k: int) -> np.ndarray:
    """pass^k(t) of the stories `idx` (a bootstrap draw, or every story): the weighted share of their
    k-subsets of plays all seen surviving among those whose fates are known (module docstring); NaN where
    no story has k scored plays or no k-subset's fate is known."""
    size = f.max_turns + 1
    eligible = f.plays[idx] >= k
    if not eligible.any():
        return np.full(size, np.nan)
    idx = idx[eligible]
    g = _censoring_from(f.counts[idx].sum(axis=0), f.max_turns)
    with np.errstate(divide="ignore"):
        inv = np.where(g > 0, 1.0 / np.where(g > 0, g, 1.0), np.nan)
    w = np.where(f.known[idx], inv[f.at[idx]], 0.0)
    # e_k(w) per story and t: the sum over its k-subsets of plays of the product of their weights (the
    # subsets with an unknown fate weigh 0), by the elementary symmetric polynomials' recurrence.
    e = [np.ones((len(idx), size))] + [np.zeros((len(idx), size)) for _ in range(k)]
    for p in range(w.shape[1]):
        for j in range(k, 0, -1):
            e[j] = e[j] + e[j - 1] * w[:, p]
    # The subsets all seen surviving t weigh 1/G(t)^k each, and there are C(c, k) of them.
    surviving = special.comb(f.seen[idx].sum(axis=1), k) * inv**k
    share = 1.0 / special.comb(f.plays[idx], k)  # each story one weight, however many plays it has
    num = (surviving * share[:, None]).sum(axis=0)
    den = (e[k] * share[:, None]).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


def pass_k_curve(story_list: Sequence[Story], k: int, max_turns: int) -> np.ndarray:
    """pass^k(t), t = 0..max_turns (module docstring): over the stories with at least k scored plays."""
    f = fates(story_list, max_turns)
    return _pass_k(f, np.arange(len(story_list)), k)


def pass_k(story_list: Sequence[Story], k: int, t: int) -> float:
    """pass^k at one t (NaN when no story has k scored plays)."""
    return float(pass_k_curve(story_list, k, t)[t])


def pass_k_draws(story_list: Sequence[Story], k: int, max_turns: int, resamples: int, seed: int) -> np.ndarray:
    """pass^k(t) of `resamples` bootstrap draws of stories (rows; protocol/resample.py), G(t) recomputed from
    each draw's plays; (0, max_turns + 1) with no stories."""
    f = fates(story_list, max_turns)
    curves = [_pass_k(f, idx, k) for idx in draws(clusters([s.spec_id for s in story_list]), resamples, seed)]
    return np.asarray(curves).reshape(len(curves), max_turns + 1)


def observed_counts(f: Fates, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per t: the stories with k plays whose fates at t are known (observed), those of them with k plays all
    seen surviving, those with a play seen ending before t, and the plays with known fates at t in those
    stories (what caps the effective sample size, as the episodes cap an ending's)."""
    known = f.known.sum(axis=1)
    observed = (f.plays >= k)[:, None] & (known >= k)
    surviving = (observed & (f.seen.sum(axis=1) >= k)).sum(axis=0)
    ended = (observed & (f.known & ~f.seen).any(axis=1)).sum(axis=0)
    plays = np.where(observed, known, 0).sum(axis=0)
    return observed.sum(axis=0), surviving, ended, plays


def effective_pass_k_band(
    point: np.ndarray, many: np.ndarray, observed: np.ndarray, plays: np.ndarray, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """pass^k(t)'s band (t = 0..max_turns): Jeffreys' interval at the effective sample size (Korn and Graubard
    1998), the variance from the stories' bootstrap draws `many` (rows), as report/endings.py's
    `effective_band` gives an ending's incidence.

    The clusters that carry pass^k(t) are the `observed` stories (k plays with known fates at t), so they
    set the variance's correction (times n / (n - 1)) and the Student quantile's n - 1 degrees of freedom
    that shrinks n* = p (1 - p) / v by (z / t)^2; n* is at most `plays`, the plays they hold with known fates.
    With no spread (p = 0 or 1: no story, or every story, seen all surviving) n* is the observed stories
    through the same corrections: Jeffreys' bound for 0 (or n*) of n*, never a band of zero width. The
    percentile band this replaced collapsed there, so its rule needed five stories on each side, and covered
    83% where so few survived that the rule showed pass^k only in lucky runs (docs/measurements/
    2026-12-05-estimators.md, h58e). pass^k(0) = 1 by definition, with no band.
    """
    alpha = (1 - level) / 2
    n = np.maximum(observed, 2).astype(float)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column of NaN draws: NaN, as wanted
        var = np.nanvar(many, axis=0, ddof=0) * n / (n - 1) if len(many) else np.full(len(point), np.nan)
    z = stats.norm.ppf(1 - alpha)
    shrink = (z / stats.t.ppf(1 - alpha, n - 1)) ** 2
    # No spread (p = 0 or 1): the n* a binomial share over the observed stories has, p (1 - p) / v with
    # v = p (1 - p) / observed, through the same two corrections (Korn and Graubard take n* = n there).
    plain = observed * (n - 1) / n * shrink
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where(var > 0, point * (1 - point) / var * shrink, plain)
    top = np.maximum(plays, 1).astype(float)
    n_eff = np.clip(np.where(np.isfinite(n_eff) & (n_eff > 0), n_eff, plain), 1.0, top)
    low, high = jeffreys_band(point, n_eff, n_eff, level)
    undefined = np.isnan(point)
    low[undefined], high[undefined] = np.nan, np.nan
    low[..., 0], high[..., 0] = point[..., 0], point[..., 0]
    return low, high


def pass_k_band(
    story_list: Sequence[Story], k: int, max_turns: int, resamples: int, seed: int, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """pass^k(t)'s band over `resamples` bootstrap draws of stories: `effective_pass_k_band`."""
    f = fates(story_list, max_turns)
    point = _pass_k(f, np.arange(len(story_list)), k)
    many = pass_k_draws(story_list, k, max_turns, resamples, seed)
    observed, _, _, plays = observed_counts(f, k)
    return effective_pass_k_band(point, many, observed, plays, level)


def followed(f: Fates, k: int) -> np.ndarray:
    """Per t: the stories with k plays times G(t)^k, the chance censoring lets k plays all be followed through
    t (G over those stories' plays, as `_pass_k` weighs them): how many stories' k plays the run could have
    seen surviving t had they all survived. It reads the censoring only, never what the plays showed; G^k is
    the chance the estimator's own weights take (a product of 1/G over the k plays)."""
    eligible = f.plays >= k
    g = _censoring_from(f.counts[eligible].sum(axis=0), f.max_turns)
    return int(eligible.sum()) * g**k


# pass^k(t) is estimable (module docstring) where at least MIN_OBSERVED stories have k plays whose fate at t
# is known, and censoring leaves at least MIN_OBSERVED stories' k plays followed through t (`followed`). Both
# count stories, not what they showed: a rule on the stories seen all surviving (the earlier "5 on each
# side") let pass^k through only in the runs where that count came out high, and read it twice the truth
# there (docs/measurements/2026-12-05-estimators.md, h58e); Jeffreys' band needs no such rule. The second
# is the weighting's positivity: where censoring hides nearly every survivor, the stories observed are those
# that ended, and the weighted share reads near 0 whatever the truth (Petersen et al. 2012).
MIN_OBSERVED = 10


def not_estimable(story_list: Sequence[Story], k: int, max_turns: int) -> tuple[str, ...]:
    """Per t = 0..max_turns, why pass^k(t) is not estimable ('' where it is; t = 0 always is: pass^k(0) = 1)."""
    f = fates(story_list, max_turns)
    observed_n = observed_counts(f, k)[0]
    reach = followed(f, k)
    out = [""]
    for t in range(1, max_turns + 1):
        if observed_n[t] < MIN_OBSERVED:
            out.append(f"{observed_n[t]} stories with {k} plays observed at t={t} (needs {MIN_OBSERVED})")
        elif reach[t] < MIN_OBSERVED:
            out.append(
                f"censoring leaves {reach[t]:.1f} stories' {k} plays followed through t={t} (needs {MIN_OBSERVED})"
            )
        else:
            out.append("")
    return tuple(out)


@dataclass(frozen=True)
class Noise:
    metric: str
    label: str
    mean: float
    within: float  # sigma_w^2
    between: float  # sigma_b^2
    ratio: float  # within / between (inf when between is 0)
    mdd_replay: float  # the smallest real difference between two replays of the same stories
    mdd_runs: float  # ... between two runs of as many other stories
    # The same, found 80% of the time (a test at the report's level finds the two above half the time).
    mdd_replay_80: float = math.nan
    mdd_runs_80: float = math.nan


# The normal quantile of 80% power: a difference of (z + POWER_Z) standard errors is found 80% of the time.
POWER_Z = float(stats.norm.ppf(0.80))


def _values(plays: Sequence[EpisodeMetrics]) -> dict[str, list[float]]:
    cols = table_columns(list(plays))
    cols["conflict_free_pct"] = [100.0 * (m.termination != "conflict") for m in plays]
    return cols


def _zero_below(x: float, scale: float) -> float:
    return 0.0 if abs(x) <= scale else x


def noise_floor(story_list: Sequence[Story], level: float = 0.95) -> list[Noise]:
    """Each main metric's variance within and between stories, and the differences it allows to call real
    (the module's docstring says how). Stories with fewer than two scored plays carry no within-story
    spread and are left out of it; the metric is NaN when no story has two."""
    z = float(stats.norm.ppf(1 - (1 - level) / 2))
    per_story = [(s, _values(s.plays)) for s in story_list if s.plays]
    out = []
    for key, label in NOISE_METRICS:
        groups = [v[key] for _, v in per_story]
        rich = [g for g in groups if len(g) >= 2]
        dof = sum(len(g) - 1 for g in rich)
        if not rich or dof == 0 or len(groups) < 2:
            nan = math.nan
            out.append(Noise(key, label, nan, nan, nan, nan, nan, nan, nan, nan))
            continue
        means = [sum(g) / len(g) for g in groups]
        grand = sum(means) / len(means)
        # What float arithmetic leaves of a variance that is 0 (1e-29 for plays of 100.0 each, 1e-14 for a
        # difference of two equal sums) is 0: else the table prints a ratio like 1.9e16.
        scale = max(1.0, grand * grand) * 1e-9
        within = _zero_below(sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in rich) / dof, scale)
        var_means = _zero_below(sum((m - grand) ** 2 for m in means) / (len(means) - 1), scale)
        inv_n = sum(1 / len(g) for g in groups) / len(groups)
        between = max(0.0, _zero_below(var_means - within * inv_n, scale))
        n_stories, per = len(groups), 1 / inv_n  # harmonic mean of plays per story
        se_replay = math.sqrt(2 * within / (n_stories * per))
        se_runs = math.sqrt(2 * (between / n_stories + within / (n_stories * per)))
        out.append(
            Noise(
                key,
                label,
                grand,
                within,
                between,
                within / between if between > 0 else math.inf if within > 0 else math.nan,  # 0/0: no spread
                z * se_replay,
                z * se_runs,
                (z + POWER_Z) * se_replay,
                (z + POWER_Z) * se_runs,
            )
        )
    return out


@dataclass(frozen=True)
class RunTrials:
    """One run's trials section."""

    label: str
    trials: int
    max_turns: int
    stories: list[Story]
    curves: dict[int, tuple[float, ...]]  # k' -> pass^k'(t), t = 0..max_turns
    survival: tuple[float, ...]  # the run's S(t) (Kaplan-Meier), beside pass^1
    noise: list[Noise]
    bands: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]  # k' -> (lo, hi) of pass^k'(t)
    # k' -> per t, why pass^k'(t) is not estimable ('' where it is; its curve and band are NaN there)
    unestimable: dict[int, tuple[str, ...]] = field(default_factory=dict)


def run_trials(runs: Sequence[Run], level: float = 0.95) -> list[RunTrials]:
    """The trials section of every run that played its stories more than once."""
    out = []
    for run in runs:
        k = trials_of(run)
        if k < 2:
            continue
        ss = stories(run)
        horizon = run.max_turns
        curves, bands, why = {}, {}, {}
        for kk in range(1, k + 1):
            why[kk] = not_estimable(ss, kk, horizon)
            bad = np.asarray([bool(r) for r in why[kk]])
            lo, hi = pass_k_band(ss, kk, horizon, *run.bootstrap, level)
            curves[kk] = _floats(np.where(bad, np.nan, pass_k_curve(ss, kk, horizon)))
            bands[kk] = (_floats(np.where(bad, np.nan, lo)), _floats(np.where(bad, np.nan, hi)))
        agg = run.aggregate(level)
        out.append(RunTrials(run.label, k, horizon, ss, curves, agg.survival, noise_floor(ss, level), bands, why))
    return out


def _floats(xs: np.ndarray) -> tuple[float, ...]:
    return tuple(float(x) for x in xs)


def columns_at(max_turns: int) -> list[int]:
    """The turns the markdown table shows: 1, the quarters, and the limit."""
    return sorted({t for t in (1, max_turns // 4, max_turns // 2, 3 * max_turns // 4, max_turns) if t >= 1})
