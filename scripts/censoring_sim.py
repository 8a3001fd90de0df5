"""Which comparisons censoring bends: false verdicts and power when one run's window stops more plays.

Usage: python scripts/censoring_sim.py [--pairs 1000] [--flips 199] [--stories 50] [--max-turns 20]
                                       [--scenarios N1 N2 ...] [--seed 0] [--out FILE.md]

A pair of runs plays the same stories with the same narrator (null scenarios N*) or with run B keeping
its stories longer (hazard times 0.6, power scenarios P*). Each story has a log-normal frailty shared by
both runs; a play goes turn by turn: its window fills with chance q t / cap at turn t (the context fills:
`context_limit`, censored at the turns played), else a conflict of one of three types ends it with chance
0.08 u, else it reaches the cap. The runs' q differ by scenario. Each pair goes through the rig's
`report/compare.py` (`Pool`, `measurer`, `sign_flip_p`, every figure at once).

Per figure and rule, the table gives how often the figure got a verdict and, given one, the share of
pairs with p <= 0.05: the false-verdict rate in a null scenario (same narrator: every "difference" is
false), the power in P*. The rules, read off the same pairs:

- before: every figure gets a verdict;
- any: the as-played figures get none when the runs' window-censored shares differ at all (the rig's rule);
- test: none only when a paired sign-flip test of the censored shares finds them different at 5%.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from ncp_local.protocol.metrics import EpisodeMetrics
from ncp_local.report import paired
from ncp_local.report.paired import MEANS, Pool, figures_of, measurer, sign_flip_p

SCENARIOS = {  # name: (q of run A, q of run B, hazard ratio of B)
    "N1": (0.0, 0.035, 1.0),  # the case: B's window stops about 30% of its plays, A's none
    "N2": (0.017, 0.035, 1.0),
    "N3": (0.0, 0.005, 1.0),  # a small difference: about 5%
    "N4": (0.035, 0.035, 1.0),  # the same window in both
    "N5": (0.0, 0.0, 1.0),  # no window at all
    "P1": (0.0, 0.035, 0.6),  # a real difference, B censored more
    "P2": (0.0, 0.0, 0.6),  # a real difference, no window
}
SHOWN = ("avg_turns", "fact_pct", "commitment_pct", "trajectory_pct", "conflict_free_pct", "turns_kept", "S(10)",
         "fact_at_h", "commitment_at_h")  # fmt: skip


def play(rng: np.random.Generator, sid: str, hazard: float, q: float, cap: int) -> EpisodeMetrics:
    for t in range(1, cap + 1):
        if rng.random() < q * t / cap * 5:
            return EpisodeMetrics(sid, "context_limit", t - 1, 0.2, 0.3, False, False, False)
        if rng.random() < hazard:
            kind = int(rng.integers(3))
            traj = float(rng.random())
            return EpisodeMetrics(sid, "conflict", t, traj, 0.3, kind == 0, kind == 1, kind == 2)
    return EpisodeMetrics(sid, "max_turns", cap, 0.9, 0.3, False, False, False)


def pair(rng: np.random.Generator, stories: int, scenario: tuple[float, float, float], cap: int) -> Pool:
    qa, qb, ratio = scenario
    frail = rng.lognormal(0, 0.6, size=stories)
    return Pool(
        [
            [[play(rng, f"s{i}", min(0.9, 0.08 * frail[i] * r), q, cap)] for i in range(stories)]
            for q, r in ((qa, 1.0), (qb, ratio))
        ]
    )


def censoring_test_p(pool: Pool, flips: int, rng: np.random.Generator) -> float:
    """Paired sign-flip p of the difference in window-censored counts per story."""
    per = [
        np.array(
            [float(np.sum(pool.window[s : s + n])) for s, n in zip(pool.starts[side], pool.lens[side], strict=True)]
        )
        for side in (0, 1)
    ]
    d = per[1] - per[0]
    obs = abs(d.sum())
    signs = np.where(rng.random((flips, len(d))) < 0.5, -1.0, 1.0)
    return float((1 + np.sum(np.abs(signs @ d) >= obs - 1e-9)) / (1 + flips))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--flips", type=int, default=199)
    ap.add_argument("--stories", type=int, default=50)
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    cap, turns_at = a.max_turns, [10]
    keys = [f.key for f in figures_of(cap, turns_at, True)]
    bent = {k for k, _ in MEANS}
    lines = [
        "| scenario | censored A / B % | figure | before: verdict % | before: p<=0.05 % | any: verdict % | "
        "any: p<=0.05 given one % | test: verdict % | test: p<=0.05 given one % |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    started = time.perf_counter()
    for name in a.scenarios:
        rng = np.random.default_rng([a.seed, list(SCENARIOS).index(name)])
        ps, differs, tested, shares = [], [], [], []
        for _ in range(a.pairs):
            pool = pair(rng, a.stories, SCENARIOS[name], cap)
            ps.append(sign_flip_p(measurer(pool, cap, turns_at, True), pool, a.flips, rng))
            sa, sb = paired.shares(pool)
            shares.append((sa, sb))
            differs.append(sa != sb)
            tested.append(censoring_test_p(pool, a.flips, rng) <= 0.05)
        p = np.asarray(ps)
        sh = np.mean(np.asarray(shares), axis=0)
        for key in SHOWN:
            i = keys.index(key)
            cells = []
            for withheld in (np.zeros(a.pairs, bool), np.asarray(differs), np.asarray(tested)):
                kept = ~withheld if key in bent else np.ones(a.pairs, bool)
                n = int(kept.sum())
                rate = float(np.mean(p[kept, i] <= 0.05)) if n else math.nan
                se = math.sqrt(rate * (1 - rate) / n) if n else math.nan
                cells += [f"{100 * n / a.pairs:.0f}", "n/a" if not n else f"{100 * rate:.1f} +- {100 * se:.1f}"]
            lines.append(f"| {name} | {100 * sh[0]:.0f} / {100 * sh[1]:.0f} | {key} | " + " | ".join(cells) + " |")
        print("\n".join(lines[-len(SHOWN) :]), f"\n({name}: {time.perf_counter() - started:.0f} s)", flush=True)
    text = "\n".join(lines) + f"\n\n{a.pairs} pairs per scenario, {a.stories} stories, {a.flips} sign patterns.\n"
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
