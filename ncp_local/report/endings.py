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
average. The estimator is Aalen-Johansen, lifelines' `AalenJohansenFitter`, one fit per ending.

Ties. Turns are whole numbers, so endings share turns all the time. lifelines separates tied
ending times by a random jitter drawn from numpy's global generator (re-seeding it as a side
effect). We hand it distinct times instead, deterministically: the i-th ending at turn n goes at
n + i * SPREAD (all of them well inside the turn), every censoring at n + 1/2, and every curve is
read at t - 1/2. The order inside a turn changes nothing read there: with r stories at risk and d
ending in that turn, the survival's steps multiply to (r - d) / r in any order, and each ending
adds S(before the turn) / r to its own curve wherever it sits (S * 1/r for the first,
S * (r-1)/r * 1/(r-1) for the second, ...). An episode censored at n turns counts in the risk set
of the endings at turn n and leaves before turn n + 1, as in the report's S(t).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.metrics import ENDING_CENSORED, ENDINGS, EpisodeMetrics
from .runs import Run
from .tables import csv_text, markdown_table

# Turn bands of the endings table (the and the paper's reading of a 100-turn run).
BANDS: tuple[tuple[int, int], ...] = ((1, 5), (6, 10), (11, 20), (21, 50), (51, 100))
# Table rows: the endings, then what does not end a story here.
ENDING_ROWS: tuple[str, ...] = (*ENDINGS, *ENDING_CENSORED, "invalid")
# Tied endings within one turn are spread by this much each; 1e5 of them still stay under half a turn.
SPREAD = 1e-6


@dataclass(frozen=True)
class Incidence:
    """F_k(t) for t = 0..max_turns + 1, per ending; and how many episodes they rest on."""

    max_turns: int
    curves: dict[str, tuple[float, ...]]  # ENDINGS -> F_k(0..max_turns + 1)
    episodes: int  # scored episodes (invalid ones left out)
    censored: dict[str, int]  # ENDING_CENSORED -> episodes

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


def _encode(scored: Sequence[EpisodeMetrics]) -> tuple[list[float], list[int]]:
    """lifelines' durations and event codes (0 = censored, k + 1 = ENDINGS[k]); module docstring."""
    durations: list[float] = []
    events: list[int] = []
    placed: dict[int, int] = {}
    for m in scored:
        ending = m.ending
        if ending in ENDING_CENSORED:
            durations.append(m.turns + 0.5)
            events.append(0)
        else:
            i = placed.get(m.turns, 0)
            placed[m.turns] = i + 1
            durations.append(m.turns + i * SPREAD)
            events.append(ENDINGS.index(ending) + 1)
    return durations, events


def _step_at(times: Sequence[float], values: Sequence[float], x: float) -> float:
    """A right-continuous step function's value at x (0 before its first time)."""
    out = 0.0
    for t, v in zip(times, values, strict=True):
        if t > x:
            break
        out = v
    return out


def cumulative_incidence(metrics: Sequence[EpisodeMetrics], max_turns: int) -> Incidence:
    """Aalen-Johansen F_k(t), t = 0..max_turns + 1, for every ending k (module docstring)."""
    scored = [m for m in metrics if m.termination != "invalid"]
    censored = {c: sum(m.ending == c for m in scored) for c in ENDING_CENSORED}
    horizon = range(max_turns + 2)
    durations, events = _encode(scored)
    curves: dict[str, tuple[float, ...]] = {}
    for k, ending in enumerate(ENDINGS, start=1):
        if k not in events:  # lifelines needs one ending of interest; none means F_k = 0
            curves[ending] = tuple(0.0 for _ in horizon)
            continue
        # Imported here: lifelines pulls in pandas, which only this table needs.
        from lifelines import AalenJohansenFitter

        fitter = AalenJohansenFitter(calculate_variance=False)
        with warnings.catch_warnings():
            # Our times are distinct (no jitter); pandas' future-behaviour notes inside lifelines are not ours.
            warnings.simplefilter("ignore", FutureWarning)
            fitter.fit(durations, events, event_of_interest=k)
        cdf = fitter.cumulative_density_
        times = [float(x) for x in cdf.index]
        values = [float(v) for v in cdf.iloc[:, 0]]
        curves[ending] = tuple(_step_at(times, values, t - 0.5) for t in horizon)
    return Incidence(max_turns, curves, len(scored), censored)


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
                cumulative_incidence(ms, run.max_turns),
                run.aggregate(level).survival,
                endings_by_band(ms, run.max_turns),
            )
        )
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


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
    "100. At every t the endings so far and S(t) add up to 100% (endings.csv). `several_types`: "
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
                *(pct(inc.final(k)) for k in ENDINGS),
                pct(inc.still_going),
                *(inc.censored[c] for c in ENDING_CENSORED),
            ]
        )
    return rows


def endings_markdown(ends: Sequence[RunEndings]) -> str:
    parts = [ENDINGS_NOTE, markdown_table(SUMMARY_HEADER, endings_summary_rows(ends))]
    for e in ends:
        parts.append(f"### {e.label}: endings by turns played\n\n" + markdown_table(*e.bands))
    return "\n\n".join(parts)


def endings_csv(ends: Sequence[RunEndings]) -> str:
    """Long form, one row per run and t = 0..max_turns + 1: every ending's F_k(t) and what remains, S(t)
    (at max_turns + 1: the share the turn limit stopped); each row adds up to 1."""
    header = ["label", "run_dir", "turns_played", "survival", *(f"incidence_{k}" for k in ENDINGS)]
    body = []
    for e in ends:
        inc = e.incidence
        for t in range(inc.max_turns + 2):
            rest = e.survival[t] if t <= inc.max_turns else inc.still_going
            body.append([e.label, e.path, t, round(rest, 9), *(round(inc.curves[k][t], 9) for k in ENDINGS)])
    return csv_text(header, body)
