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
