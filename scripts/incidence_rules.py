"""Rules for widening an ending's incidence band after the last ending, side by side on the same runs.

Usage: python scripts/incidence_rules.py [--runs 4000] [--conditions B] [--turns 10 20 31] [--ending fact]

On `scripts/estimators_sim.py`'s simulated runs (its conditions, seeds and draws), for F_k(t) at each
turn given, the coverage (with its Monte Carlo standard error), the misses on each side and the mean
width of the band of `report/endings.py`'s `effective_band` (Jeffreys' interval at the bootstrap's
effective sample size n*) with its upper limit taken at:

- before: n* (no widening);
- dorey-korn: n* x r(a) / r(e), the fall of the number at risk since the last ending (Dorey and Korn
  1987's modified limit, endings at e included);
- censoring only: n* x r(a) / (r(e) - d(e)), the rig's rule (`seen_since_last_ending`);
- peto upper: min(n*, r(a) / S(a)) in stories, Peto et al. 1977's effective size;
- peto both: the same for both limits;

e the last turn before t with an ending, d(e) its endings, a the last turn before t anyone was at risk.
docs/measurements/2026-12-05-estimators.md holds the figures and what they say.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import estimators_sim as sim  # noqa: E402
from incidence_bias import _truth  # noqa: E402

RULES = ("before", "dorey-korn", "censoring only", "peto upper", "peto both")


def jeffreys(p: float, n: float, alpha: float) -> tuple[float, float]:
    x = p * n
    lo = stats.beta.ppf(alpha, x + 0.5, n - x + 0.5) if x > 0 else 0.0
    hi = stats.beta.ppf(1 - alpha, x + 0.5, n - x + 0.5) if n - x > 0 else 1.0
    return (0.0 if np.isnan(lo) else min(lo, p)), (1.0 if np.isnan(hi) else max(hi, p))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--conditions", nargs="+", default=["B"])
    ap.add_argument("--turns", nargs="+", type=int, default=[10, 20, 31])
    ap.add_argument("--ending", default="fact")
    a = ap.parse_args()
    rig = sim.load_rig()
    E = rig.endings
    mt, level, seed = 30, 0.95, 0
    alpha = (1 - level) / 2
    z = stats.norm.ppf(1 - alpha)
    k = rig.metrics.ENDINGS.index(a.ending)
    truth = {t: _truth(mt, seed, [e[0] for e in sim.ENDS].index(a.ending), t) for t in a.turns}
    print("| cond | F_k(t) | truth | rule | covers % (MC se) | truth above / below % | mean width |")
    print("|---|---|---:|---|---|---|---:|")
    for name in a.conditions:
        c = sim.CONDITIONS[name]
        q = sim.censor_rate(c, mt, seed)
        rng = np.random.default_rng([seed, c.stories, c.plays, int(100 * c.censoring)])  # as simulate() draws
        bands: dict[int, dict[str, list[tuple[float, float]]]] = {t: {r: [] for r in RULES} for t in a.turns}
        for _ in range(a.runs):
            x = sim.draw(c, mt, q, rng)
            ms = sim.metrics_of(rig, x)
            turns, codes = E._codes(ms)
            point = E.aalen_johansen(turns, codes, mt)
            units = E.clusters([m.spec_id for m in ms])
            many = np.asarray([E.aalen_johansen(turns[i], codes[i], mt) for i in E.draws(units, a.resamples, 0)])
            lo, hi = E.effective_band(point, many, len(units.plays), len(ms), level)
            stories, plays = len(units.plays), len(ms)
            var = np.var(many, axis=0) * stories / max(stories - 1, 1)
            shrink = (z / stats.t.ppf(1 - alpha, stories - 1)) ** 2
            risk = rig.metrics.at_risk(turns, mt + 2)
            surv = rig.metrics.product_limit(turns, codes >= 0, mt + 1)
            ends = np.bincount(turns[codes >= 0], minlength=mt + 2)
            for t in a.turns:
                p, v = point[k, t], var[k, t]
                n_star = max(min(p * (1 - p) / v * shrink, plays) if v > 0 else stories, 1.0)
                last = int(np.nonzero(risk[:t] > 0)[0][-1])  # a
                ended = np.nonzero(ends[: last + 1] > 0)[0]
                e = int(ended[-1]) if len(ended) else last
                after = risk[e] - ends[e] if len(ended) else risk[last]
                n_peto = max(risk[last] / max(surv[last], 1e-12) * stories / plays * shrink, 1.0)
                censoring_only = min(1.0, risk[last] / after) if after > 0 else 1.0
                up = {
                    "before": n_star,
                    "dorey-korn": max(n_star * min(1.0, risk[last] / risk[e]), 1.0),
                    "censoring only": max(n_star * censoring_only, 1.0),
                    "peto upper": min(n_star, n_peto),
                }
                for r, n in up.items():
                    bands[t][r].append((float(lo[k, t]), jeffreys(p, n, alpha)[1]))
                bands[t]["peto both"].append(jeffreys(p, min(n_star, n_peto), alpha))
        for t in a.turns:
            for r in RULES:
                b = np.asarray(bands[t][r])
                cv = float(np.mean((b[:, 0] <= truth[t]) & (truth[t] <= b[:, 1])))
                se = 100 * math.sqrt(max(cv * (1 - cv), 0.0475) / len(b))
                print(
                    f"| {name} ({c.stories} x {c.plays}, {100 * c.censoring:.0f}%) | F_{a.ending}({t}) | "
                    f"{truth[t]:.4f} | {r} | {100 * cv:.1f} ({se:.1f}) | {100 * np.mean(b[:, 1] < truth[t]):.1f} / "
                    f"{100 * np.mean(b[:, 0] > truth[t]):.1f} | {np.mean(b[:, 1] - b[:, 0]):.3f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
