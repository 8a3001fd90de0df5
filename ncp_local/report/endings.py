"""What ended each story: the cumulative incidence of each ending over turns (competing risks).

S(t) says how many stories were still going after t turns; the endings compete for the rest. For
each ending k of `protocol.metrics.ENDINGS` (a conflict by its type, or every achievement
resolved), F_k(t) is the chance that a story ended by k having played fewer than t turns, so that

    F_fact(t) + F_commitment(t) + F_player_input(t) + F_several_types(t) + F_all_resolved(t) + S(t) = 1

at every t = 0..max_turns, S(t) = P(T >= t) being the report's Kaplan-Meier survival
(`protocol.metrics.km_survival`). The curves go one step further, to t = max_turns + 1: there they
hold every ending of the run, the last turn's included, and the rest is the share the turn limit
stopped (`still_going`). `max_turns` is administrative censoring (the run stopped the story; it
did not end) and `context_limit` censoring as in S(t); `invalid` episodes stay out, as from every
average. The estimator is Aalen-Johansen. Turns are whole numbers, so it is a sum over turns: with
r_n stories at risk at turn n (played n turns or more), d_kn of them ended by k at turn n, and
S(n) the Kaplan-Meier chance to reach turn n,

    F_k(t) = sum over n < t of S(n) d_kn / r_n,

in numpy here (one pass of bincounts, fast enough to run per bootstrap draw). tests/test_endings.py
checks it against lifelines' `AalenJohansenFitter` with tied times spread apart deterministically.
An episode censored at n turns counts in the risk set of the endings at turn n and leaves before
turn n + 1, as in the report's S(t); the order of endings inside a turn changes nothing.

Intervals. F_k(t)'s band is Jeffreys' binomial interval at the effective sample size
(Korn and Graubard 1998), the variance from a bootstrap over stories, each with all its plays
(`protocol/resample.py`; over episodes when each story was played once): `effective_band`. Its upper
limit takes the effective size times the share of the episodes watched after the last ending that
censoring left at risk by t (after Dorey and Korn 1987): `seen_since_last_ending`. The
percentile interval of the same draws, used before, covered 86-92% for common endings over 30-50
stories, 55-83% for a 3% one, and gave [0, 0] for an ending with no events
(docs/measurements/2026-12-05-estimators.md).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from ..protocol.metrics import (
    ENDING_CENSORED,
    ENDINGS,
    EpisodeMetrics,
    at_risk,
    identified_to,
    product_limit,
    seen_since_last_ending,
)
from ..protocol.resample import clusters, draws, jeffreys_band
from .runs import Run
from .tables import csv_text, markdown_table

# Turn bands of the endings table (the and the paper's reading of a 100-turn run).
BANDS: tuple[tuple[int, int], ...] = ((1, 5), (6, 10), (11, 20), (21, 50), (51, 100))
# Table rows: the endings, then what does not end a story here.
ENDING_ROWS: tuple[str, ...] = (*ENDINGS, *ENDING_CENSORED, "invalid")


@dataclass(frozen=True)
class Incidence:
    """F_k(t) for t = 0..max_turns + 1, per ending; and how many episodes they rest on."""

    max_turns: int
    curves: dict[str, tuple[float, ...]]  # ENDINGS -> F_k(0..max_turns + 1)
    episodes: int  # scored episodes (invalid ones left out)
    censored: dict[str, int]  # ENDING_CENSORED -> episodes
    lo: dict[str, tuple[float, ...]] = field(default_factory=dict)  # the band, per ending ({} if none drawn)
    hi: dict[str, tuple[float, ...]] = field(default_factory=dict)
    known_to: int = -1  # past the data: the last t the curves rest on, before max_turns + 1 (-1: none such)

    def total(self, t: int) -> float:
        """1 - S(t): every ending's share before turn t."""
        return math.fsum(c[t] for c in self.curves.values())

    def final(self, ending: str) -> float:
        """The share ended by `ending` within the run's turns, the last one included."""
        return self.curves[ending][self.max_turns + 1]

    @property
    def still_going(self) -> float:
        """The share no ending reached within the run's turns: the turn limit stopped them."""
        return 1.0 - self.total(self.max_turns + 1)


def _codes(scored: Sequence[EpisodeMetrics]) -> tuple[np.ndarray, np.ndarray]:
    """Turns played, and what ended each episode: k for ENDINGS[k], -1 for censoring (ENDING_CENSORED)."""
    turns = np.asarray([m.turns for m in scored], dtype=np.intp)
    # An episode in flight (report/in_flight.py) is censored like the ENDING_CENSORED ones.
    codes = np.asarray([-1 if m.ending in ENDING_CENSORED or m.censored else ENDINGS.index(m.ending) for m in scored])
    return turns, codes.astype(np.intp)


def aalen_johansen(turns: np.ndarray, codes: np.ndarray, max_turns: int) -> np.ndarray:
    """F_k(t) for every ending k (rows, ENDINGS order) and t = 0..max_turns + 1 (module docstring)."""
    size = max_turns + 2
    out = np.zeros((len(ENDINGS), size))
    if turns.size == 0:
        return out
    risk = at_risk(turns, size)
    ends = np.stack([np.bincount(turns[codes == k], minlength=size)[:size] for k in range(len(ENDINGS))])
    hazard = np.zeros((len(ENDINGS), size))
    live = risk > 0
    hazard[:, live] = ends[:, live] / risk[live]
    # S(n), the chance to reach turn n before its endings: the product limit over every ending.
    reach = product_limit(turns, codes >= 0, max_turns + 1)
    out[:, 1:] = np.cumsum(reach * hazard, axis=1)[:, :-1]
    return out


def cumulative_incidence(
    metrics: Sequence[EpisodeMetrics],
    max_turns: int,
    level: float = 0.95,
    resamples: int = 0,
    seed: int = 0,
) -> Incidence:
    """Aalen-Johansen F_k(t), t = 0..max_turns + 1, for every ending k (module docstring); with `resamples`
    bootstrap draws over stories, each curve's percentile band at `level`."""
    scored = [m for m in metrics if m.termination != "invalid"]
    censored = {c: sum(m.ending == c for m in scored) for c in ENDING_CENSORED}
    turns, codes = _codes(scored)
    point = aalen_johansen(turns, codes, max_turns)
    curves = {e: tuple(float(x) for x in point[k]) for k, e in enumerate(ENDINGS)}
    lo: dict[str, tuple[float, ...]] = {}
    hi: dict[str, tuple[float, ...]] = {}
    if resamples and scored:
        units = clusters([m.spec_id for m in scored])
        many = np.asarray([aalen_johansen(turns[i], codes[i], max_turns) for i in draws(units, resamples, seed)])
        fading = seen_since_last_ending(turns, codes, max_turns)
        low, high = effective_band(point, many, len(units.plays), len(scored), level, fading)
        lo = {e: tuple(float(x) for x in low[k]) for k, e in enumerate(ENDINGS)}
        hi = {e: tuple(float(x) for x in high[k]) for k, e in enumerate(ENDINGS)}
    known = identified_to(turns, (codes >= 0).astype(float), max_turns + 1)
    return Incidence(max_turns, curves, len(scored), censored, lo, hi, known if known <= max_turns else -1)


def effective_band(
    point: np.ndarray,
    many: np.ndarray,
    stories: int,
    episodes: int,
    level: float,
    fading: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The band of each F_k(t) (rows, columns: point's shape): Jeffreys' interval at the effective sample size
    (Korn and Graubard 1998), the variance from the stories' bootstrap draws `many`.

    A share p with variance v is as precise as a binomial share of n* = p (1 - p) / v trials, and the
    binomial interval of n* p successes in n* is its band: unlike the percentile band it keeps its level
    for a rare ending over 30-50 stories, where the draws are few and lopsided. Jeffreys' interval
    (quantiles of Beta(x + 1/2, n* - x + 1/2), 0 or 1 at the ends; Brown, Cai and DasGupta 2001) rather
    than Clopper-Pearson's, which covered 99.5% for a 3% ending over 30 stories. The variance is the draws'
    times stories / (stories - 1) (the bootstrap's plug-in variance runs low by that), and n* is shrunk by
    (z / t)^2, t the Student quantile with stories - 1 degrees of freedom, as Korn and Graubard do for a
    variance estimated from few clusters; n* is at most the episodes. An ending not seen by t (p = 0, no
    variance) gets n* = the stories: Jeffreys' bound for 0 of n, [0, the 1 - alpha/2 quantile of
    Beta(1/2, n + 1/2)] (about 2.5/n at 95%, a cousin of the rule of three), never [0, 0]. F_k(0) = 0 by
    definition, with no band. `fading` (per column, at most 1; `seen_since_last_ending`) scales n* for the
    upper limit only: with half of 50 single-play stories censored, the band at the turn limit covered
    90.2% without it, 95.7% with it (docs/measurements/2026-12-05-estimators.md).
    """
    alpha = (1 - level) / 2
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns cannot happen; NaN draws are left out
        var = np.nanvar(many, axis=0, ddof=0) * stories / max(stories - 1, 1)
    z = stats.norm.ppf(1 - alpha)
    shrink = (z / stats.t.ppf(1 - alpha, max(stories - 1, 1))) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where(var > 0, point * (1 - point) / var * shrink, float(stories))
    n_eff = np.clip(np.where(np.isfinite(n_eff) & (n_eff > 0), n_eff, float(stories)), 1.0, float(max(episodes, 1)))
    low, high = jeffreys_band(point, n_eff, n_eff if fading is None else np.maximum(n_eff * fading, 1.0), level)
    low[..., 0], high[..., 0] = 0.0, 0.0
    return low, high


def band_labels(max_turns: int, metrics: Sequence[EpisodeMetrics]) -> list[tuple[str, int, int]]:
    """The bands up to max_turns (a band cut at max_turns is labelled so); `0` first when an episode ended
    in its opening; one band past 100 for a longer run."""
    out: list[tuple[str, int, int]] = []
    if any(m.turns == 0 for m in metrics):
        out.append(("0", 0, 0))
    for lo, hi in BANDS:
        if lo > max_turns:
            break
        top = min(hi, max_turns)
        out.append((f"{lo}-{top}" if top > lo else f"{lo}", lo, top))
    if max_turns > BANDS[-1][1]:
        out.append((f"{BANDS[-1][1] + 1}-{max_turns}", BANDS[-1][1] + 1, max_turns))
    return out


def endings_by_band(metrics: Sequence[EpisodeMetrics], max_turns: int) -> tuple[list[str], list[list[Any]]]:
    """Header and rows: each ending (and each censoring, and `invalid`) counted by the band of turns played."""
    bands = band_labels(max_turns, metrics)
    header = ["ending", *(b for b, _, _ in bands), "all"]
    rows: list[list[Any]] = []
    for ending in ENDING_ROWS:
        mine = [m for m in metrics if m.ending == ending]
        rows.append([ending, *(sum(lo <= m.turns <= hi for m in mine) for _, lo, hi in bands), len(mine)])
    rows.append(["all", *(sum(lo <= m.turns <= hi for m in metrics) for _, lo, hi in bands), len(metrics)])
    return header, rows


@dataclass(frozen=True)
class RunEndings:
    label: str
    path: str
    incidence: Incidence
    survival: tuple[float, ...]  # the report's S(t), t = 0..max_turns
    bands: tuple[list[str], list[list[Any]]]


def run_endings(runs: Sequence[Run], level: float = 0.95) -> list[RunEndings]:
    out = []
    for run in runs:
        ms = run.metrics()
        out.append(
            RunEndings(
                run.label,
                str(run.path),
                cumulative_incidence([*ms, *run.in_flight], run.max_turns, level, *run.bootstrap),
                run.aggregate(level).survival,
                endings_by_band(ms, run.max_turns),
            )
        )
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def pct_band(inc: Incidence, ending: str) -> str:
    """An ending's final share in percent, with its interval when one was drawn."""
    t = inc.max_turns + 1
    if inc.known_to >= 0:  # past the data: the share ended by then, and at most all still going besides
        k = inc.known_to
        least = inc.curves[ending][k]
        return f"n/e [{pct(least)}, {pct(least + 1.0 - inc.total(k))}]"
    if ending not in inc.lo:
        return pct(inc.final(ending))
    return f"{pct(inc.final(ending))} [{pct(inc.lo[ending][t])}, {pct(inc.hi[ending][t])}]"


# Defined in glossary.ENDINGS_GLOSSARY (tests/test_glossary.py holds the two together).
SUMMARY_HEADER = (
    "run",
    "scored",
    *(f"{e} %" for e in ENDINGS),
    "still going %",
    *(f"{c} (censored)" for c in ENDING_CENSORED),
)
ENDINGS_NOTE = (
    "Each ending's share of the stories within the run's turns, the last included: the chance "
    "that a story ended by k (Aalen-Johansen; `max_turns` and `context_limit` censored, `invalid` "
    "left out); with the share still going when the turn limit stopped them, a row adds up to "
    "100; [interval]: Jeffreys' binomial interval at the effective sample size, its variance from a "
    "bootstrap over stories, each with all its plays, the upper limit widened where stories were censored "
    "after the last ending (after Dorey and Korn). At every t the endings so far and "
    "S(t) add up to 100% (endings.csv, with each curve's interval). `several_types`: "
    "one turn's confirmed conflicts of two or three types. Then, per run, the episodes by what "
    "ended them and the band of turns they played."
)


def endings_summary_rows(ends: Sequence[RunEndings]) -> list[list[Any]]:
    rows = []
    for e in ends:
        inc = e.incidence
        rows.append(
            [
                e.label,
                inc.episodes,
                *(pct_band(inc, k) for k in ENDINGS),
                pct(inc.still_going) if inc.known_to < 0 else f"n/e [0.0, {pct(1.0 - inc.total(inc.known_to))}]",
                *(inc.censored[c] for c in ENDING_CENSORED),
            ]
        )
    return rows


PAST_DATA = (
    "{label}: n/e (not estimable) at the turn limit: the curves rest on the data to t = {t} only (the turn after "
    "the last anyone was followed); [least, most]: the share ended by then, and that plus every story still going"
)


def past_data_lines(ends: Sequence[RunEndings]) -> list[str]:
    return [PAST_DATA.format(label=e.label, t=e.incidence.known_to) for e in ends if e.incidence.known_to >= 0]


def endings_markdown(ends: Sequence[RunEndings]) -> str:
    parts = [ENDINGS_NOTE, markdown_table(SUMMARY_HEADER, endings_summary_rows(ends)), *past_data_lines(ends)]
    for e in ends:
        parts.append(f"### {e.label}: endings by turns played\n\n" + markdown_table(*e.bands))
    return "\n\n".join(parts)


def endings_csv(ends: Sequence[RunEndings]) -> str:
    """Long form, one row per run and t = 0..max_turns + 1: every ending's F_k(t) and what remains, S(t)
    (at max_turns + 1: the share the turn limit stopped); each row adds up to 1."""
    header = ["label", "run_dir", "turns_played", "survival", *(f"incidence_{k}" for k in ENDINGS)]
    header += [f"incidence_{k}_{side}" for k in ENDINGS for side in ("lo", "hi")]
    body = []
    for e in ends:
        inc = e.incidence
        for t in range(inc.max_turns + 2):
            rest = e.survival[t] if t <= inc.max_turns else inc.still_going
            band = [round(b[k][t], 9) if k in b else "" for k in ENDINGS for b in (inc.lo, inc.hi)]
            body.append([e.label, e.path, t, round(rest, 9), *(round(inc.curves[k][t], 9) for k in ENDINGS), *band])
    return csv_text(header, body)
