"""Why a common ending's incidence band misses at 50 stories x 1 play with half the plays censored.

Usage: python scripts/incidence_bias.py [--runs 4000] [--resamples 200] [--conditions B] [--ending fact]

On the same simulated runs as `scripts/estimators_sim.py` (its conditions, seeds and draws), this splits
the incidence F_k(T+1)'s misses into the point's bias and the band's width: per condition it prints the
truth, the Aalen-Johansen point's mean and bias, the spread of the point over runs against the spread the
band's bootstrap sees, the coverage of the rig's band, of the same band moved by the mean bias (what the
band would cover with an unbiased point) and of a band with the point's true spread, the band's mean width
and on which side it misses; and the same split by whether anyone was still at risk at the cap (where no one
is, F_k stops growing early). Run it with PYTHONPATH set to another checkout to measure that tree's band.
docs/measurements/2026-12-05-estimators.md holds the figures.
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


def _truth(max_turns: int, seed: int, e: int, at: int) -> float:
    """F_e(at) over 400,000 stories, as `estimators_sim.truths` computes F_e(T+1)."""
    rng = np.random.default_rng([seed, 11])
    u = rng.gamma(2.0, 0.5, size=sim.TRUTH_STORIES)
    h = sim.hazard(u, max_turns)
    s = np.concatenate([np.ones((len(u), 2)), np.cumprod(1 - h, axis=1)[:, :-1]], axis=1)
    ends_at = s[:, 1:] * h * sim.shares(max_turns)[e]  # P(T = n, ending e), n = 1..max_turns
    return float(ends_at[:, : at - 1].sum(axis=1).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--conditions", nargs="+", default=["B"])
    ap.add_argument("--ending", default="fact")
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--turn", type=int, default=None, help="t of F_k(t) (default: the cap + 1, the table's)")
    a = ap.parse_args()
    rig = sim.load_rig()
    mt, level, seed = a.max_turns, 0.95, 0
    at = mt + 1 if a.turn is None else a.turn
    # F_k(t) = the chance of ending by k at a turn before t; the truth from the simulation's own model.
    truth = _truth(mt, seed, [e[0] for e in sim.ENDS].index(a.ending), at)
    k = rig.metrics.ENDINGS.index(a.ending)
    for name in a.conditions:
        c = sim.CONDITIONS[name]
        q = sim.censor_rate(c, mt, seed)
        rng = np.random.default_rng([seed, c.stories, c.plays, int(100 * c.censoring)])  # as simulate() draws
        pts, los, his, sds, empty = [], [], [], [], []
        for _ in range(a.runs):
            x = sim.draw(c, mt, q, rng)
            ms = sim.metrics_of(rig, x)
            inc = rig.endings.cumulative_incidence(ms, mt, level, a.resamples, 0)
            turns, codes = rig.endings._codes(ms)
            units = rig.endings.clusters([m.spec_id for m in ms])
            draws = rig.endings.draws(units, a.resamples, 0)
            many = [rig.endings.aalen_johansen(turns[i], codes[i], mt)[k, at] for i in draws]
            pts.append(inc.curves[a.ending][at])
            los.append(inc.lo[a.ending][at])
            his.append(inc.hi[a.ending][at])
            sds.append(float(np.std(many)))
            empty.append(int((turns >= mt).sum()) == 0)  # no one reached the cap's turn: F stops early
        p, lo, hi, sd, e = (np.asarray(v) for v in (pts, los, his, sds, empty))
        z = stats.norm.ppf(0.975)
        bias = p.mean() - truth

        def cover(lo_: np.ndarray, hi_: np.ndarray, sel: np.ndarray) -> str:
            cv = float(np.mean((lo_[sel] <= truth) & (truth <= hi_[sel])))
            return f"{100 * cv:.1f} ({100 * math.sqrt(max(cv * (1 - cv), 0.0475) / max(sel.sum(), 1)):.1f})"

        every = np.ones(len(p), dtype=bool)
        print(f"condition {name} ({c.stories} x {c.plays}, {100 * c.censoring:.0f}% censored), {a.runs} runs, "
              f"F_{a.ending}({at}) truth {truth:.4f}")  # fmt: skip
        se = 100 * p.std(ddof=1) / math.sqrt(len(p)) / truth
        print(f"  point mean {p.mean():.4f}, bias {100 * bias / truth:+.1f}% (MC se {se:.1f}%)")
        print(
            f"  spread of the point over runs {p.std(ddof=1):.4f}; the bootstrap's, mean {sd.mean():.4f} "
            f"(rms {math.sqrt(np.mean(sd**2)):.4f}), ratio {math.sqrt(np.mean(sd**2)) / p.std(ddof=1):.3f}"
        )
        moved = cover(lo - bias, hi - bias, every)
        print(f"  covers: the rig's band {cover(lo, hi, every)}; moved by the mean bias {moved}; "
              f"point +- z x true spread {cover(p - z * p.std(ddof=1), p + z * p.std(ddof=1), every)}")  # fmt: skip
        print(f"  the rig's band: mean width {np.mean(hi - lo):.3f}; misses with the truth above it "
              f"{100 * np.mean(hi < truth):.1f}%, below it {100 * np.mean(lo > truth):.1f}%")  # fmt: skip
        for label, sel in (("no one at risk at the cap", e), ("someone at risk at the cap", ~e)):
            if sel.sum() > 1:
                print(
                    f"  {label}: {100 * sel.mean():.1f}% of runs, point mean {p[sel].mean():.4f} "
                    f"(bias {100 * (p[sel].mean() - truth) / truth:+.1f}%), covers {cover(lo, hi, sel)}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
