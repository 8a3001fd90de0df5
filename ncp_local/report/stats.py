"""Small statistics for reports: bootstrap intervals, agreement, correlation.

Correlations and ranks are scipy's, as is Kaplan-Meier survival with its
confidence band (`protocol/metrics.km_survival`); the bootstrap draws whole
episodes with one shared index per resample (numpy), and Cohen's kappa is
its two-line formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    point: float
    lo: float
    hi: float


def bootstrap(
    columns: Mapping[str, Sequence[float]],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    reduce: str = "mean",
    groups: Sequence[str] | None = None,
) -> dict[str, Interval]:
    """Percentile intervals over episodes; one shared set of resamples for every column.

    Resampling whole episodes (the same index draw for every column) keeps the
    columns' dependence, and a fixed seed makes the table reproducible.
    `reduce` is `mean` or `sum` (a count such as conflict-free runs).
    `groups` (one per value, e.g. each episode's story) resamples groups instead: the values of a
    drawn group move together (a story's trials), and a mean is over the drawn groups' values.
    """
    names = list(columns)
    data = np.asarray([np.asarray(columns[k], dtype=float) for k in names])
    if data.ndim != 2 or data.shape[1] == 0:
        return {k: Interval(math.nan, math.nan, math.nan) for k in names}
    if groups is not None and len(set(groups)) < len(groups):
        return _group_bootstrap(names, data, list(groups), resamples, seed, level, reduce)
    n = data.shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    alpha = (1 - level) / 2
    out = {}
    for i, k in enumerate(names):
        draws = data[i][idx]
        stat = draws.sum(axis=1) if reduce == "sum" else draws.mean(axis=1)
        point = float(data[i].sum() if reduce == "sum" else data[i].mean())
        lo, hi = np.quantile(stat, [alpha, 1 - alpha])
        out[k] = Interval(point, float(lo), float(hi))
    return out


def _group_bootstrap(
    names: list[str], data: np.ndarray, groups: list[str], resamples: int, seed: int, level: float, reduce: str
) -> dict[str, Interval]:
    """`bootstrap` over groups: each resample draws as many groups as there are, with replacement."""
    keys = list(dict.fromkeys(groups))
    at = {g: i for i, g in enumerate(keys)}
    member = np.asarray([at[g] for g in groups])
    sizes = np.bincount(member, minlength=len(keys)).astype(float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(resamples, len(keys)))
    alpha = (1 - level) / 2
    out = {}
    for i, k in enumerate(names):
        sums = np.bincount(member, weights=data[i], minlength=len(keys))
        total = sums[idx].sum(axis=1)
        stat = total if reduce == "sum" else total / sizes[idx].sum(axis=1)
        point = float(data[i].sum() if reduce == "sum" else data[i].mean())
        lo, hi = np.quantile(stat, [alpha, 1 - alpha])
        out[k] = Interval(point, float(lo), float(hi))
    return out


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Cohen's kappa for two raters' yes/no labels on the same items.

    Undefined (NaN) when chance agreement is 1, i.e. both raters gave one
    and the same label to every item: report the raw agreement then.
    """
    if len(a) != len(b):
        raise ValueError("raters labelled different numbers of items")
    n = len(a)
    if n == 0:
        return math.nan
    x = np.asarray(a, dtype=bool)
    y = np.asarray(b, dtype=bool)
    p_o = float(np.mean(x == y))
    pa, pb = float(x.mean()), float(y.mean())
    p_e = pa * pb + (1 - pa) * (1 - pb)
    if p_e >= 1.0:
        return math.nan
    return (p_o - p_e) / (1 - p_e)


def confusion(a: Sequence[bool], b: Sequence[bool]) -> dict[str, int]:
    """2x2 counts, first rater first: yes_yes, yes_no, no_yes, no_no."""
    out = {"yes_yes": 0, "yes_no": 0, "no_yes": 0, "no_no": 0}
    for x, y in zip(a, b, strict=True):
        out[("yes" if x else "no") + "_" + ("yes" if y else "no")] += 1
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """NaN when either side has no variance (the coefficient is undefined)."""
    if len(x) != len(y):
        raise ValueError("pearson: lengths differ")
    if len(x) < 2 or np.ptp(np.asarray(x, dtype=float)) == 0 or np.ptp(np.asarray(y, dtype=float)) == 0:
        return math.nan
    return float(stats.pearsonr(np.asarray(x, dtype=float), np.asarray(y, dtype=float)).statistic)


def ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    return stats.rankdata(np.asarray(x, dtype=float), method="average")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r of the ranks (ties at their average rank); NaN when either side is constant."""
    if len(x) != len(y):
        raise ValueError("spearman: lengths differ")
    if len(x) < 2 or np.ptp(np.asarray(x, dtype=float)) == 0 or np.ptp(np.asarray(y, dtype=float)) == 0:
        return math.nan
    return float(stats.spearmanr(np.asarray(x, dtype=float), np.asarray(y, dtype=float)).statistic)


def bootstrap_stat(
    n: int, stat: Callable[[np.ndarray], float], resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> Interval:
    """A percentile interval for any statistic of n resampled units (episodes), given their indices.

    For statistics the column means of `bootstrap` do not cover (kappa over the turns of the drawn
    episodes, correlations). Draws where the statistic is undefined (NaN: no variance) are left out;
    all of them undefined gives a NaN interval around the point estimate.
    """
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    point = float(stat(np.arange(n)))
    rng = np.random.default_rng(seed)
    draws = np.asarray([stat(rng.integers(0, n, size=n)) for _ in range(resamples)], dtype=float)
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return Interval(point, math.nan, math.nan)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(draws, [alpha, 1 - alpha])
    return Interval(point, float(lo), float(hi))
