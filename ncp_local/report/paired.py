"""The paired statistics of two runs on the stories they share: each figure's difference, its paired and
unpaired intervals, the paired sign-flip test, the minimum detectable difference and Holm's adjustment.

For each figure of the main table, the restricted mean ("turns kept"), S(t) at the report's turns and
each ending's incidence at the horizon (report/compare.py says which runs and stories):

- the difference, other run minus baseline, over the stories both runs played;
- its paired interval: a percentile bootstrap that draws stories with replacement, a drawn story
  bringing all of its plays in *every* run (`protocol/resample.py`'s rule, applied to both runs at
  once). What makes a story easy or hard then cancels in the difference;
- the unpaired interval beside it: each run's stories drawn on their own, as if the runs had played
  different stories. The gap between the two widths is what pairing bought;
- a two-sided p-value by story from a paired sign-flip permutation test: under "the two runs do
  not differ", the labels of a story's plays (this run / the baseline) are exchangeable, so each
  resample swaps every story's two sets of plays with chance 1/2 and recomputes the figure; p is
  the share of resamples at least as far from 0 as the observed difference, (1 + hits) / (1 + R).
  Chosen over a bootstrap p-value because its size is exact at any number of stories (a bootstrap
  test leans on large-sample symmetry and runs liberal at 30-50 stories), it needs no variance
  formula for the Kaplan-Meier and Aalen-Johansen figures, and it is defined for a story played
  once in one run and three times in the other. Its floor is 2 / 2^S with S stories (0.25 at 3);
- the minimum detectable difference: the difference this design (these stories, these plays)
  finds 80% of the time with this two-sided 5% test, z_0.975 * (the permutation distribution's
  standard deviation) + z_0.80 * SE, SE the paired bootstrap's standard deviation (2.80 SE when the
  two spreads agree; more where the effect is large per story, which widens the permutation
  distribution);
- with more than two runs, Holm-adjusted p-values over the runs compared with the baseline, one
  family per figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..protocol.metrics import ENDING_CENSORED, ENDINGS, EpisodeMetrics, product_limit
from ..protocol.resample import percentile
from .endings import aalen_johansen
from .tables import table_columns
from .trials import NOISE_METRICS

ALPHA = 0.05  # the test's two-sided size, fixed whatever report.level is (the intervals follow the level)
POWER = 0.80
Z_TEST = float(stats.norm.ppf(1 - ALPHA / 2))  # 1.96
Z_POWER = float(stats.norm.ppf(POWER))  # 0.84

# The main table's averages and rates (tables.METRICS without turns kept, and conflict-free as a share): the
# metrics the noise floor reports (trials.NOISE_METRICS), headed as the main table heads them.
MEANS: tuple[tuple[str, str], ...] = tuple(
    (key, "avg turns" if key == "avg_turns" else label) for key, label in NOISE_METRICS
)


@dataclass(frozen=True)
class Figure:
    key: str  # as in compare.csv: avg_turns, turns_kept, S(5), fact_at_h
    label: str  # as the table heads it
    unit: str  # how a sentence counts it: "turns", "points"


@dataclass(frozen=True)
class Difference:
    figure: Figure
    base: float
    other: float
    diff: float  # other - base
    lo: float  # paired interval
    hi: float
    unpaired_lo: float
    unpaired_hi: float
    p: float  # paired sign-flip permutation, two-sided
    mdd: float  # found 80% of the time at two-sided 5%
    p_holm: float = math.nan  # set when more than one run is compared with the baseline
    withheld: str = ""  # why this figure gets no verdict ("" when it gets one)


class Pool:
    """Both runs' plays of the shared stories in one set of arrays, indexed per story and side."""

    def __init__(self, sides: Sequence[Sequence[Sequence[EpisodeMetrics]]]) -> None:
        every = [m for side in sides for story in side for m in story]
        # Per side, where each story's plays start in the arrays and how many there are.
        self.starts: list[np.ndarray] = []
        self.lens: list[np.ndarray] = []
        start = 0
        for side in sides:
            lens = np.asarray([len(story) for story in side], dtype=np.intp)
            self.starts.append(start + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.intp))
            self.lens.append(lens)
            start += int(lens.sum())
        self.turns = np.asarray([m.turns for m in every], dtype=np.intp)
        self.ended = np.asarray([0.0 if m.censored else 1.0 for m in every])
        self.terminations = np.asarray([m.termination for m in every])
        codes = [-1 if m.censored or m.ending in ENDING_CENSORED else ENDINGS.index(m.ending) for m in every]
        self.codes = np.asarray(codes, dtype=np.intp)
        cols = table_columns(every)
        cols["conflict_free_pct"] = [100.0 * (m.termination != "conflict") for m in every]
        self.values = np.asarray([cols[k] for k, _ in MEANS], dtype=float).reshape(len(MEANS), len(every))


def shares(pool: Pool, termination: str = "context_limit") -> tuple[float, float]:
    """Each side's share of plays that ended `termination`: by default the window's stops (`context_limit`),
    the censoring that bends the as-played figures (MEANS) where the two differ; a re-audit's `overruled`
    plays are censored too, for another reason."""
    out = []
    for side in (0, 1):
        n = int(pool.lens[side].sum())
        first = int(pool.starts[side][0]) if n else 0
        out.append(float((pool.terminations[first : first + n] == termination).mean()) if n else 0.0)
    return out[0], out[1]


def figures_of(horizon: int, turns_at: Sequence[int], means: bool) -> list[Figure]:
    out = [Figure(k, label, "turns" if k == "avg_turns" else "points") for k, label in MEANS] if means else []
    out.append(Figure("turns_kept", "turns kept", "turns"))
    out += [Figure(f"S({t})", f"S({t}) %", "points") for t in turns_at]
    out += [Figure(f"{e}_at_h", f"{e} % by t={horizon}", "points") for e in ENDINGS]
    return out


def measurer(pool: Pool, horizon: int, turns_at: Sequence[int], means: bool) -> Callable[[np.ndarray], np.ndarray]:
    at = np.asarray(turns_at, dtype=np.intp)

    def measure(idx: np.ndarray) -> np.ndarray:
        s = product_limit(pool.turns[idx], pool.ended[idx], horizon)
        parts = [pool.values[:, idx].mean(axis=1)] if means else []
        parts.append(np.asarray([s[1:].sum()]))
        parts.append(100 * s[at])
        # Each ending's share of the stories within the horizon, its last turn included.
        parts.append(100 * aalen_johansen(pool.turns[idx], pool.codes[idx], horizon)[:, horizon + 1])
        return np.concatenate(parts)

    return measure


def take(pool: Pool, side: int, picks: np.ndarray) -> np.ndarray:
    """The pool indices of every play of the picked stories of one side (a story picked twice: twice)."""
    lens = pool.lens[side][picks]
    if not lens.size:
        return np.zeros(0, dtype=np.intp)
    firsts = pool.starts[side][picks]
    # Each play's index: its story's first index plus its rank within the story.
    offsets = np.cumsum(lens) - lens
    return np.repeat(firsts - offsets, lens) + np.arange(int(lens.sum()), dtype=np.intp)


def sign_flips(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Which stories swap their runs' plays, one row per resample: all 2^n patterns when there are no
    more than `resamples` of them (the exact permutation distribution), else `resamples` random rows."""
    if 2**n <= resamples:
        return ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
    return rng.random((resamples, n)) < 0.5


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (NaN p-values stay NaN and do not count)."""
    known = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m = len(known)
    out = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def sign_flip(
    measure: Callable[[np.ndarray], np.ndarray], pool: Pool, resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per figure, the two-sided paired sign-flip permutation p-value of side 1 minus side 0 (module
    docstring), and the spread (standard deviation) of the permutation distribution it is read from."""
    n = len(pool.lens[0])
    every = np.arange(n)
    observed = measure(take(pool, 1, every)) - measure(take(pool, 0, every))
    flips = sign_flips(n, resamples, rng)
    flipped = []
    for swap in flips:
        kept, swapped = every[~swap], every[swap]
        side_a = np.concatenate([take(pool, 0, kept), take(pool, 1, swapped)])
        side_b = np.concatenate([take(pool, 1, kept), take(pool, 0, swapped)])
        flipped.append(measure(side_b) - measure(side_a))
    # A resample as far from 0 as the observation counts (ties: the float noise of equal sums).
    null = np.asarray(flipped)
    far = np.abs(null) >= np.abs(observed) - 1e-9
    spread = null.std(axis=0) if len(null) > 1 else np.full(len(observed), math.nan)
    if len(flips) == 2**n:  # exact: the share of all patterns, the observed one among them
        return np.asarray(far.mean(axis=0), dtype=float), spread
    return np.asarray((1 + far.sum(axis=0)) / (1 + len(flips)), dtype=float), spread


def sign_flip_p(
    measure: Callable[[np.ndarray], np.ndarray], pool: Pool, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """The p-values of `sign_flip` alone."""
    return sign_flip(measure, pool, resamples, rng)[0]


def paired_differences(
    pool: Pool, horizon: int, turns_at: Sequence[int], means: bool, resamples: int, seed: int, level: float
) -> tuple[Difference, ...]:
    """Every figure's difference, side 1 minus side 0 of `pool`, with its intervals, p-value and MDD."""
    measure = measurer(pool, horizon, turns_at, means)
    n = len(pool.lens[0])
    every = np.arange(n)
    fa, fb = measure(take(pool, 0, every)), measure(take(pool, 1, every))
    observed = fb - fa
    rng = np.random.default_rng(seed)
    paired, unpaired = [], []
    for _ in range(resamples):
        ks = rng.integers(0, n, size=n)
        paired.append(measure(take(pool, 1, ks)) - measure(take(pool, 0, ks)))
        ka, kb = rng.integers(0, n, size=n), rng.integers(0, n, size=n)
        unpaired.append(measure(take(pool, 1, kb)) - measure(take(pool, 0, ka)))
    p, spread = sign_flip(measure, pool, resamples, rng)
    p_lo, p_hi = percentile(np.asarray(paired), level)
    u_lo, u_hi = percentile(np.asarray(unpaired), level)
    se = np.std(np.asarray(paired), axis=0, ddof=1) if resamples > 1 else np.full(len(observed), math.nan)
    # The test rejects past about z_0.975 times its permutation distribution's spread; the difference found
    # 80% of the time lies z_0.80 of its own standard errors beyond that. (The permutation spread includes
    # the effect itself, so this is more than 2.80 standard errors where the effect is large per story:
    # the sign-flip test's price for its exact size.) Below 6 stories it cannot reach 5% at all.
    mdd = Z_TEST * spread + Z_POWER * se if 2.0 / 2**n <= ALPHA else np.full(len(observed), math.inf)
    return tuple(
        Difference(
            fig,
            float(fa[i]),
            float(fb[i]),
            float(observed[i]),
            float(p_lo[i]),
            float(p_hi[i]),
            float(u_lo[i]),
            float(u_hi[i]),
            float(p[i]),
            float(mdd[i]),
        )
        for i, fig in enumerate(figures_of(horizon, turns_at, means))
    )
