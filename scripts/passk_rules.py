"""pass^k's estimability rule against stricter ones, on estimators_sim.py's simulated runs.

Usage: python scripts/passk_rules.py [--runs 1000] [--resamples 200] [--conditions C D] [--seed 0]

For each run of a condition with trials (C: 30 stories x 8 plays, D: 50 x 3; scripts/estimators_sim.py)
and each pass^k(t) it reports, this records the stories observed, all surviving and ended at t (as
report/trials.py's `not_estimable` counts them), the point and its band, and the pooled Kaplan-Meier S(t);
then, per rule, how often pass^k(t) is shown and, over the runs shown, its coverage and bias:

- now: the rig's rule (10 observed, 5 all surviving, 5 ended);
- 8 surviving, 10 surviving: the same with a higher count on the surviving side;
- expected: the rule now, and observed x S(t)^k >= 5 (the all-k chance were a story's plays independent);
- always: shown in every run with a band (what the rule guards against).

docs/measurements/2026-12-05-estimators.md gives the figures and what they say.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import estimators_sim as es  # noqa: E402  (the simulation this measures on)


def rules(a: np.ndarray) -> dict[str, np.ndarray]:
    """a: per run (observed, surviving, ended, point, lo, hi, observed x S(t)^k)."""
    now = (a[:, 0] >= 10) & (a[:, 1] >= 5) & (a[:, 2] >= 5)
    return {
        "now": now,
        "8 surviving": now & (a[:, 1] >= 8),
        "10 surviving": now & (a[:, 1] >= 10),
        "expected": now & (a[:, 6] >= 5),
        "always": ~np.isnan(a[:, 4]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--conditions", nargs="+", default=["C", "D"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if bad := [c for c in a.conditions if c not in es.CONDITIONS or es.CONDITIONS[c].plays < 2]:
        print(f"error: --conditions: {', '.join(bad)}: not a condition with trials (C, D)", file=sys.stderr)
        return 2
    from ncp_local.protocol.metrics import product_limit

    rig = es.load_rig()
    cap = 30
    truth = es.truths(cap, a.seed)
    print("| cond | estimator | truth | rule | shown % | covers % (MC se) | bias % |")
    print("|---|---|---:|---|---:|---|---:|")
    for name in a.conditions:
        c = es.CONDITIONS[name]
        q = es.censor_rate(c, cap, a.seed)
        # The same stream as estimators_sim.simulate: the same simulated runs, in the same order.
        rng = np.random.default_rng([a.seed, c.stories, c.plays, int(100 * c.censoring)])
        ks = sorted({2, c.plays})
        rec: dict[tuple[int, int], list[tuple[float, ...]]] = {(k, t): [] for k in ks for t in (es.MID, cap)}
        for _ in range(a.runs):
            x = es.draw(c, cap, q, rng)
            ms = es.metrics_of(rig, x)
            ss = [rig.trials.Story(f"s{i}", tuple(m for m in ms if m.spec_id == f"s{i}")) for i in range(c.stories)]
            f = rig.trials.fates(ss, cap)
            s = product_limit(x.turns, (x.ending != -2).astype(float), cap)
            for k in ks:
                observed = (f.plays >= k)[:, None] & (f.known.sum(axis=1) >= k)
                surviving = (observed & (f.seen.sum(axis=1) >= k)).sum(axis=0)
                ended = (observed & (f.known & ~f.seen).any(axis=1)).sum(axis=0)
                point = rig.trials.pass_k_curve(ss, k, cap)
                lo, hi = rig.trials.pass_k_band(ss, k, cap, a.resamples, 0, 0.95)
                n_obs = observed.sum(axis=0)
                for t in (es.MID, cap):
                    row = (n_obs[t], surviving[t], ended[t], point[t], lo[t], hi[t], n_obs[t] * s[t] ** k)
                    rec[(k, t)].append(tuple(float(v) for v in row))
        for (k, t), rows in rec.items():
            arr = np.asarray(rows)
            th = truth[f"pass^{k}({t})"]
            covers = (arr[:, 4] <= th + 1e-12) & (th <= arr[:, 5] + 1e-12)
            for rule, shown in rules(arr).items():
                m = int(shown.sum())
                cov = float(covers[shown].mean()) if m else math.nan
                se = 100 * math.sqrt(max(cov * (1 - cov), 0.95 * 0.05) / m) if m else math.nan
                bias = 100 * (float(np.nanmean(arr[shown, 3])) - th) / th if m else math.nan
                print(
                    f"| {name} | pass^{k}({t}) | {th:.4f} | {rule} | {100 * shown.mean():.1f} | "
                    + (f"{100 * cov:.1f} ({se:.1f}) | {bias:.0f} |" if m else "n/a | n/a |")
                )
    print(f"\n{a.runs} simulated runs per condition, {a.resamples} bootstrap draws, max_turns={cap}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
