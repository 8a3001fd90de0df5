"""Runs compared on the stories they share: every figure's difference from the baseline, with its test.

The paper's tables are comparisons (six narrators, three auditors, HiAgent against its baseline,
adversarial against natural input), and two overlapping intervals are not a test. For each run after
the first (the baseline) and every figure of the main table, the restricted mean ("turns kept"),
S(t) at the report's turns and each ending's incidence at the horizon, this gives:

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

Stories pair by their spec id, and only when both runs played the same text of it (the manifests'
spec file hashes, when both have them). Runs with different turn caps are compared on what the cap
does not change: the curves' figures up to the smaller cap; the main table's averages and rates
depend on the cap and are left out, in one line. Runs with no story in common are not compared
(mode=compare refuses with exit 2; mode=report leaves the section out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ..protocol.metrics import ENDING_CENSORED, ENDINGS, EpisodeMetrics, product_limit
from ..protocol.resample import percentile
from .endings import aalen_johansen
from .runs import REAUDIT_KIND, Run
from .tables import csv_text, known_to, markdown_table, table_columns
from .trials import NOISE_METRICS, columns_at

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


@dataclass(frozen=True)
class Comparison:
    baseline: str
    other: str
    stories: int  # shared stories the differences rest on
    plays: tuple[int, int]  # scored plays of those stories, baseline then other
    horizon: int
    turns: tuple[int, ...]  # where S(t) is compared
    notes: tuple[str, ...]  # what was left out, and why (one line each)
    rows: tuple[Difference, ...]
    window: tuple[float, float] = (0.0, 0.0)  # share of plays the window stopped, baseline then other


@dataclass(frozen=True)
class Comparisons:
    level: float
    resamples: int
    compared: list[Comparison]
    refused: list[str] = field(default_factory=list)  # pairs with nothing comparable, one line each


def story_hashes(run: Run) -> dict[str, str]:
    """spec id -> the hash of its file, as the run's manifest recorded it ({} when it recorded none)."""
    files = (run.manifest.get("dataset") or {}).get("files") or {}
    return {Path(k).stem: str(v) for k, v in files.items() if Path(k).parent.name == "specs"}


def scored_stories(run: Run) -> dict[str, list[EpisodeMetrics]]:
    """Scored plays by story, in the run's order (a story with every play invalid has none)."""
    out: dict[str, list[EpisodeMetrics]] = {}
    for m in run.metrics():
        if m.termination != "invalid":
            out.setdefault(m.spec_id, []).append(m)
    return out


def shared_stories(base: Run, other: Run) -> list[str]:
    """Stories both runs played with scored plays, the same text when both manifests hash it."""
    a, b = scored_stories(base), scored_stories(other)
    ha, hb = story_hashes(base), story_hashes(other)
    return [s for s in a if s in b and (s not in ha or s not in hb or ha[s] == hb[s])]


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
        self.window = np.asarray([m.termination == "context_limit" for m in every], dtype=bool)
        codes = [-1 if m.ending in ENDING_CENSORED else ENDINGS.index(m.ending) for m in every]
        self.codes = np.asarray(codes, dtype=np.intp)
        cols = table_columns(every)
        cols["conflict_free_pct"] = [100.0 * (m.termination != "conflict") for m in every]
        self.values = np.asarray([cols[k] for k, _ in MEANS], dtype=float).reshape(len(MEANS), len(every))


def window_shares(pool: Pool) -> tuple[float, float]:
    """Each side's share of plays its window stopped (`context_limit`): the censoring that bends the
    as-played figures (MEANS) where the two differ."""
    out = []
    for side in (0, 1):
        n = int(pool.lens[side].sum())
        first = int(pool.starts[side][0]) if n else 0
        out.append(float(pool.window[first : first + n].mean()) if n else 0.0)
    return out[0], out[1]


BENT = frozenset(k for k, _ in MEANS)
HOLDING = "turns kept, S(t) and each ending's % by t"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


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


def compare_pair(
    base: Run,
    other: Run,
    stories: list[str],
    horizon: int | None,
    resamples: int,
    seed: int,
    level: float,
) -> Comparison:
    """One run against the baseline on their shared `stories` (module docstring)."""
    cap_a, cap_b = base.max_turns, other.max_turns
    h = min(cap_a, cap_b) if horizon is None else min(horizon, cap_a, cap_b)
    means = cap_a == cap_b
    notes = []
    known = min(known_to(base), known_to(other))
    if known < h:  # nobody followed that far in one run: the curves stop where its data do
        notes.append(f"the curves are compared to t={known} only: no story was followed further in both runs")
        h = known
    if not means:
        notes.append(
            f"turn caps differ ({cap_a} vs {cap_b}): only the curves' figures to turn {h} are compared "
            "(avg turns and the rates depend on the cap)"
        )
    a, b = scored_stories(base), scored_stories(other)
    # A result file that failed its check is named, as mode=report names it, not passed off as a story one
    # run never played.
    notes += [f"{run.label}: {f}: {why}: not counted" for run in (base, other) for f, why in run.damaged]
    left = len(set(a) - set(stories)) + len(set(b) - set(stories))
    if left:
        notes.append(f"{left} stories played by only one of the two runs (or in another text) are left out")
    if other.manifest.get("kind") == REAUDIT_KIND:
        src = (other.manifest.get("source") or {}).get("path")
        if src and Path(src).resolve() == base.path.resolve():
            notes.append("a re-audit of the baseline's transcripts: the differences are the auditors' alone")
    if 2.0 / 2 ** len(stories) > ALPHA:
        notes.append(
            f"with {len(stories)} stories no p-value can fall below {2.0 / 2 ** len(stories):.2f} (the test "
            "needs 6 or more to reach 5%); the bootstrap intervals are too narrow at this size"
        )
    turns_at = tuple(columns_at(h))
    pool = Pool([[a[s] for s in stories], [b[s] for s in stories]])
    rows = paired_differences(pool, h, turns_at, means, resamples, seed, level)
    window = window_shares(pool)
    if window[0] != window[1]:
        # The as-played figures count a stopped play as if it had ended there; with the windows stopping
        # different shares they differ by that alone (docs/measurements/2026-12-07-corrected-and-censored.md:
        # same narrator, 30% stopped against none, avg turns "differs" in every pair). Their consistent
        # counterparts (turns kept, S(t), each ending by t) keep their verdicts.
        why = (
            f"no verdict: the window stopped {_pct(window[1])} of {other.label}'s plays and {_pct(window[0])} "
            f"of {base.label}'s, which bends this figure; {HOLDING} hold under it"
        )
        rows = tuple(Difference(**{**d.__dict__, "withheld": why}) if d.figure.key in BENT else d for d in rows)
    rows = tuple(sorted(rows, key=lambda d: d.figure.key in BENT))  # the figures censoring cannot bend lead
    return Comparison(
        base.label,
        other.label,
        len(stories),
        (sum(len(a[s]) for s in stories), sum(len(b[s]) for s in stories)),
        h,
        turns_at,
        tuple(notes),
        rows,
        window,
    )


def same_run(a: Run, b: Run) -> bool:
    """One directory given twice, or a copy of it (manifests alike to the moment each run was created)."""
    made = a.manifest.get("created")
    return a.path.resolve() == b.path.resolve() or (made is not None and a.manifest == b.manifest)


def dataset_of(run: Run) -> str:
    d = run.manifest.get("dataset") or {}
    return str(d.get("sha256") or d.get("path") or "?")


def compare_runs(
    runs: Sequence[Run], horizon: int | None = None, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> Comparisons:
    """Every run after the first against the first; Holm over them per figure when more than one."""
    base = runs[0]
    compared: list[Comparison] = []
    refused: list[str] = []
    for other in runs[1:]:
        shared = shared_stories(base, other)
        if same_run(base, other):
            refused.append(f"{other.label} is not compared with {base.label}: it is the same run ({other.path})")
            continue
        if not shared:
            why = (
                "they ran on different datasets"
                if dataset_of(base) != dataset_of(other)
                else "they share no story with scored plays"
            )
            refused.append(f"{other.label} is not compared with {base.label}: {why}, so no story pairs")
            continue
        compared.append(compare_pair(base, other, shared, horizon, resamples, seed, level))
    if len(compared) > 1:
        compared = _with_holm(compared)
    return Comparisons(level, resamples, compared, refused)


def _with_holm(compared: list[Comparison]) -> list[Comparison]:
    keys = {d.figure.key for c in compared for d in c.rows}
    adjusted: dict[tuple[int, str], float] = {}
    for key in keys:
        where = [(i, d) for i, c in enumerate(compared) for d in c.rows if d.figure.key == key]
        for (i, _), q in zip(where, holm([math.nan if d.withheld else d.p for _, d in where]), strict=True):
            adjusted[i, key] = q
    out = []
    for i, c in enumerate(compared):
        rows = tuple(Difference(**{**d.__dict__, "p_holm": adjusted.get((i, d.figure.key), math.nan)}) for d in c.rows)
        out.append(Comparison(**{**c.__dict__, "rows": rows}))
    return out


# ---- text ---------------------------------------------------------------------------------------


def _f(x: float, d: int = 2) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{round(x, d) + 0.0:.{d}f}"


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def sentence(c: Comparison, d: Difference, level: float) -> str:
    """One plain sentence: what the difference is, how sure, and what this design could have found."""
    f = d.figure
    if math.isnan(d.diff):
        return f"{f.label}: not estimable on these plays."
    size = f"{abs(d.diff):.2f} {f.unit}"
    way = "higher" if d.diff > 0 else "lower"
    head = (
        f"{f.label}: {c.other} is {size} {way} than {c.baseline}"
        if d.diff
        else f"{f.label}: {c.other} and {c.baseline} are equal"
    )
    if d.withheld:
        return f"{head}: {d.withheld}."
    p = d.p if math.isnan(d.p_holm) else d.p_holm
    which = "p" if math.isnan(d.p_holm) else "Holm p"
    iv = f"{level:.0%} paired interval {_f(d.lo)} to {_f(d.hi)}, {which} = {_p(p)}"
    if p < ALPHA:
        return f"{head} ({iv}): a difference at the 5% level."
    if math.isinf(d.mdd):
        return f"{head} ({iv}): no difference shown; {c.stories} stories are too few for any to show at 5%."
    if d.mdd == 0:
        return f"{head} ({iv}): no difference shown; the resampled stories never move this figure."
    return (
        f"{head} ({iv}): no difference shown; on {c.stories} stories this design finds one of "
        f"{_f(d.mdd)} {f.unit} 80% of the time."
    )


HEADER = (
    "figure",
    "baseline",
    "run",
    "difference",
    "paired [lo, hi]",
    "unpaired [lo, hi]",
    "p",
    "Holm p",
    "MDD 80%",
)


def comparison_title(c: Comparison) -> str:
    return f"{c.other} vs {c.baseline} (baseline)"


def comparison_rows(c: Comparison) -> list[list[str]]:
    """The table's cells (HEADER's columns), one row per figure, as Markdown and HTML show them."""
    return [
        [
            d.figure.label,
            _f(d.base),
            _f(d.other),
            ("+" if d.diff > 0 else "") + _f(d.diff),
            f"[{_f(d.lo)}, {_f(d.hi)}]",
            f"[{_f(d.unpaired_lo)}, {_f(d.unpaired_hi)}]",
            "no verdict" if d.withheld else _p(d.p),
            "no verdict" if d.withheld else _p(d.p_holm),
            _f(d.mdd),
        ]
        for d in c.rows
    ]


def window_line(c: Comparison) -> str:
    """Each run's share of plays its window stopped, said before any figure."""
    return f"stopped by the window: {c.baseline} {_pct(c.window[0])}, {c.other} {_pct(c.window[1])}"


def comparison_markdown(c: Comparison, level: float) -> str:
    title = (
        f"### {comparison_title(c)}\n\n{c.stories} shared stories, {c.plays[0]} and {c.plays[1]} "
        f"scored plays; restricted mean and incidence to t={c.horizon}; {window_line(c)}"
    )
    body = comparison_rows(c)
    notes = [f"- {n}" for n in c.notes]
    said = [f"- {sentence(c, d, level)}" for d in c.rows]
    return "\n\n".join(p for p in (title, "\n".join(notes), markdown_table(HEADER, body), "\n".join(said)) if p)


def comparisons_note(cs: Comparisons) -> str:
    return (
        f"Differences are run minus baseline over the stories both played. Paired: {cs.level:.0%} percentile "
        f"bootstrap ({cs.resamples} draws) of stories, a drawn story bringing its plays in both runs; unpaired: "
        "each run's stories drawn on their own. p: two-sided paired sign-flip permutation test by story "
        "(each story's two sets of plays swapped with chance 1/2); Holm p: adjusted over the runs compared "
        "with the baseline, per figure. MDD 80%: the difference this design finds 80% of the time with this "
        "test at two-sided 5% (1.96 permutation spreads + 0.84 paired standard errors). S(t) % and the "
        "endings' % are Kaplan-Meier and "
        "Aalen-Johansen estimates, in points."
    )


def comparisons_markdown(cs: Comparisons) -> str:
    parts = [comparisons_note(cs)]
    parts += [f"- {line}" for line in cs.refused]
    parts += [comparison_markdown(c, cs.level) for c in cs.compared]
    return "\n\n".join(parts)


CSV_HEADER = (
    "baseline",
    "run",
    "stories",
    "horizon",
    "figure",
    "baseline_value",
    "run_value",
    "difference",
    "paired_lo",
    "paired_hi",
    "unpaired_lo",
    "unpaired_hi",
    "p",
    "p_holm",
    "mdd_80",
    "no_verdict",
)


def _r(x: float) -> Any:
    return "" if math.isnan(x) else round(x, 6)


def comparisons_csv(cs: Comparisons) -> str:
    body = [
        [
            c.baseline,
            c.other,
            c.stories,
            c.horizon,
            d.figure.key,
            *map(_r, (d.base, d.other, d.diff, d.lo, d.hi, d.unpaired_lo, d.unpaired_hi, d.p, d.p_holm, d.mdd)),
            d.withheld,
        ]
        for c in cs.compared
        for d in c.rows
    ]
    return csv_text(CSV_HEADER, body)
