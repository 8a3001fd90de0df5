"""The PROTOCOL section 5 table with bootstrap intervals, and per-genre tables."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol import ROLES
from ..protocol.metrics import (
    ENDING_CENSORED,
    TERMINATIONS,
    Aggregate,
    EpisodeMetrics,
    RestrictedMean,
    aggregate,
    censored_note,
    identified_to,
    restricted_mean,
)
from ..rundir.atomic import atomic_write
from .glossary import define
from .in_flight import in_flight_line
from .ran import Ran, what_ran
from .runs import Run
from .stats import Interval, bootstrap

# (key, header, decimals)
METRICS: tuple[tuple[str, str, int], ...] = (
    ("avg_turns", "avg turns", 2),
    # Not a per-episode mean (so not in table_columns): the area under the run's S(t) to the horizon.
    ("turns_kept", "turns kept", 2),
    ("trajectory_pct", "traj %", 2),
    ("satisfied_pct", "sat %", 2),
    ("fact_pct", "fact %", 1),
    ("commitment_pct", "commit %", 1),
    ("player_input_pct", "player %", 1),
)


def table_columns(scored: list[EpisodeMetrics]) -> dict[str, list[float]]:
    return {
        "avg_turns": [m.turns for m in scored],
        "trajectory_pct": [100 * m.trajectory_progress for m in scored],
        "satisfied_pct": [100 * m.satisfied for m in scored],
        "fact_pct": [100 * m.fact for m in scored],
        "commitment_pct": [100 * m.commitment for m in scored],
        "player_input_pct": [100 * m.player_input for m in scored],
    }


@dataclass(frozen=True)
class Row:
    label: str
    path: str
    agg: Aggregate
    ci: dict[str, Interval]  # METRICS keys and "conflict_free"
    unfinished: int
    horizon: int = 0  # turns the restricted mean ("turns kept") runs to
    ran: Ran = Ran(())  # the run's engine and models, as its manifest records them
    in_flight: str = ""  # the line saying how many episodes are still playing (report/in_flight.py), if any
    known_to: int = -1  # turns kept past the data: the last turn S(t) rests on (-1: estimable to the horizon)


def horizon_of(run: Run, horizon: int | None) -> int:
    """`report.horizon`, else the run's turn cap; never past the cap (S(t) is 0 there, or unknown)."""
    return run.max_turns if horizon is None else min(horizon, run.max_turns)


def turns_kept(
    scored: Sequence[EpisodeMetrics], horizon: int, resamples: int, seed: int, level: float
) -> RestrictedMean:
    """The restricted mean of the scored episodes' S(t) to `horizon`, its band drawn as the table's are."""
    if not scored:
        return RestrictedMean(math.nan, math.nan, math.nan, horizon)
    return restricted_mean(
        [m.turns for m in scored],
        [m.censored for m in scored],
        horizon,
        level,
        stories=[m.spec_id for m in scored],
        resamples=resamples,
        seed=seed,
    )


def summary_rows(runs: Sequence[Run], resamples: int, seed: int, level: float, horizon: int | None = None) -> list[Row]:
    rows = []
    for run in runs:
        run.bootstrap = (resamples, seed)  # the S(t) band draws as the table does
        ms = run.metrics()
        agg = run.aggregate(level)
        scored = [m for m in ms if m.termination != "invalid"]
        # A story's trials move together in the resamples (each story once when it was played once).
        stories = [m.spec_id for m in scored]
        ci = bootstrap(table_columns(scored), resamples, seed, level, groups=stories)
        ci.update(
            bootstrap(
                {"conflict_free": [float(m.termination != "conflict") for m in scored]},
                resamples,
                seed,
                level,
                reduce="sum",
                groups=stories,
            )
        )
        h = horizon_of(run, horizon)
        # The same seed, so the same story draws as the columns above (protocol/resample.py).
        # In-flight episodes (report/in_flight.py) are in the area as they are in S(t): censored.
        kept = turns_kept([*scored, *run.in_flight], h, resamples, seed, level)
        ci["turns_kept"] = Interval(kept.value, kept.lo, kept.hi)
        rows.append(
            Row(
                run.label,
                str(run.path),
                agg,
                ci,
                len(run.unfinished),
                h,
                what_ran(run.manifest),
                in_flight_line(run),
                kept.known_to,
            )
        )
    return rows


def _num(x: float, d: int) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{d}f}"


# One episode leaves no spread to estimate: its bootstrap "interval" would be the point itself.
MIN_FOR_INTERVAL = 2


def _cell(iv: Interval, d: int, scored: int) -> str:
    if math.isnan(iv.point) and not math.isnan(iv.lo):  # past the data: no point, the bounds (PAST_DATA)
        return f"n/e [{_num(iv.lo, d)}, {_num(iv.hi, d)}]"
    if math.isnan(iv.point):
        return "n/a"
    if scored < MIN_FOR_INTERVAL or math.isnan(iv.lo):
        return _num(iv.point, d)
    return f"{_num(iv.point, d)} [{_num(iv.lo, d)}, {_num(iv.hi, d)}]"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    sep = ["---" if i < left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(_md_escape(str(c)) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


# `engine` last: scripts that read the table by position keep their columns.
SUMMARY_HEADER = (
    "run",
    "episodes",
    *(h for _, h, _ in METRICS),
    "conflict-free plays",
    *TERMINATIONS,
    "bound hits",
    "engine",
)


def summary_table(rows: Sequence[Row]) -> str:
    """The headline table, one row per run (Markdown)."""
    body = []
    for r in rows:
        t = r.agg.terminations
        body.append(
            [
                r.label,
                r.agg.episodes,
                *(_cell(r.ci[k], d, r.agg.scored) for k, _, d in METRICS),
                _cell(r.ci["conflict_free"], 0, r.agg.scored),
                *(t[k] for k in TERMINATIONS),
                r.agg.bound_hits,
                r.ran.short,
            ]
        )
    return markdown_table(SUMMARY_HEADER, body)


def summary_lines(rows: Sequence[Row]) -> list[str]:
    """What the headline table cannot show, one line per run that needs it: censored, in flight, past the data."""
    censored = [f"- {r.label}: {n}" for r in rows if (n := censored_note(r.agg))]
    censored += [f"- {r.label}: {r.in_flight}" for r in rows if r.in_flight]
    return censored + [f"- {r.label}: {PAST_DATA.format(t=r.known_to)}" for r in rows if r.known_to >= 0]


def summary_markdown(rows: Sequence[Row], level: float) -> str:
    note = (
        f"Point estimate [{level:.0%} bootstrap interval over episodes (over stories when a story was "
        f"played more than once: its trials are drawn together); none with fewer than "
        f"{MIN_FOR_INTERVAL} scored episodes]; averages and rates leave "
        "`invalid` episodes out; conflict rates are the share of episodes ending in a conflict of that type; "
        "`context_limit` episodes (the window was full) are averaged at their committed turns and censored "
        "in S(t) (Kaplan-Meier); turns kept: the area under S(t) to "
        + _horizons(rows)
        + " (avg turns when nothing is censored; quote it when something is); "
        "bound hits: outputs that reached a configured length or count bound."
    )
    censored = summary_lines(rows)
    return summary_table(rows) + "\n\n" + note + ("\n\n" + "\n".join(censored) if censored else "")


PAST_DATA = (
    "turns kept n/e (not estimable): S(t) rests on the data to t = {t} only (the turn after the last anyone "
    "was followed); [least, most]: every story still going ending at once, or none before the horizon"
)


def _horizons(rows: Sequence[Row]) -> str:
    hs = sorted({r.horizon for r in rows})
    return f"{hs[0]} turns" if len(hs) == 1 else "each run's horizon (" + ", ".join(map(str, hs)) + " turns)"


def summary_record(r: Row) -> dict[str, Any]:
    """One run's row of results.csv as a mapping: each metric's point and interval (blank where there is
    none), the conflict-free count, the terminations (the trackers log the same figures)."""
    out: dict[str, Any] = {
        "label": r.label,
        "run_dir": r.path,
        "engine": r.ran.engine,
        **{f"{role}_model": r.ran.model(role) for role in ROLES},
        "episodes": r.agg.episodes,
        "scored": r.agg.scored,
        "censored": censored_count(r.agg),
    }
    few = r.agg.scored < MIN_FOR_INTERVAL  # no interval for fewer than 2 scored episodes
    for k, _, _ in METRICS:
        iv = r.ci[k]
        bare = few and not (math.isnan(iv.point) and not math.isnan(iv.lo))  # past the data: the bounds stay
        out |= {k: _round(iv.point), f"{k}_lo": "" if bare else _round(iv.lo), f"{k}_hi": "" if bare else _round(iv.hi)}
    out["horizon"] = r.horizon
    cf = r.ci["conflict_free"]
    out |= {
        "conflict_free": r.agg.conflict_free,
        "conflict_free_lo": "" if few else _round(cf.lo),
        "conflict_free_hi": "" if few else _round(cf.hi),
        **{k: r.agg.terminations[k] for k in TERMINATIONS},
        "bound_hits": r.agg.bound_hits,
        "unfinished": r.unfinished,
    }
    return out


def censored_count(agg: Aggregate) -> int:
    """Episodes censored in the glossary's sense: stopped before their story ended, by the turn cap
    (`max_turns`) or the context window (`context_limit`); `Aggregate.censored` counts the second only."""
    return sum(agg.terminations[t] for t in ENDING_CENSORED)


def summary_csv(rows: Sequence[Row]) -> str:
    records = [summary_record(r) for r in rows]
    header = list(records[0]) if records else []  # a report has at least one run
    return csv_text(header, [list(rec.values()) for rec in records])


def _round(x: float) -> Any:
    """A CSV number: blank for NaN, an integer printed as one (3, not 3.0), else 6 decimals."""
    if math.isnan(x):
        return ""
    r = round(x, 6)
    return int(r) if float(r).is_integer() else r


# ---- per genre (the paper's Table 7) ---------------------------------------

GENRE_HEADER = (
    "genre",
    "episodes",
    "context_limit",
    "avg turns",
    "turns kept",
    "traj %",
    "sat %",
    "fact %",
    "commit %",
    "player %",
)
UNKNOWN_GENRE = "(unknown)"


@dataclass(frozen=True)
class GenreRow:
    genre: str
    agg: Aggregate  # over the genre's scored episodes (invalid ones are left out)
    turns_kept: float = math.nan  # the restricted mean to the run's turn cap (no interval: a genre is small)


def genre_rows(run: Run) -> list[GenreRow]:
    """One row per genre label; an episode counts under each of its spec's genres."""
    by_genre: dict[str, list[EpisodeMetrics]] = {}
    for m in run.metrics():
        if m.termination == "invalid":
            continue
        for g in run.genres(m.spec_id) or (UNKNOWN_GENRE,):
            by_genre.setdefault(g, []).append(m)
    return [
        GenreRow(
            g,
            aggregate(by_genre[g], run.max_turns),
            restricted_mean(
                [m.turns for m in by_genre[g]], [m.censored for m in by_genre[g]], run.max_turns, resamples=1
            ).value,
        )
        for g in sorted(by_genre)
    ]


def _genre_values(r: GenreRow) -> tuple[float, ...]:
    a = r.agg
    return (
        a.avg_turns,
        r.turns_kept,
        a.trajectory_pct,
        a.satisfied_pct,
        a.fact_pct,
        a.commitment_pct,
        a.player_input_pct,
    )


def _genre_cells(r: GenreRow) -> list[Any]:
    a = r.agg
    return [
        r.genre,
        a.episodes,
        a.censored,
        f"{a.avg_turns:.2f}",
        "n/e" if math.isnan(r.turns_kept) else f"{r.turns_kept:.2f}",
        f"{a.trajectory_pct:.2f}",
        f"{a.satisfied_pct:.2f}",
        f"{a.fact_pct:.1f}",
        f"{a.commitment_pct:.1f}",
        f"{a.player_input_pct:.1f}",
    ]


GENRE_NOTE = f"Per genre, {define('genre rows')}."


def genre_markdown(runs: Sequence[Run]) -> str:
    parts = [GENRE_NOTE]
    for run in runs:
        parts.append(f"### {run.label}\n\n" + markdown_table(GENRE_HEADER, [_genre_cells(r) for r in genre_rows(run)]))
    return "\n\n".join(parts)


def genre_csv(runs: Sequence[Run]) -> str:
    header = [
        "label",
        "run_dir",
        "genre",
        "episodes",
        "context_limit",
        "avg_turns",
        "turns_kept",
        "trajectory_pct",
        "satisfied_pct",
        "fact_pct",
        "commitment_pct",
        "player_input_pct",
    ]
    body = []
    for run in runs:
        for r in genre_rows(run):
            body.append(
                [run.label, str(run.path), r.genre, r.agg.episodes, r.agg.censored, *map(_round, _genre_values(r))]
            )
    return csv_text(header, body)


# ---- survival ---------------------------------------------------------------


def censored_at(run: Run, in_flight: bool = False) -> dict[int, int]:
    """t -> how many censored episodes are counted as running through t for the last time.

    A `context_limit` episode with n committed turns had turn n under way, so
    it counts in S(t) = P(T >= t) through t = n + 1 (metrics module docstring);
    that is where the survival plot marks it and where the CSV counts it. `in_flight=True`: the
    episodes in flight instead (report/in_flight.py), censored the same way at their last committed turn.
    """
    out: dict[int, int] = {}
    for m in run.in_flight if in_flight else run.metrics():
        if m.censored:
            out[m.turns + 1] = out.get(m.turns + 1, 0) + 1
    return out


def known_to(run: Run) -> int:
    """The last t at which the run's S(t) rests on the data (protocol/metrics.identified_to): the turn after
    the last any episode, finished or in flight, was followed; the cap once S(t) has fallen to 0."""
    at = [m for m in (*run.metrics(), *run.in_flight) if m.termination != "invalid"]
    turns = np.asarray([m.turns for m in at], dtype=np.intp)
    return identified_to(turns, np.asarray([0.0 if m.censored else 1.0 for m in at]), run.max_turns)


def survival_csv(runs: Sequence[Run], level: float = 0.95) -> str:
    """Per run: S(t) (Kaplan-Meier), its band, and the `context_limit` episodes censored after t
    (`censored_at`; the `max_turns` ones are censored after the last row); while episodes are in
    flight, a column of those censored after t."""
    aggs = [r.aggregate(level) for r in runs]
    cens = [censored_at(r) for r in runs]
    # A column of episodes in flight only while some run has them (a finished run's CSV is as before).
    playing = [censored_at(r, in_flight=True) for r in runs] if any(r.in_flight for r in runs) else None
    known = [known_to(r) for r in runs]
    horizon = max((len(a.survival) for a in aggs), default=0)
    body = []
    for t in range(horizon):
        line: list[Any] = [t]
        for i, (a, c) in enumerate(zip(aggs, cens, strict=True)):
            inside = t < len(a.survival)
            # Past the data S(t) has no point (blank), only its band: 0 to the last value it rested on.
            point = _round(a.survival[t]) if inside and t <= known[i] else ""
            line += (
                [point, _round(a.survival_lo[t]), _round(a.survival_hi[t]), c.get(t, 0)] if inside else ["", "", "", ""]
            )
            if playing is not None:
                line.append(playing[i].get(t, 0) if inside else "")
        body.append(line)
    header = ["turns_played"]  # t, as people count turns: S(t) = share of episodes that played t turns or more
    for r in runs:
        header += [r.label, f"{r.label} lo", f"{r.label} hi", f"{r.label} context_limit"]
        header += [f"{r.label} in_flight"] if playing is not None else []
    return csv_text(header, body)


def write(path: Path, text: str) -> Path:
    atomic_write(path, text)
    return path
