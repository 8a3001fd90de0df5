"""The auditor-corrected shares at small review sheets: bias, coverage and the point inside its interval.

Usage: python scripts/corrected_sim.py [--runs 500] [--resamples 400] [--seed 0] [--conditions 1 2 ...]
                                       [--out FILE.md]

Written apart from `scripts/estimators_sim.py` and from `report/precision.py`, with another draw process:

- no hazard over turns: each play's ending is drawn at once from a fixed list of kinds, several of
  which carry two conflicts of one type (fact x 2, commitment x 2), its turn uniform over 1-30;
- plays of a story share its first play's ending with chance 1/2 (a story effect), so a story's plays
  correlate while every play's ending keeps the same law;
- the sheet is exactly m conflicts per type (2, 3 or 6; all of them when the run has fewer), drawn
  without replacement from the run's individual conflicts, each upheld with the auditor's precision;
- the truths are exact sums over the kinds: fact % corrected = 100 E[1 - (1 - p_fact)^c_fact], the
  conflict-free share 100 E[prod_k (1 - p_k)^c_k] (censored and resolved plays conflict-free).

Per condition and figure it prints the truth, the mean, the bias in points and in Monte Carlo standard
errors, the 95% intervals' coverage with its Monte Carlo se, and how often the point lay outside its own
interval. Run it with PYTHONPATH set to another checkout to measure that tree's `ncp_local`.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ncp_local.report import precision

# (name, probability, conflicts by type, censored)
KINDS: tuple[tuple[str, float, dict[str, int], bool], ...] = (
    ("fact", 0.24, {"fact": 1}, False),
    ("fact x2", 0.08, {"fact": 2}, False),
    ("commitment", 0.14, {"commitment": 1}, False),
    ("commitment x2", 0.04, {"commitment": 2}, False),
    ("fact + commitment", 0.06, {"fact": 1, "commitment": 1}, False),
    ("player input", 0.04, {"player_input": 1}, False),
    ("all resolved", 0.18, {}, False),
    ("window", 0.22, {}, True),
)
TYPES = ("fact", "commitment", "player_input")
MAX_TURNS = 30


@dataclass(frozen=True)
class Condition:
    name: str
    stories: int
    plays: int
    sheet: int  # items reviewed per type
    precision: dict[str, float]


P1 = {"fact": 0.8, "commitment": 0.5, "player_input": 0.9}
P2 = {"fact": 0.95, "commitment": 0.3, "player_input": 0.7}
CONDITIONS = {
    "1": Condition("1", 30, 1, 2, P1),
    "2": Condition("2", 30, 1, 3, P1),
    "3": Condition("3", 30, 1, 6, P1),
    "4": Condition("4", 20, 3, 2, P1),
    "5": Condition("5", 20, 3, 3, P1),
    "6": Condition("6", 20, 3, 6, P1),
    "7": Condition("7", 50, 1, 2, P2),
    "8": Condition("8", 50, 1, 6, P2),
}
FIGURES = ("fact % corrected", "commitment % corrected", "conflict-free % corrected")


def truths(p: dict[str, float]) -> dict[str, float]:
    fact = sum(w * (1 - (1 - p["fact"]) ** c.get("fact", 0)) for _, w, c, _ in KINDS)
    commit = sum(w * (1 - (1 - p["commitment"]) ** c.get("commitment", 0)) for _, w, c, _ in KINDS)
    free = sum(w * math.prod((1 - p[t]) ** c.get(t, 0) for t in TYPES) for _, w, c, _ in KINDS)
    return dict(zip(FIGURES, (100 * fact, 100 * commit, 100 * free), strict=True))


def draw_run(c: Condition, rng: random.Random) -> SimpleNamespace:
    weights = [w for _, w, _, _ in KINDS]
    results = {}
    for s in range(c.stories):
        first = rng.choices(range(len(KINDS)), weights)[0]
        for k in range(c.plays):
            kind = first if k == 0 or rng.random() < 0.5 else rng.choices(range(len(KINDS)), weights)[0]
            _, _, conflicts, censored = KINDS[kind]
            turn = rng.randint(1, MAX_TURNS)
            last = SimpleNamespace(
                conflicts=[
                    SimpleNamespace(type=t, target_id=f"{t}_{j}") for t, n in conflicts.items() for j in range(n)
                ]
            )
            term = "context_limit" if censored else "conflict" if conflicts else "all_resolved"
            results[f"s{s}~t{k}"] = SimpleNamespace(
                spec_id=f"s{s}", trial=k, termination=term, turns=[SimpleNamespace(conflicts=[])] * (turn - 1) + [last]
            )
    return SimpleNamespace(results=results, label="sim", max_turns=MAX_TURNS, path=Path("/sim"))


def review(c: Condition, run: SimpleNamespace, rng: random.Random) -> list[precision.Verdict]:
    out = []
    for t in TYPES:
        pool = [(key, x.target_id) for key, r in run.results.items() for x in r.turns[-1].conflicts if x.type == t]
        for key, target in rng.sample(pool, min(c.sheet, len(pool))):
            out.append(precision.Verdict("/sim", key, t, target, rng.random() < c.precision[t]))
    return out


def simulate(c: Condition, runs: int, resamples: int, seed: int) -> dict[str, list[tuple[float, float, float]]]:
    rng = random.Random(f"{seed}-{c.name}")
    est: dict[str, list[tuple[float, float, float]]] = {f: [] for f in FIGURES}
    for i in range(runs):
        run = draw_run(c, rng)
        verdicts = review(c, run, rng)
        cor = precision.correct(run, precision.precisions(verdicts, 0.95), verdicts, resamples, i, 0.95)
        n = cor.scored
        for key, fig in (("fact_pct", FIGURES[0]), ("commitment_pct", FIGURES[1])):
            iv = cor.rates[key][1]
            est[fig].append((iv.point, iv.lo, iv.hi))
        free = cor.conflict_free[1]
        est[FIGURES[2]].append((100 * free.point / n, 100 * free.lo / n, 100 * free.hi / n))
    return est


def summary(xs: list[tuple[float, float, float]], truth: float) -> dict[str, float]:
    m = len(xs)
    pts = [x[0] for x in xs]
    mean = sum(pts) / m
    sd = math.sqrt(sum((x - mean) ** 2 for x in pts) / (m - 1))
    cover = sum(lo - 1e-9 <= truth <= hi + 1e-9 for _, lo, hi in xs) / m
    return {
        "mean": mean,
        "bias": mean - truth,
        "bias_se": sd / math.sqrt(m),
        "cover": 100 * cover,
        "cover_se": 100 * math.sqrt(cover * (1 - cover) / m),
        "outside": 100 * sum(not (lo - 1e-9 <= p <= hi + 1e-9) for p, lo, hi in xs) / m,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--resamples", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conditions", nargs="*", default=list(CONDITIONS))
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = [
        "| cond | stories x plays | sheet per type | figure | truth | mean | bias (points) | bias / MC se | "
        "covers % | MC se | point outside % |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in a.conditions:
        c = CONDITIONS[name]
        t0 = time.time()
        truth = truths(c.precision)
        for fig, xs in simulate(c, a.runs, a.resamples, a.seed).items():
            s = summary(xs, truth[fig])
            lines.append(
                f"| {c.name} | {c.stories} x {c.plays} | {c.sheet} | {fig} | {truth[fig]:.2f} | {s['mean']:.2f} | "
                f"{s['bias']:+.2f} | {s['bias'] / s['bias_se']:+.1f} | {s['cover']:.1f} | {s['cover_se']:.1f} | "
                f"{s['outside']:.1f} |"
            )
        print("\n".join(lines[-3:]), f"\n({c.name}: {time.time() - t0:.0f} s)", flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
