"""Coverage simulation: the report's estimators and intervals on synthetic runs with a known truth.

Usage: python scripts/coverage.py [--runs 1000] [--stories 100] [--max-turns 12] [--resamples 400]
                                  [--k 1 4] [--censoring 0 0.3] [--seed 0] [--tree DIR] [--out FILE.md]

Each simulated run draws `--stories` stories, each with its own per-turn ending hazard h ~ Beta(2, 10)
(stories differ in how hard they are to keep: the story-level random effect), and plays each one k
times. A play ends at its first ending turn (geometric in h), by one of several causes with fixed
shares (fact, commitment, player input, two types at once, every achievement resolved), or reaches
`--max-turns` (`max_turns`). A share of plays is censored (`context_limit`) at a turn drawn
independently of the play (uniform over 1..max_turns - 1; a play whose story ended first is not
censored): `--censoring` sets the share of plays censored. An auditor's judged conflicts are real with a
fixed precision per type, and a review sheet checks 15 of each type (5 of player input).

The truths come from the model: S(t) = E[(1-h)^(t-1)] and pass^k(t) = E[(1-h)^(k(t-1))] in closed form
(Beta moments); the rest from one large draw of the same model (`TRUTH_PLAYS` plays). The main
table's averages are means over the plays as played: under censoring their estimand is the mean of
the censored figures (the report says they are lower bounds), so the table shows that truth and, beside
it, how far it sits from the uncensored one. For each estimator it prints the truth, the mean estimate,
the bias (also in Monte Carlo standard errors), the share of `level` intervals that cover the truth,
that share's Monte Carlo standard error, and the mean width.

`--tree DIR` imports `ncp_local` from another checkout (e.g. a `git worktree` of an older commit) to
measure its estimators the same way; an estimator that tree has no interval for shows `n/a`.
docs/measurements/2026-12-04-coverage.md holds the tables and their commands.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from scipy import special

ROOT = Path(__file__).resolve().parents[1]

# Causes of an ending and their shares among endings; the conflict types each one carries.
CAUSES: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("fact", 0.40, ("fact",)),
    ("commitment", 0.25, ("commitment",)),
    ("player_input", 0.15, ("player_input",)),
    ("several_types", 0.05, ("fact", "commitment")),
    ("all_resolved", 0.15, ()),
)
PRECISION = {"fact": 0.80, "commitment": 0.70, "player_input": 0.95}  # the simulated auditor's
REVIEWED = {"fact": 15, "commitment": 15, "player_input": 5}  # items per type on the review sheet
HAZARD = (2.0, 10.0)  # Beta(a, b) of a story's per-turn ending hazard
TRUTH_PLAYS = 2_000_000


@dataclass(frozen=True)
class Setting:
    stories: int
    plays: int  # k, plays per story
    max_turns: int
    censoring: float  # target share of plays censored
    hazard: tuple[float, float] = HAZARD
    at: int = 3  # the turn at which S(t) and pass^k are judged


@dataclass
class Play:
    story: int
    turns: int
    ending: str  # a CAUSES name, "max_turns" or "context_limit"


NAMES: tuple[str, ...] = (*(c for c, _, _ in CAUSES), "max_turns", "context_limit")


def _censor_rate(s: Setting, rng: np.random.Generator) -> float:
    """The chance q that a play draws a censoring turn, so that about `s.censoring` of plays end censored."""
    if s.censoring <= 0:
        return 0.0
    _, _, code = _draw(s, rng, 200_000 // max(1, s.plays), 1.0)
    return min(1.0, s.censoring / float(np.mean(code == NAMES.index("context_limit"))))


def _draw(s: Setting, rng: np.random.Generator, stories: int, q: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(story, turns played, what ended it as an index of NAMES) of every play, a story's plays adjacent."""
    a, b = s.hazard
    h = rng.beta(a, b, size=stories)
    n = stories * s.plays
    story = np.repeat(np.arange(stories), s.plays)
    end = rng.geometric(h[story])  # the turn the story ends at, 1, 2, ...
    cause = rng.choice(len(CAUSES), size=n, p=np.array([w for _, w, _ in CAUSES]))
    cens = np.where(rng.random(n) < q, rng.integers(1, max(2, s.max_turns), size=n), 10**9)
    censored = cens < np.minimum(end, s.max_turns)
    ended = ~censored & (end <= s.max_turns)
    turns = np.where(censored, cens, np.where(ended, end, s.max_turns))
    code = np.where(censored, NAMES.index("context_limit"), np.where(ended, cause, NAMES.index("max_turns")))
    return story, turns, code


def _plays(s: Setting, rng: np.random.Generator, stories: int, q: float) -> list[Play]:
    story, turns, code = _draw(s, rng, stories, q)
    return [Play(int(a), int(b), NAMES[c]) for a, b, c in zip(story, turns, code, strict=True)]


def _real(types: Sequence[str], p: dict[str, float]) -> float:
    """The chance that an ending with these judged conflict types really was a conflict."""
    return 1.0 - math.prod(1.0 - p[t] for t in types)


def truths(s: Setting, seed: int) -> dict[str, float]:
    a, b = s.hazard

    def moment(m: int) -> float:  # E[(1 - h)^m]
        return float(math.exp(special.betaln(a, b + m) - special.betaln(a, b)))

    t = s.at
    out = {"S(t)": moment(t - 1)}
    for k in (2, 4):
        out[f"pass^{k}(t)"] = moment(k * (t - 1))
    # As played, from one large draw (censoring included when the setting has it).
    rng = np.random.default_rng([seed, 99])
    one = Setting(s.stories, 1, s.max_turns, s.censoring, s.hazard, s.at)
    _, turns, code = _draw(one, rng, TRUTH_PLAYS, _q(s, seed))
    real = np.array([_real(types, PRECISION) if types else 0.0 for _, _, types in CAUSES] + [0.0, 0.0])
    has_fact = np.array(["fact" in types for _, _, types in CAUSES] + [False, False])
    out["avg turns"] = float(np.mean(turns))
    out["fact %"] = 100 * float(np.mean(has_fact[code]))  # the table's fact %: a fact conflict among the types
    out["conflict-free % corrected"] = 100 * (1 - float(np.mean(real[code])))
    # F_fact(max_turns + 1): the chance a story ends by a fact conflict alone within the run's turns.
    out["F_fact(T+1)"] = CAUSES[0][1] * (1 - moment(s.max_turns))
    # The uncensored values of the as-played figures, for the gap the report calls a lower bound.
    if s.censoring > 0:
        _, turns, code = _draw(Setting(s.stories, 1, s.max_turns, 0.0, s.hazard, s.at), rng, TRUTH_PLAYS, 0.0)
        out["avg turns, uncensored"] = float(np.mean(turns))
        out["fact %, uncensored"] = 100 * float(np.mean(has_fact[code]))
    return out


_Q: dict[tuple[Any, ...], float] = {}


def _q(s: Setting, seed: int) -> float:
    key = (s.plays, s.max_turns, s.censoring, s.hazard)
    if key not in _Q:
        _Q[key] = _censor_rate(s, np.random.default_rng([seed, 7]))
    return _Q[key]


# ---- one simulated run through the rig's estimators --------------------------------------------------


@dataclass
class Rig:
    """The estimators of the `ncp_local` in use (this tree, or `--tree`), and what that version offers."""

    m: Any

    @classmethod
    def load(cls) -> Rig:
        from ncp_local.protocol import metrics
        from ncp_local.report import endings, precision, stats, tables, trials

        mods = SimpleNamespace(
            metrics=metrics, endings=endings, precision=precision, stats=stats, tables=tables, trials=trials
        )
        return cls(mods)

    def has(self, fn: Callable[..., Any], arg: str) -> bool:
        return arg in inspect.signature(fn).parameters


def episode(story: int, trial: int) -> str:
    """A play's episode name as the rig names it (protocol/trials.py: `s3` for trial 0, `s3~t2` after),
    so the rig's own parsing reads the simulated runs as it reads real ones."""
    try:
        from ncp_local.protocol.trials import episode_name
    except ImportError:  # a --tree from before trials: the same names
        return f"s{story}" if trial == 0 else f"s{story}~t{trial}"
    return episode_name(f"s{story}", trial)


def _metrics(rig: Rig, plays: Sequence[Play]) -> list[Any]:
    EM = rig.m.metrics.EpisodeMetrics
    kinds = dict((c, types) for c, _, types in CAUSES)
    seen: dict[int, int] = {}
    out = []
    for p in plays:
        types = kinds.get(p.ending, ())
        trial = seen.get(p.story, 0)
        seen[p.story] = trial + 1
        term = "conflict" if types else p.ending
        out.append(EM(f"s{p.story}", term, p.turns, 0.0, 0.0, "fact" in types, "commitment" in types,
                      "player_input" in types, trial=trial))  # fmt: skip
    return out


def _sim_run(plays: Sequence[Play], max_turns: int) -> Any:
    """A stand-in for a report Run with what report/precision.py reads: results with their ending turn's conflicts."""
    kinds = dict((c, types) for c, _, types in CAUSES)
    results = {}
    seen: dict[int, int] = {}
    for p in plays:
        trial = seen.get(p.story, 0)
        seen[p.story] = trial + 1
        types = kinds.get(p.ending, ())
        last = SimpleNamespace(conflicts=[SimpleNamespace(type=t, target_id=f"{t}_0") for t in types])
        results[episode(p.story, trial)] = SimpleNamespace(
            spec_id=f"s{p.story}",
            trial=trial,
            termination="conflict" if types else p.ending,
            turns=[SimpleNamespace(conflicts=[])] * max(0, p.turns - 1) + [last],
        )
    return SimpleNamespace(results=results, label="sim", max_turns=max_turns, path=Path("/sim"))


def _review(rig: Rig, plays: Sequence[Play], rng: np.random.Generator, level: float) -> tuple[Any, list[Any]]:
    """A review sheet: per type, up to REVIEWED[type] of the run's judged conflicts, each upheld if real."""
    kinds = dict((c, types) for c, _, types in CAUSES)
    verdicts = []
    for t, n in REVIEWED.items():
        pool = [i for i, p in enumerate(plays) if t in kinds.get(p.ending, ())]
        for i in rng.permutation(pool)[:n]:
            p = plays[i]
            trial = sum(1 for q in plays[:i] if q.story == p.story)
            verdicts.append(
                rig.m.precision.Verdict("/sim", episode(p.story, trial), t, f"{t}_0", bool(rng.random() < PRECISION[t]))
            )
    return rig.m.precision.precisions(verdicts, level), verdicts


Estimate = tuple[float, float, float]  # point, lo, hi (NaN when the version gives no interval)


# What `estimate` measures; `only` narrows it (the test keeps to the first two).
ESTIMATORS = ("S(t)", "pass^k(t)", "F_fact(T+1)", "main table", "corrected")


def estimate(
    rig: Rig,
    s: Setting,
    plays: Sequence[Play],
    rng: np.random.Generator,
    r: int,
    level: float,
    only: Sequence[str] = ESTIMATORS,
) -> dict[str, Estimate]:
    M = rig.m
    ms = _metrics(rig, plays)
    t = s.at
    nan = math.nan
    out: dict[str, Estimate] = {}
    agg_fn = M.metrics.aggregate
    agg = agg_fn(ms, s.max_turns, level, r, 0) if rig.has(agg_fn, "resamples") else agg_fn(ms, s.max_turns, level)
    out["S(t)"] = (agg.survival[t], agg.survival_lo[t], agg.survival_hi[t])
    if s.plays > 1 and "pass^k(t)" in only:
        story_list = [M.trials.Story(f"s{i}", tuple(m for m in ms if m.spec_id == f"s{i}")) for i in range(s.stories)]
        for k in (2, 4):
            if k > s.plays:
                continue
            point = M.trials.pass_k(story_list, k, t)
            if hasattr(M.trials, "pass_k_band"):
                lo, hi = M.trials.pass_k_band(story_list, k, s.max_turns, r, 0, level)
                out[f"pass^{k}(t)"] = (point, float(lo[t]), float(hi[t]))
            else:
                out[f"pass^{k}(t)"] = (point, nan, nan)
    inc_fn = M.endings.cumulative_incidence
    if "F_fact(T+1)" not in only:
        pass
    elif rig.has(inc_fn, "resamples"):
        inc = inc_fn(ms, s.max_turns, level, r, 0)
        out["F_fact(T+1)"] = (inc.final("fact"), inc.lo["fact"][-1], inc.hi["fact"][-1])
    else:
        out["F_fact(T+1)"] = (inc_fn(ms, s.max_turns).final("fact"), nan, nan)
    if "main table" not in only:
        return out
    stories = [m.spec_id for m in ms]
    cols = M.tables.table_columns(ms)
    ci = M.stats.bootstrap({k: cols[k] for k in ("avg_turns", "fact_pct")}, r, 0, level, groups=stories)
    out["avg turns"] = (ci["avg_turns"].point, ci["avg_turns"].lo, ci["avg_turns"].hi)
    out["fact %"] = (ci["fact_pct"].point, ci["fact_pct"].lo, ci["fact_pct"].hi)
    if "corrected" not in only:
        return out
    prec, verdicts = _review(rig, plays, rng, level)
    c = M.precision.correct(_sim_run(plays, s.max_turns), prec, verdicts, r, 0, level)
    free = c.conflict_free[1]
    n = c.scored
    out["conflict-free % corrected"] = (100 * free.point / n, 100 * free.lo / n, 100 * free.hi / n)
    return out


@dataclass
class Row:
    setting: Setting
    name: str
    truth: float
    estimates: list[Estimate]
    censored_share: float = 0.0  # the share of plays censored, over the simulated runs
    uncensored: float | None = None  # for an as-played figure, its truth without censoring

    def summary(self) -> dict[str, float]:
        pts = np.array([e[0] for e in self.estimates])
        los = np.array([e[1] for e in self.estimates])
        his = np.array([e[2] for e in self.estimates])
        n = len(pts)
        mean = float(np.mean(pts))
        se = float(np.std(pts, ddof=1) / math.sqrt(n))
        has_iv = not np.isnan(los).all()
        cover = float(np.mean((los <= self.truth + 1e-12) & (self.truth <= his + 1e-12))) if has_iv else math.nan
        return {
            "truth": self.truth,
            "mean": mean,
            "bias %": 100 * (mean - self.truth) / self.truth if self.truth else math.nan,
            "bias / se": (mean - self.truth) / se if se > 0 else math.nan,
            "cover %": 100 * cover,
            "cover se": 100 * math.sqrt(cover * (1 - cover) / n) if has_iv else math.nan,
            "width": float(np.mean(his - los)) if has_iv else math.nan,
        }


def simulate(
    s: Setting,
    runs: int,
    resamples: int,
    seed: int,
    level: float = 0.95,
    rig: Rig | None = None,
    only: Sequence[str] = ESTIMATORS,
) -> list[Row]:
    """`runs` simulated runs of setting `s` through the rig's estimators: one Row per estimator."""
    rig = rig or Rig.load()
    rng = np.random.default_rng([seed, s.plays, int(1000 * s.censoring)])
    q = _q(s, seed)
    truth = truths(s, seed)
    got: dict[str, list[Estimate]] = {}
    censored = []
    for _ in range(runs):
        plays = _plays(s, rng, s.stories, q)
        censored.append(np.mean([p.ending == "context_limit" for p in plays]))
        for name, e in estimate(rig, s, plays, rng, resamples, level, only).items():
            got.setdefault(name, []).append(e)
    share = float(np.mean(censored))
    return [Row(s, name, truth[name], es, share, truth.get(f"{name}, uncensored")) for name, es in got.items()]


def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def table(rows: Sequence[Row], runs: int) -> str:
    head = ("estimator", "k", "censored", "truth", "mean", "bias %", "bias / MC se", "95% covers %", "MC se",
            "mean width", "uncensored truth")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        x = r.summary()
        lines.append(
            f"| {r.name} | {r.setting.plays} | {100 * r.censored_share:.0f}% | {_f(x['truth'])} | {_f(x['mean'])} "
            f"| {_f(x['bias %'], 2)} | {_f(x['bias / se'], 2)} | {_f(x['cover %'], 1)} | {_f(x['cover se'], 1)} "
            f"| {_f(x['width'])} | {_f(r.uncensored) if r.uncensored is not None else ''} |"
        )
    return "\n".join(lines) + f"\n\n{runs} simulated runs per row."


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--stories", type=int, default=100)
    ap.add_argument("--max-turns", type=int, default=12)
    ap.add_argument("--resamples", type=int, default=400)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--censoring", type=float, nargs="+", default=[0.0, 0.3])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tree", type=Path, default=None, help="import ncp_local from this checkout instead")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    tree = (a.tree or ROOT).resolve()
    if not (tree / "ncp_local" / "__init__.py").is_file():
        print(f"error: --tree: {tree} holds no ncp_local package", file=sys.stderr)
        return 2
    if a.runs < 2 or a.stories < 2 or a.max_turns < 4 or any(not 0 <= c < 1 for c in a.censoring):
        print("error: need --runs >= 2, --stories >= 2, --max-turns >= 4 and 0 <= --censoring < 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(tree))
    rig = Rig.load()
    rows: list[Row] = []
    t0 = time.monotonic()
    for k in a.k:
        for c in a.censoring:
            rows += simulate(Setting(a.stories, k, a.max_turns, c), a.runs, a.resamples, a.seed, rig=rig)
            print(f"k={k} censoring={c:.0%}: done at {time.monotonic() - t0:.0f} s", file=sys.stderr)
    text = table(rows, a.runs) + f" Tree: {tree}. {time.monotonic() - t0:.0f} s."
    print(text)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
