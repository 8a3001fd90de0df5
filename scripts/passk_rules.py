"""pass^k's estimability rules and bands against each other, on estimators_sim.py's simulated runs.

Usage: python scripts/passk_rules.py [--runs 1000] [--resamples 200] [--conditions C D E] [--seed 0]

For each run of a condition with trials (C: 30 stories x 8 plays, D: 50 x 3, E: C with plays that share
their story's fate with chance 0.8; scripts/estimators_sim.py) and each pass^k(t) it reports, this records
the stories observed, all surviving and ended at t (report/trials.py's `observed_counts`), the stories'
k plays censoring follows through t (`followed`), the point and two bands from the same bootstrap draws
(the percentile band, pass^k's before h58e, and Jeffreys' at the effective sample size,
`effective_pass_k_band`), and the pooled Kaplan-Meier S(t); then, per rule and band, how often pass^k(t)
is shown and, over the runs shown, its coverage, bias and mean width:

- now: the rule before h58e (10 observed, 5 all surviving, 5 ended);
- 8 surviving, 10 surviving: the same with a higher count on the surviving side;
- expected, independent: the rule then, and observed x S(t)^k >= 5 (plays taken as independent);
- expected, beta-binomial: 10 observed and observed x E[p^k] >= 5, p ~ Beta fitted to the stories'
  surviving shares (S(t)^k for independent plays, S(t) for plays that agree);
- 10 observed: the count of stories alone;
- 10 observed, 10 followed (h58e): and stories with k plays x G(t)^k >= 10 (the rig's rule since h58e);
- always: shown in every run with a band (what a rule guards against).

docs/measurements/2026-12-05-estimators.md gives the figures and what they say.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import estimators_sim as es  # noqa: E402  (the simulation this measures on)

from ncp_local.protocol.resample import percentile  # noqa: E402

# The columns of a run's record (per pass^k(t)).
OBS, SURV, ENDED, PLAYS, POINT, P_LO, P_HI, E_LO, E_HI, INDEP, BETA, FOLLOWED = range(12)


def beta_binomial_all_k(share: float, seen: np.ndarray, known: np.ndarray, k: int) -> float:
    """E[p^k] for p ~ Beta with mean `share` (the run's S(t)) and the intra-story correlation rho of the
    stories' surviving shares seen/known (method of moments over the stories with 2 known plays or more):
    S(t)^k when the plays of a story are independent (rho = 0), S(t) when they agree (rho = 1)."""
    use = known >= 2
    if use.sum() < 2 or not 0 < share < 1:
        return share**k if not math.isnan(share) else math.nan
    m = known[use].astype(float)
    frac = seen[use] / m
    inv_m = float(np.mean(1 / m))
    v = float(frac.var(ddof=1)) / (share * (1 - share))
    rho = min(max((v - inv_m) / (1 - inv_m), 0.0), 1.0)
    if rho == 0 or rho == 1:
        return share**k if rho == 0 else share
    theta = (1 - rho) / rho
    return math.prod((share * theta + j) / (theta + j) for j in range(k))


def rules(a: np.ndarray) -> dict[str, np.ndarray]:
    """a: per run the record's columns (OBS .. BETA); which runs each rule shows pass^k(t) in."""
    observed = a[:, OBS] >= 10
    now = observed & (a[:, SURV] >= 5) & (a[:, ENDED] >= 5)
    return {
        "now": now,
        "8 surviving": now & (a[:, SURV] >= 8),
        "10 surviving": now & (a[:, SURV] >= 10),
        "expected, independent": now & (a[:, INDEP] >= 5),
        "expected, beta-binomial": observed & (a[:, BETA] >= 5),
        "10 observed": observed,
        "10 observed, 10 followed (h58e)": observed & (a[:, FOLLOWED] >= 10),
        "always": ~np.isnan(a[:, POINT]),
    }


BANDS = {"percentile": (P_LO, P_HI), "effective": (E_LO, E_HI)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--conditions", nargs="+", default=["C", "D"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if bad := [c for c in a.conditions if c not in es.CONDITIONS or es.CONDITIONS[c].plays < 2]:
        known = ", ".join(n for n, c in es.CONDITIONS.items() if c.plays > 1)
        print(f"error: --conditions: {', '.join(bad)}: not a condition with trials ({known})", file=sys.stderr)
        return 2
    from ncp_local.protocol.metrics import product_limit

    rig = es.load_rig()
    tr = rig.trials
    cap = 30
    print("| cond | estimator | truth | rule | band | shown % | covers % (MC se) | bias % | mean width |")
    print("|---|---|---:|---|---|---:|---|---:|---:|")
    for name in a.conditions:
        c = es.CONDITIONS[name]
        truth = es.truths(cap, a.seed, c.shared)
        q = es.censor_rate(c, cap, a.seed)
        # The same stream as estimators_sim.simulate: the same simulated runs, in the same order.
        rng = np.random.default_rng([a.seed, c.stories, c.plays, int(100 * c.censoring)])
        ks = sorted({2, c.plays})
        rec: dict[tuple[int, int], list[tuple[float, ...]]] = {(k, t): [] for k in ks for t in (es.MID, cap)}
        for _ in range(a.runs):
            x = es.draw(c, cap, q, rng)
            ms = es.metrics_of(rig, x)
            ss = [tr.Story(f"s{i}", tuple(m for m in ms if m.spec_id == f"s{i}")) for i in range(c.stories)]
            f = tr.fates(ss, cap)
            s = product_limit(x.turns, (x.ending != -2).astype(float), cap)
            for k in ks:
                n_obs, surviving, ended, plays = tr.observed_counts(f, k)
                point = tr.pass_k_curve(ss, k, cap)
                many = tr.pass_k_draws(ss, k, cap, a.resamples, 0)
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    p_lo, p_hi = percentile(many, 0.95)
                e_lo, e_hi = tr.effective_pass_k_band(point, many, n_obs, plays, 0.95)
                reach = tr.followed(f, k)
                for t in (es.MID, cap):
                    eligible = f.plays >= k
                    seen, known = f.seen[eligible, :, t].sum(axis=1), f.known[eligible, :, t].sum(axis=1)
                    beta = n_obs[t] * beta_binomial_all_k(float(s[t]), seen, known, k)
                    row = (n_obs[t], surviving[t], ended[t], plays[t], point[t], p_lo[t], p_hi[t], e_lo[t], e_hi[t],
                           n_obs[t] * s[t] ** k, beta, reach[t])  # fmt: skip
                    rec[(k, t)].append(tuple(float(v) for v in row))
        for (k, t), rows in rec.items():
            arr = np.asarray(rows)
            th = truth[f"pass^{k}({t})"]
            for rule, shown in rules(arr).items():
                for band, (lo, hi) in BANDS.items():
                    covers = (arr[:, lo] <= th + 1e-12) & (th <= arr[:, hi] + 1e-12)
                    m = int(shown.sum())
                    cov = float(covers[shown].mean()) if m else math.nan
                    se = 100 * math.sqrt(max(cov * (1 - cov), 0.95 * 0.05) / m) if m else math.nan
                    bias = 100 * (float(np.nanmean(arr[shown, POINT])) - th) / th if m else math.nan
                    width = float(np.nanmean(arr[shown, hi] - arr[shown, lo])) if m else math.nan
                    print(
                        f"| {name} | pass^{k}({t}) | {th:.4f} | {rule} | {band} | {100 * shown.mean():.1f} | "
                        + (f"{100 * cov:.1f} ({se:.1f}) | {bias:.0f} | {width:.3f} |" if m else "n/a | n/a | n/a |")
                    )
            mean_counts = arr[:, [OBS, SURV, ENDED]].mean(axis=0)
            print(f"| {name} | pass^{k}({t}) | mean counts: observed, all surviving, ended | "
                  + " / ".join(f"{v:.1f}" for v in mean_counts) + " |||||")  # fmt: skip
        sys.stdout.flush()
    print(f"\n{a.runs} simulated runs per condition, {a.resamples} bootstrap draws, max_turns={cap}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
