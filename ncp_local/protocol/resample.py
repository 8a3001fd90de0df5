"""What every bootstrap of the rig resamples: stories, each with all of its plays.

A run plays each story once, or `trials.count` times. The plays of one story share everything that
makes the story hard or easy to keep (its facts, its commitments, the player's openings), so they
are correlated: resampled as if independent, k plays of a story count its share of the variance k
times over, and an interval comes out as narrow as if there were k times as many stories (up to
1/sqrt(k) of its honest width). So every interval the rig reports draws *stories* with replacement
and takes every play of a drawn story together (a story drawn twice brings all its plays twice).

With one play per story a story is its play, and a draw is exactly the index vector a bootstrap
over episodes draws (`Generator.integers(0, n, size=n)`), from the same stream: a single-play run's
intervals are what they were before this rule existed. This module is the one place that decides;
the readers (the main table, the S(t) band, the incidence curves, pass^k, the auditor-corrected
figures, the re-audit agreement) pass it their episodes' story names and take the draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Clusters:
    """The episodes of a sample grouped by story, in the order the caller listed them."""

    n: int  # episodes
    plays: tuple[np.ndarray, ...]  # per story (first-seen order), the indices of its episodes

    @property
    def clustered(self) -> bool:
        """Whether some story has more than one play: only then do draws differ from episode draws."""
        return len(self.plays) < self.n


def clusters(stories: Sequence[str]) -> Clusters:
    """Group episode indices by their story name (a spec id; trials of a story share it)."""
    at: dict[str, list[int]] = {}
    for i, s in enumerate(stories):
        at.setdefault(s, []).append(i)
    return Clusters(len(stories), tuple(np.asarray(v, dtype=np.intp) for v in at.values()))


def draw(c: Clusters, rng: np.random.Generator) -> np.ndarray:
    """One resample: the indices of the episodes drawn (a story's plays adjacent, in their order)."""
    if not c.clustered:
        return rng.integers(0, c.n, size=c.n)
    picked = rng.integers(0, len(c.plays), size=len(c.plays))
    return np.concatenate([c.plays[i] for i in picked])


def draws(c: Clusters, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """`resamples` draws from one seeded generator (none when there is no episode)."""
    if c.n == 0:
        return
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        yield draw(c, rng)


def percentile(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval of bootstrap draws (axis 0: the draws), NaN draws left out per column."""
    alpha = (1 - level) / 2
    lo, hi = np.nanquantile(values, [alpha, 1 - alpha], axis=0)
    return lo, hi


def few_stories_factor(stories: int, level: float) -> float:
    """How much wider a band drawn from `stories` stories' bootstrap is made for their fewness.

    The bootstrap's variance is the plug-in one, low by (stories - 1) / stories, and a band at the normal
    quantile ignores that the variance itself rests on that many stories: sqrt(G / (G - 1)) * t_{G-1} / z,
    the two small-cluster corrections of Cameron, Gelbach and Miller (2008) for G clusters (1.036 for 50
    stories, 1.061 for 30). 1 for fewer than 2 stories (nothing to correct with).
    """
    if stories < 2:
        return 1.0
    alpha = (1 - level) / 2
    return math.sqrt(stories / (stories - 1)) * float(stats.t.ppf(1 - alpha, stories - 1) / stats.norm.ppf(1 - alpha))


def jeffreys_band(
    point: np.ndarray, n_low: np.ndarray, n_high: np.ndarray, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """Jeffreys' interval of a share `point` read as point x n of n binomial trials (the quantiles of
    Beta(x + 1/2, n - x + 1/2); Brown, Cai and DasGupta 2001), the lower limit at n = `n_low`, the upper
    at `n_high` (the effective sample sizes the caller drew from its bootstrap; they differ where only one
    limit is widened). 0 of n has no lower limit but 0, n of n no upper but 1; a float residue next to
    either end leaves the beta quantile NaN, read as that bound. The band always holds the point.
    Used by the endings' incidence (report/endings.py) and pass^k (report/trials.py)."""
    alpha = (1 - level) / 2
    x_low, x_high = point * n_low, point * n_high
    with np.errstate(invalid="ignore"):
        low = np.where(x_low > 0, stats.beta.ppf(alpha, x_low + 0.5, n_low - x_low + 0.5), 0.0)
        high = np.where(n_high - x_high > 0, stats.beta.ppf(1 - alpha, x_high + 0.5, n_high - x_high + 0.5), 1.0)
    low, high = np.nan_to_num(low, nan=0.0), np.nan_to_num(high, nan=1.0)
    return np.minimum(low, point), np.maximum(high, point)
