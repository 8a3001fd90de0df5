"""Where real runs are: the one-run estimators on 30-50 stories, late turns and heavy censoring.

Usage: python scripts/estimators_sim.py [--runs 300] [--resamples 400] [--max-turns 30] [--seed 0]
                                        [--conditions A B C D] [--only S( pass^ F_ ...] [--tree DIR]
                                        [--out FILE.md]

Built apart from `scripts/coverage.py` (whose stories have one constant hazard, endings of fixed
shares, censoring uniform over the turns and 100 stories), to where local-model runs are:

- 30 or 50 stories, 1, 3 or 8 plays each;
- a story's chance to end at turn n rises with n, h_s(n) = u_s (0.02 + 0.004 n), u_s ~ Gamma(2, 1/2)
  (stories differ: the story-level random effect that correlates a story's plays);
- five endings whose shares move with the turn (fact 40% early to 55% late, commitment 30% to 20%,
  several types 7%, every achievement resolved 20% to 15%) and a rare one, player input, at 3%;
- context-limit censoring whose chance per turn grows with the turn, c(n) = q n / max_turns (the
  context fills up), q set so that 30% or 50% of plays end censored;
- a simulated auditor (precision 0.8 fact, 0.5 commitment, 0.9 player input) and a review sheet of
  2-6 items per conflict type (a 0-of-3 sheet for commitment is 1 in 8);
- S(t), pass^k(t), the incidence and the restricted mean judged at t = 10 and at the cap.

The truths are exact given the stories' u (S_s(t) is a product over turns), averaged over 400,000
stories. Each row prints the truth, how often the estimator was not estimable (the rig says so, or
gives no figure), and over the estimable runs the mean, the bias, the share of 95% intervals that
cover the truth with its Monte Carlo standard error, the mean width, and how often the point lay
outside its own interval. `--tree DIR` measures another checkout's `ncp_local` (an estimator it
lacks shows n/a). docs/measurements/2026-12-05-estimators.md holds the tables and their commands.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# Endings (name, early share, late share, the conflict types it carries); the share at turn n moves
# linearly from early (n = 1) to late (n = max_turns).
ENDS: tuple[tuple[str, float, float, tuple[str, ...]], ...] = (
    ("fact", 0.40, 0.55, ("fact",)),
    ("commitment", 0.30, 0.20, ("commitment",)),
    ("player_input", 0.03, 0.03, ("player_input",)),
    ("several_types", 0.07, 0.07, ("fact", "commitment")),
    ("all_resolved", 0.20, 0.15, ()),
)
PRECISION = {"fact": 0.8, "commitment": 0.5, "player_input": 0.9}
TRUTH_STORIES = 400_000
MID = 10


@dataclass(frozen=True)
class Condition:
    name: str
    stories: int
    plays: int
    censoring: float  # target share of plays censored
    # The chance a play shares its story's fate (the story's own draws of ending turn and ending): plays
    # that agree beyond the story's hazard, as a narrator at temperature 0 makes them. 0: independent given u.
    shared: float = 0.0


CONDITIONS = {
    "A": Condition("A", 30, 1, 0.3),
    "B": Condition("B", 50, 1, 0.5),
    "C": Condition("C", 30, 8, 0.3),
    "D": Condition("D", 50, 3, 0.5),
    "E": Condition("E", 30, 8, 0.3, shared=0.8),  # C with plays that share most of their fate (h58e)
}


def hazard(u: np.ndarray, max_turns: int) -> np.ndarray:
    """h_s(n) for n = 1..max_turns (columns), per story u (rows)."""
    n = np.arange(1, max_turns + 1)
    return np.minimum(u[:, None] * (0.02 + 0.004 * n), 0.95)


def shares(max_turns: int) -> np.ndarray:
    """The endings' shares (rows, ENDS order) at turn n = 1..max_turns (columns)."""
    x = (np.arange(1, max_turns + 1) - 1) / max(max_turns - 1, 1)
    out = np.stack([a + (b - a) * x for _, a, b, _ in ENDS])
    return out / out.sum(axis=0)


def all_survive(s: np.ndarray, k: int, shared: float) -> np.ndarray:
    """P(k plays all survive t | the story's S_s(t) = s): each play copies the story's fate with chance
    `shared` (j of the k do, j ~ Binomial(k, shared); all survive if the story's fate does, when j > 0) and
    plays its own otherwise; shared = 0 gives s^k, shared = 1 gives s."""
    own = (1 - shared) * s
    return own**k + s * ((shared + own) ** k - own**k)


def truths(max_turns: int, seed: int, shared: float = 0.0) -> dict[str, float]:
    rng = np.random.default_rng([seed, 11])
    u = rng.gamma(2.0, 0.5, size=TRUTH_STORIES)
    h = hazard(u, max_turns)
    # S_s(t) = P(T >= t) = the product of (1 - h_s(n)) over n = 1..t-1; S_s(0) = S_s(1) = 1.
    s = np.concatenate([np.ones((len(u), 2)), np.cumprod(1 - h, axis=1)[:, :-1]], axis=1)
    out: dict[str, float] = {}
    for t in (MID, max_turns):
        out[f"S({t})"] = float(s[:, t].mean())
        for k in (2, 3, 8):
            out[f"pass^{k}({t})"] = float(all_survive(s[:, t], k, shared).mean())
    ends_at = s[:, 1:] * h  # P(T = n), n = 1..max_turns
    sh = shares(max_turns)
    for i, (name, _, _, _) in enumerate(ENDS):
        out[f"F_{name}(T+1)"] = float((ends_at * sh[i]).sum(axis=1).mean())
    out["RMST"] = float(s[:, 1:].sum(axis=1).mean())  # E[min(T, max_turns)]: sum of S(t), t = 1..max_turns
    return out


@dataclass
class Sample:
    story: np.ndarray  # per play
    turns: np.ndarray
    ending: np.ndarray  # index into ENDS, -1 max_turns, -2 context_limit


def draw(c: Condition, max_turns: int, q: float, rng: np.random.Generator, stories: int | None = None) -> Sample:
    n_s = stories or c.stories
    u = rng.gamma(2.0, 0.5, size=n_s)
    story = np.repeat(np.arange(n_s), c.plays)
    h = hazard(u, max_turns)[story]
    draws = rng.random(h.shape)
    if c.shared > 0:  # only then: the other conditions' streams, and so their simulated runs, stay as they were
        copies = rng.random(len(story)) < c.shared
        draws = np.where(copies[:, None], rng.random((n_s, max_turns))[story], draws)
        cause_draw = np.where(copies, rng.random(n_s)[story], rng.random(len(story)))
    ends = draws < h
    end = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, max_turns + 1)  # the turn it ends at
    # Censoring after n committed turns (turn n + 1's call no longer fits), n = 1..max_turns - 1.
    cn = np.arange(1, max_turns)
    cens = rng.random((len(story), max_turns - 1)) < q * cn / max_turns
    cens_at = np.where(cens.any(axis=1), cens.argmax(axis=1) + 1, 10**9)
    censored = cens_at < np.minimum(end, max_turns)  # censored after n: it survived turn n's endings
    sh = shares(max_turns)
    cum = np.cumsum(sh[:, np.minimum(end, max_turns) - 1], axis=0)
    cause = ((cause_draw if c.shared > 0 else rng.random(len(story))) > cum).sum(axis=0)
    ended = ~censored & (end <= max_turns)
    turns = np.where(censored, cens_at, np.where(ended, end, max_turns))
    ending = np.where(censored, -2, np.where(ended, cause, -1))
    return Sample(story, turns, ending)


def censor_rate(c: Condition, max_turns: int, seed: int) -> float:
    """q such that about c.censoring of plays end censored (bisection on a large draw)."""
    if c.censoring <= 0:
        return 0.0
    lo, hi = 0.0, 10.0
    for _ in range(30):
        mid = (lo + hi) / 2
        x = draw(c, max_turns, mid, np.random.default_rng([seed, 5]), stories=20_000)
        lo, hi = (mid, hi) if np.mean(x.ending == -2) < c.censoring else (lo, mid)
    return (lo + hi) / 2


# ---- one simulated run through the rig -------------------------------------------------------------


def load_rig() -> SimpleNamespace:
    from ncp_local.protocol import metrics
    from ncp_local.report import endings, precision, stats, tables, trials

    return SimpleNamespace(metrics=metrics, endings=endings, precision=precision, stats=stats, tables=tables,
                           trials=trials)  # fmt: skip


def _types(e: int) -> tuple[str, ...]:
    return ENDS[e][3] if e >= 0 else ()


def metrics_of(rig: Any, x: Sample) -> list[Any]:
    trial: dict[int, int] = {}
    out = []
    for s, n, e in zip(x.story.tolist(), x.turns.tolist(), x.ending.tolist(), strict=True):
        k = trial.get(s, 0)
        trial[s] = k + 1
        types = _types(e)
        term = "context_limit" if e == -2 else "max_turns" if e == -1 else "conflict" if types else "all_resolved"
        out.append(rig.metrics.EpisodeMetrics(f"s{s}", term, n, 0.0, 0.0, "fact" in types, "commitment" in types,
                                              "player_input" in types, trial=k))  # fmt: skip
    return out


def sim_run(ms: Sequence[Any], max_turns: int) -> Any:
    """What report/precision.py reads of a run: its results, each with its ending turn's conflicts."""
    results = {}
    for m in ms:
        types = [t for t in ("fact", "commitment", "player_input") if getattr(m, t)]
        last = SimpleNamespace(conflicts=[SimpleNamespace(type=t, target_id=f"{t}_0") for t in types])
        results[f"{m.spec_id}~t{m.trial}"] = SimpleNamespace(
            spec_id=m.spec_id, trial=m.trial, termination=m.termination,
            turns=[SimpleNamespace(conflicts=[])] * max(0, m.turns - 1) + [last],
        )  # fmt: skip
    return SimpleNamespace(results=results, label="sim", max_turns=max_turns, path=Path("/sim"))


def review(rig: Any, ms: Sequence[Any], rng: np.random.Generator, level: float) -> tuple[Any, list[Any]]:
    """A sheet of 2-6 reviewed conflicts per type (fewer when the run has fewer), each upheld if real."""
    verdicts = []
    for t, p in PRECISION.items():
        pool = [m for m in ms if getattr(m, t) and m.termination == "conflict"]
        for i in rng.permutation(len(pool))[: int(rng.integers(2, 7))]:
            m = pool[i]
            verdicts.append(rig.precision.Verdict("/sim", f"{m.spec_id}~t{m.trial}", t, f"{t}_0", rng.random() < p))
    return rig.precision.precisions(verdicts, level), verdicts


Estimate = tuple[float, float, float]  # point, lo, hi; a NaN point: not estimable


def estimate(rig: Any, c: Condition, x: Sample, rng: np.random.Generator, r: int, level: float, max_turns: int,
             real: np.ndarray, only: Sequence[str] = ()) -> dict[str, Estimate]:  # fmt: skip
    """Every estimator's (point, lo, hi) on one simulated run; `only`: just the rows whose names start so."""
    nan = math.nan

    def want(name: str) -> bool:
        return not only or any(name.startswith(o) for o in only)

    ms = metrics_of(rig, x)
    out: dict[str, Estimate] = {}
    if want("S("):
        agg = rig.metrics.aggregate(ms, max_turns, level, r, 0)
        for t in (MID, max_turns):
            out[f"S({t})"] = (agg.survival[t], agg.survival_lo[t], agg.survival_hi[t])
    if c.plays > 1 and want("pass^"):
        ss = [rig.trials.Story(f"s{i}", tuple(m for m in ms if m.spec_id == f"s{i}")) for i in range(c.stories)]
        for k in sorted({2, c.plays}):
            why = rig.trials.not_estimable(ss, k, max_turns) if hasattr(rig.trials, "not_estimable") else None
            curve = rig.trials.pass_k_curve(ss, k, max_turns)
            lo, hi = rig.trials.pass_k_band(ss, k, max_turns, r, 0, level)
            for t in (MID, max_turns):
                bad = bool(why[t]) if why is not None else False
                out[f"pass^{k}({t})"] = (nan, nan, nan) if bad else (float(curve[t]), float(lo[t]), float(hi[t]))
    if want("F_"):
        inc = rig.endings.cumulative_incidence(ms, max_turns, level, r, 0)
        for e in ("fact", "player_input"):
            out[f"F_{e}(T+1)"] = (inc.final(e), inc.lo[e][-1], inc.hi[e][-1])
    if want("avg turns"):
        cols = rig.tables.table_columns(ms)
        ci = rig.stats.bootstrap({"avg_turns": cols["avg_turns"]}, r, 0, level, groups=[m.spec_id for m in ms])
        out["avg turns"] = (ci["avg_turns"].point, ci["avg_turns"].lo, ci["avg_turns"].hi)
    if not want("RMST"):
        pass
    elif hasattr(rig.metrics, "restricted_mean"):
        rm = rig.metrics.restricted_mean(
            [m.turns for m in ms], [m.censored for m in ms], max_turns, level, [m.spec_id for m in ms], r, 0
        )
        out["RMST"] = (rm.value, rm.lo, rm.hi)
    else:
        out["RMST"] = (nan, nan, nan)
    if not want("conflict-free"):
        return out
    prec, verdicts = review(rig, ms, rng, level)
    cor = rig.precision.correct(sim_run(ms, max_turns), prec, verdicts, r, 0, level)
    free, n = cor.conflict_free[1], cor.scored
    out["conflict-free % corrected"] = (100 * free.point / n, 100 * free.lo / n, 100 * free.hi / n)
    return out


@dataclass
class Row:
    condition: Condition
    name: str
    truth: float
    estimates: list[Estimate] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        e = np.asarray(self.estimates, dtype=float)
        ok = ~np.isnan(e[:, 0])
        runs = len(e)
        out = {"not estimable %": 100 * (1 - ok.mean())}
        pts, los, his = e[ok, 0], e[ok, 1], e[ok, 2]
        m = len(pts)
        if m < 2:
            return out | dict.fromkeys(("mean", "bias %", "cover %", "cover se", "width", "outside %"), math.nan)
        cover = float(np.mean((los <= self.truth + 1e-12) & (self.truth <= his + 1e-12)))
        mean = float(pts.mean())
        return out | {
            "mean": mean,
            "bias %": 100 * (mean - self.truth) / self.truth if self.truth else math.nan,
            "bias se %": 100 * float(pts.std(ddof=1)) / math.sqrt(m) / self.truth if self.truth else math.nan,
            "cover %": 100 * cover,
            "cover se": 100 * math.sqrt(max(cover * (1 - cover), 0.95 * 0.05) / m),
            "width": float(np.mean(his - los)),
            "outside %": 100 * float(np.mean((pts < los - 1e-9) | (pts > his + 1e-9))),
            "runs": runs,
        }


def simulate(c: Condition, runs: int, resamples: int, seed: int, max_turns: int, rig: Any, truth: dict[str, float],
             level: float = 0.95, only: Sequence[str] = ()) -> list[Row]:  # fmt: skip
    q = censor_rate(c, max_turns, seed)
    rng = np.random.default_rng([seed, c.stories, c.plays, int(100 * c.censoring)])
    review_rng = np.random.default_rng([seed, 3])
    # The corrected conflict-free share's truth: as played (censored plays count as conflict-free), from a
    # large draw with the same censoring; real[e] is the chance an ending e really was a conflict.
    real = np.array([1 - math.prod(1 - PRECISION[t] for t in types) for _, _, _, types in ENDS])
    big = draw(c, max_turns, q, np.random.default_rng([seed, 13]), stories=100_000 // c.plays)
    truth = dict(truth) | (
        {k: v for k, v in truths(max_turns, seed, c.shared).items() if k.startswith("pass^")} if c.shared else {}
    )
    truth["conflict-free % corrected"] = 100 * (1 - float(np.where(big.ending >= 0, real[big.ending], 0.0).mean()))
    truth["avg turns"] = truth["RMST"]  # what avg turns is read as: the mean length, censoring or not
    rows: dict[str, Row] = {}
    shares_censored = []
    for _ in range(runs):
        x = draw(c, max_turns, q, rng)
        shares_censored.append(float(np.mean(x.ending == -2)))
        for name, e in estimate(rig, c, x, review_rng, resamples, level, max_turns, real, only).items():
            rows.setdefault(name, Row(c, name, truth[name])).estimates.append(e)
    for r in rows.values():
        r.condition = Condition(c.name, c.stories, c.plays, float(np.mean(shares_censored)))
    return list(rows.values())


def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def table(rows: Sequence[Row]) -> str:
    head = ("cond", "stories x plays", "censored", "estimator", "truth", "not estimable %", "mean", "bias %",
            "bias MC se %", "95% covers %", "MC se", "mean width", "point outside %")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---|" + "---:|" * (len(head) - 4)]
    for r in rows:
        x = r.summary()
        c = r.condition
        lines.append(
            f"| {c.name} | {c.stories} x {c.plays} | {100 * c.censoring:.0f}% | {r.name} | {_f(r.truth, 4)} "
            f"| {_f(x['not estimable %'], 1)} | {_f(x['mean'], 4)} | {_f(x['bias %'], 1)} "
            f"| {_f(x.get('bias se %', math.nan), 1)} | {_f(x['cover %'], 1)} | {_f(x['cover se'], 1)} "
            f"| {_f(x['width'])} | {_f(x['outside %'], 1)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--resamples", type=int, default=400)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="+", default=[], help="just the rows whose names start so: S( pass^ F_ RMST ...")
    ap.add_argument("--tree", type=Path, default=None, help="import ncp_local from this checkout instead")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    tree = (a.tree or ROOT).resolve()
    if not (tree / "ncp_local" / "__init__.py").is_file():
        print(f"error: --tree: {tree} holds no ncp_local package", file=sys.stderr)
        return 2
    if bad := [c for c in a.conditions if c not in CONDITIONS]:
        print(f"error: --conditions: unknown {', '.join(bad)} (known: {', '.join(CONDITIONS)})", file=sys.stderr)
        return 2
    if a.runs < 2 or a.max_turns <= MID:
        print(f"error: need --runs >= 2 and --max-turns > {MID}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(tree))
    rig = load_rig()
    truth = truths(a.max_turns, a.seed)
    rows: list[Row] = []
    t0 = time.monotonic()
    for name in a.conditions:
        rows += simulate(CONDITIONS[name], a.runs, a.resamples, a.seed, a.max_turns, rig, truth, only=a.only)
        print(f"condition {name}: done at {time.monotonic() - t0:.0f} s", file=sys.stderr)
    text = (
        table(rows) + f"\n\n{a.runs} simulated runs per condition, {a.resamples} bootstrap draws, "
        f"max_turns={a.max_turns}. Tree: {tree}. {time.monotonic() - t0:.0f} s."
    )
    print(text)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
