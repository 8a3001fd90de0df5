"""Small statistics for reports: bootstrap intervals, agreement, correlation.

Correlations and ranks are scipy's, as is Kaplan-Meier survival with its
confidence band (`protocol/metrics.km_survival`); the bootstrap draws
stories with all their plays, or episodes when each story was played once
(`protocol/resample.py`), one shared draw per resample for every column; and
Cohen's kappa is its two-line formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..protocol.resample import clusters, draws


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
    """Percentile intervals of column means (or sums); one shared set of resamples for every column.

    Each draw takes whole episodes (the same draw for every column), which keeps the columns'
    dependence, and a fixed seed makes the table reproducible. `groups` names each value's story:
    draws follow `protocol/resample.py` (stories with all their plays when one has several;
    episodes otherwise), and a mean is over the drawn stories' plays.
    `reduce` is `mean` or `sum` (a count such as conflict-free runs).
    """
    names = list(columns)
    data = np.asarray([np.asarray(columns[k], dtype=float) for k in names])
    if data.ndim != 2 or data.shape[1] == 0:
        return {k: Interval(math.nan, math.nan, math.nan) for k in names}
    n = data.shape[1]
    units = clusters(groups if groups is not None else [str(i) for i in range(n)])
    alpha = (1 - level) / 2
    out = {}
    if units.clustered:
        picks = list(draws(units, resamples, seed))
        stats_of = {
            k: np.asarray([data[i][idx].sum() if reduce == "sum" else data[i][idx].mean() for idx in picks])
            for i, k in enumerate(names)
        }
    else:
        # One matrix of draws: the same stream as one draw at a time (resample.draw), reduced at once.
        idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
        stats_of = {
            k: data[i][idx].sum(axis=1) if reduce == "sum" else data[i][idx].mean(axis=1) for i, k in enumerate(names)
        }
    for i, k in enumerate(names):
        point = float(data[i].sum() if reduce == "sum" else data[i].mean())
        lo, hi = np.quantile(stats_of[k], [alpha, 1 - alpha])
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
    n: int,
    stat: Callable[[np.ndarray], float],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    groups: Sequence[str] | None = None,
) -> Interval:
    """A percentile interval for any statistic of n resampled episodes, given their indices.

    For statistics the column means of `bootstrap` do not cover (kappa over the turns of the drawn
    episodes, correlations). `groups` names each episode's story: draws follow
    `protocol/resample.py`. Draws where the statistic is undefined (NaN: no variance) are left out;
    all of them undefined gives a NaN interval around the point estimate.
    """
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    point = float(stat(np.arange(n)))
    units = clusters(groups if groups is not None else [str(i) for i in range(n)])
    values = np.asarray([stat(idx) for idx in draws(units, resamples, seed)], dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return Interval(point, math.nan, math.nan)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return Interval(point, float(lo), float(hi))
