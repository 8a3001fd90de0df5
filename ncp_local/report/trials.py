"""Trials in the report: pass^k(t), the noise floor, and each story's plays (docs/guide/trials.md).

A run with `trials.count=k` plays each story k times. From a story's plays this reads:

- pass^k'(t), for k' = 1..k: the chance that k' plays of a story all survive t turns. A story with
  c of its n plays surviving t contributes C(c, k') / C(n, k'), the share of its k'-subsets of plays
  that all survive, which is an unbiased estimate of p^k' for a story whose plays survive with
  probability p (each play drawn independently); the stories are averaged, each with one weight.
  A play survives t when it played t turns or more (S(t) = P(T >= t), PROTOCOL section 5);
  `invalid` plays are left out, as from every average, and a play censored (`context_limit`) before
  t is left out at that t (whether it would have survived is unknown). With the same number of
  scored plays per story and none censored, pass^1(t) is S(t).
- the noise floor of each main metric (one-way random effects over stories): the within-story
  variance sigma_w^2 (pooled over the stories' plays: the sampling noise of one play), the
  between-story variance sigma_b^2 = max(0, var(story means) - sigma_w^2 * mean(1/n_s)), their ratio,
  and two smallest differences the noise allows to call real at the report's level (z = the normal
  quantile): between two replays of the same stories, z * sqrt(2 * sigma_w^2 / (S * k)), and
  between two runs of S other stories each, z * sqrt(2 * (sigma_b^2 / S + sigma_w^2 / (S * k))),
  with S stories and k plays per story (the harmonic mean of the n_s when they differ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from ..protocol.metrics import EpisodeMetrics
from .runs import Run
from .tables import csv_text, markdown_table, table_columns

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


def _known(plays: Sequence[EpisodeMetrics], t: int) -> tuple[int, int]:
    """(plays whose survival at t is known, those of them that survived t turns)."""
    known = [m for m in plays if m.turns >= t or not m.censored]
    return len(known), sum(m.turns >= t for m in known)


def pass_k(story_list: Sequence[Story], k: int, t: int) -> float:
    """pass^k(t) over the stories with at least k plays known at t (NaN when none has)."""
    shares = []
    for s in story_list:
        n, c = _known(s.plays, t)
        if n >= k:
            shares.append(math.comb(c, k) / math.comb(n, k))
    return sum(shares) / len(shares) if shares else math.nan


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


def _values(plays: Sequence[EpisodeMetrics]) -> dict[str, list[float]]:
    cols = table_columns(list(plays))
    cols["conflict_free_pct"] = [100.0 * (m.termination != "conflict") for m in plays]
    return cols


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
            out.append(Noise(key, label, nan, nan, nan, nan, nan, nan))
            continue
        within = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in rich) / dof
        means = [sum(g) / len(g) for g in groups]
        grand = sum(means) / len(means)
        var_means = sum((m - grand) ** 2 for m in means) / (len(means) - 1)
        inv_n = sum(1 / len(g) for g in groups) / len(groups)
        between = max(0.0, var_means - within * inv_n)
        n_stories, per = len(groups), 1 / inv_n  # harmonic mean of plays per story
        out.append(
            Noise(
                key,
                label,
                grand,
                within,
                between,
                within / between if between > 0 else math.inf if within > 0 else math.nan,  # 0/0: no spread
                z * math.sqrt(2 * within / (n_stories * per)),
                z * math.sqrt(2 * (between / n_stories + within / (n_stories * per))),
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


def run_trials(runs: Sequence[Run], level: float = 0.95) -> list[RunTrials]:
    """The trials section of every run that played its stories more than once."""
    out = []
    for run in runs:
        k = trials_of(run)
        if k < 2:
            continue
        ss = stories(run)
        horizon = run.max_turns
        curves = {kk: tuple(pass_k(ss, kk, t) for t in range(horizon + 1)) for kk in range(1, k + 1)}
        out.append(RunTrials(run.label, k, horizon, ss, curves, run.aggregate(level).survival, noise_floor(ss, level)))
    return out


def _pct(x: float, d: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.{d}f}"


def _num(x: float, d: int = 2) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.{d}f}"


def columns_at(max_turns: int) -> list[int]:
    """The turns the markdown table shows: 1, the quarters, and the limit."""
    return sorted({t for t in (1, max_turns // 4, max_turns // 2, 3 * max_turns // 4, max_turns) if t >= 1})


Table = tuple[list[str], list[list[str]]]


def passk_table(rt: RunTrials) -> Table:
    """S(t) and pass^k(t) in percent at `columns_at` turns."""
    ts = columns_at(rt.max_turns)
    rows = [["S(t) %", *(_pct(rt.survival[t]) for t in ts)]]
    rows += [[f"pass^{k} %", *(_pct(c[t]) for t in ts)] for k, c in rt.curves.items()]
    return ["", *(f"t={t}" for t in ts)], rows


def noise_table(rt: RunTrials, level: float) -> Table:
    header = [
        "metric",
        "mean",
        "within-story var",
        "between-story var",
        "within / between",
        "smallest real diff, replay",
        "smallest real diff, other stories",
    ]
    rows = [
        [n.label, _num(n.mean), _num(n.within), _num(n.between), _num(n.ratio), _num(n.mdd_replay), _num(n.mdd_runs)]
        for n in rt.noise
    ]
    return header, rows


NOISE_NOTE = (
    "pass^k(t): the chance that k plays of a story all survive t turns, from each story's c of n surviving "
    "plays as C(c,k)/C(n,k), averaged over stories (pass^1 = S(t) when every story has as many plays, none "
    "censored). Noise floor: within-story variance (one play's sampling noise), between-story variance "
    "(var of story means minus within/n), and the smallest difference between two runs of this size the "
    "noise allows to call real: z*sqrt(2*within/(S*k)) for two replays of the same S stories, "
    "z*sqrt(2*(between/S + within/(S*k))) for two runs of S other stories (docs/guide/trials.md)."
)


def trials_markdown(rts: Sequence[RunTrials], level: float) -> str:
    parts = []
    for rt in rts:
        parts += [
            f"### {rt.label}: {rt.trials} trials of {len(rt.stories)} stories",
            "",
            markdown_table(*passk_table(rt)),
            "",
            markdown_table(*noise_table(rt, level)),
            "",
        ]
    return "\n".join(parts + [f"Smallest real differences at the {level:.0%} level. " + NOISE_NOTE])


def _ending(m: EpisodeMetrics) -> str:
    return f"t{m.trial}:{m.ending}@{m.turns}"


STORY_HEADER = ("run", "spec_id", "plays", "survived", "turns min", "turns median", "turns max", "turns sd", "endings")


def story_rows(rts: Sequence[RunTrials]) -> list[list[object]]:
    """Per story: its scored plays, those that survived (ended without a conflict), the spread of
    their turns, and each trial's ending and turns (`t1:fact@7`)."""
    rows: list[list[object]] = []
    for rt in rts:
        for s in rt.stories:
            turns = sorted(m.turns for m in s.plays)
            n = len(turns)
            mean = sum(turns) / n if n else math.nan
            sd = math.sqrt(sum((x - mean) ** 2 for x in turns) / (n - 1)) if n > 1 else math.nan
            rows.append(
                [
                    rt.label,
                    s.spec_id,
                    n,
                    sum(m.termination != "conflict" for m in s.plays),
                    turns[0] if n else "",
                    (turns[(n - 1) // 2] + turns[n // 2]) / 2 if n else "",
                    turns[-1] if n else "",
                    _num(sd),
                    " ".join(_ending(m) for m in s.plays),
                ]
            )
    return rows


def stories_markdown(rts: Sequence[RunTrials]) -> str:
    return markdown_table(STORY_HEADER, story_rows(rts), left=2)


def passk_csv(rts: Sequence[RunTrials]) -> str:
    rows = [
        [rt.label, k, t, round(c[t], 6) if not math.isnan(c[t]) else "", round(rt.survival[t], 6)]
        for rt in rts
        for k, c in rt.curves.items()
        for t in range(rt.max_turns + 1)
    ]
    return csv_text(["run", "k", "t", "pass_k", "survival"], rows)


def noise_csv(rts: Sequence[RunTrials]) -> str:
    rows = [
        [rt.label, len(rt.stories), rt.trials, n.metric, *(_num(x, 6) for x in (n.mean, n.within, n.between))]
        + [_num(n.ratio, 6), _num(n.mdd_replay, 6), _num(n.mdd_runs, 6)]
        for rt in rts
        for n in rt.noise
    ]
    header = ["run", "stories", "trials", "metric", "mean", "within_var", "between_var", "ratio"]
    return csv_text([*header, "mdd_replay", "mdd_other_stories"], rows)


def stories_csv(rts: Sequence[RunTrials]) -> str:
    return csv_text(STORY_HEADER, story_rows(rts))
