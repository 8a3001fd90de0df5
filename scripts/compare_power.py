"""Size and power of mode=compare's paired sign-flip test, on simulated pairs of runs with a known difference.

Usage: python scripts/compare_power.py [--sims 250] [--flips 199] [--stories 30 50] [--plays 1 3]
                                       [--ratios 1.0 0.6] [--max-turns 20] [--seed 0] [--out FILE.md]

A simulated pair of runs plays the same stories. Each story has its own difficulty (a log-normal frailty
u, sd 0.6 on the log scale) shared by both runs and all its plays; a play goes turn by turn: the window
fills with chance 2% a turn (`context_limit`, censored at the turns committed), else a conflict of one
of three types ends it with chance 0.08 u (run A) or 0.08 u r (run B), else it reaches the cap. r = 1
is no difference (the rejections are the test's size), r < 1 a run that keeps its stories longer (the
rejections are its power). The true differences come from one draw of 20,000 stories per run.

Each pair goes through the rig's own comparison code (`report/compare.py`: `Pool`, `measurer`,
`sign_flip_p`, every figure at once) with `--flips` random sign patterns; the table gives, per figure,
the share of pairs with p <= 0.05 and its Monte Carlo standard error. docs/measurements/
2026-12-05-comparisons.md holds the table and the command.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from ncp_local.protocol.metrics import EpisodeMetrics
from ncp_local.report.paired import Pool, figures_of, measurer, paired_differences, sign_flip_p, take

FIGURES = ("turns_kept", "avg_turns", "fact_pct", "S(10)", "fact_at_h")


def play(rng: np.random.Generator, sid: str, hazard: float, cap: int, trial: int) -> EpisodeMetrics:
    for t in range(1, cap + 1):
        if rng.random() < 0.02:
            return EpisodeMetrics(sid, "context_limit", t - 1, 0.2, 0.3, False, False, False, trial=trial)
        if rng.random() < hazard:
            kind = int(rng.integers(3))
            return EpisodeMetrics(sid, "conflict", t, 0.2, 0.3, kind == 0, kind == 1, kind == 2, trial=trial)
    return EpisodeMetrics(sid, "max_turns", cap, 0.2, 0.3, False, False, False, trial=trial)


def pair(rng: np.random.Generator, stories: int, plays: int, ratio: float, cap: int) -> Pool:
    frail = rng.lognormal(0, 0.6, size=stories)
    return Pool(
        [
            [[play(rng, f"s{i}", min(0.9, 0.08 * frail[i] * r), cap, k) for k in range(plays)] for i in range(stories)]
            for r in (1.0, ratio)
        ]
    )


def truth(ratio: float, cap: int, turns_at: list[int], seed: int) -> np.ndarray:
    pool = pair(np.random.default_rng(seed), 20_000, 1, ratio, cap)
    m = measurer(pool, cap, turns_at, True)
    every = np.arange(20_000)
    return np.asarray(m(take(pool, 1, every)) - m(take(pool, 0, every)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=250)
    ap.add_argument("--flips", type=int, default=199)
    ap.add_argument("--stories", type=int, nargs="+", default=[30, 50])
    ap.add_argument("--plays", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.6])
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mdd", type=int, default=0, help="also the mean MDD of turns kept over the first N pairs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cap = args.max_turns
    turns_at = [10]
    keys = [f.key for f in figures_of(cap, turns_at, True)]
    cols = [keys.index(k) for k in FIGURES]
    header = ["stories", "plays", "hazard ratio", *(f"{k}: true diff" for k in FIGURES[:1])]
    header += [f"{k} rejects %" for k in FIGURES]
    if args.mdd:
        header.append("turns_kept: mean MDD 80%")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    started = time.perf_counter()
    for ratio in args.ratios:
        true = truth(ratio, cap, turns_at, args.seed + 1)
        for stories in args.stories:
            for plays in args.plays:
                rng = np.random.default_rng([args.seed, stories, plays, int(ratio * 1000)])
                hits = np.zeros(len(keys))
                mdds = []
                for sim in range(args.sims):
                    pool = pair(rng, stories, plays, ratio, cap)
                    p = sign_flip_p(measurer(pool, cap, turns_at, True), pool, args.flips, rng)
                    hits += p <= 0.05
                    if sim < args.mdd:
                        diffs = paired_differences(pool, cap, turns_at, True, args.flips, sim, 0.95)
                        mdds.append(next(d.mdd for d in diffs if d.figure.key == "turns_kept"))
                rates = hits / args.sims
                cells = [
                    f"{100 * rates[c]:.1f} +- {100 * math.sqrt(rates[c] * (1 - rates[c]) / args.sims):.1f}"
                    for c in cols
                ]
                row = [str(stories), str(plays), f"{ratio:g}", f"{true[cols[0]]:+.2f}", *cells]
                if args.mdd:
                    row.append(f"{np.mean(mdds):.2f}")
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    took = time.perf_counter() - started
    text = (
        "\n".join(lines) + f"\n\n{args.sims} simulated pairs per row, {args.flips} sign patterns each; {took:.0f} s.\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
