"""The miss correction (report/misses.py) against a known truth: simulated runs and plants, coverage of its interval.

Usage: python scripts/misses_sim.py [--runs 500] [--resamples 1000] [--seed 0] [--out FILE.md]

Nothing of the rig plays here: each simulated run is drawn directly from the model the correction assumes.
Every turn of an episode holds a real contradiction of type k with chance h_k (each type on its own); the
auditor flags a real one as type k with chance r_k and a turn without one as type k with chance f_k; the
first flagged turn ends the episode, else it ends at the turn cap. Alongside, a plant directory is drawn:
per story, clean items flagged as k with chance f_k, and planted items of type k found (type named right)
with chance r_k. The rig's code under test is only what reads these: the plants' effective number of items
(report/plants.effective_items) and the correction with its interval (report/misses.corrected_rates).

Conditions (30 stories, one episode each, a cap of 30 turns, 2 clean and 2 planted items per type and
story unless said):

- A: h = 0.04 / 0.02 / 0.01 (fact / commitment / player_input), r = 0.80 / 0.60 / 0.90, f = 0.010 / 0.005 /
  0.005.
- B: as A with 1 planted item per type and story (30 per type): the plants' uncertainty dominates.
- C: as A with 60 stories and a recall of 0.5 for every type: many misses to correct.

Per type it prints the truth, the mean estimate, the share of 95% intervals covering the truth with its
Monte Carlo standard error, and the mean width. docs/measurements/2026-12-07-planted.md holds the figures.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ncp_local.report.misses import Measured, corrected_rates  # noqa: E402
from ncp_local.report.plants import effective_items  # noqa: E402

TYPES = ("fact", "commitment", "player_input")


@dataclass(frozen=True)
class Condition:
    name: str
    h: tuple[float, ...] = (0.04, 0.02, 0.01)
    r: tuple[float, ...] = (0.80, 0.60, 0.90)
    f: tuple[float, ...] = (0.010, 0.005, 0.005)
    stories: int = 30
    cap: int = 30
    clean_per_story: int = 2
    planted_per_story: int = 2


CONDITIONS = {
    "A": Condition("A"),
    "B": Condition("B", planted_per_story=1),
    "C": Condition("C", r=(0.5, 0.5, 0.5), stories=60),
}


def episodes(c: Condition, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(turns judged per episode, ended as type k: episodes x types)."""
    h, r, f = (np.asarray(x) for x in (c.h, c.r, c.f))
    turns = np.zeros(c.stories)
    ended = np.zeros((c.stories, len(TYPES)), dtype=bool)
    for e in range(c.stories):
        for t in range(1, c.cap + 1):
            real = rng.random(len(TYPES)) < h
            flagged = rng.random(len(TYPES)) < np.where(real, r, f)
            if flagged.any() or t == c.cap:
                turns[e], ended[e] = t, flagged
                break
    return turns, ended


def plants(c: Condition, rng: np.random.Generator, resamples: int, seed: int) -> dict[str, tuple[Measured, Measured]]:
    out = {}
    for k, t in enumerate(TYPES):
        found = rng.random((c.stories, c.planted_per_story)) < c.r[k]
        alarms = rng.random((c.stories, c.clean_per_story)) < c.f[k]
        measured = []
        for hits in (found, alarms):
            stories = [f"s{i}" for i in range(c.stories) for _ in range(hits.shape[1])]
            flat = hits.reshape(-1).astype(float)
            p, n_eff = effective_items(flat, np.ones_like(flat), stories, resamples, seed, 0.95)
            measured.append(Measured(p, n_eff))
        out[t] = (measured[0], measured[1])
    return out


def simulate(c: Condition, runs: int, resamples: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    got: dict[str, list[tuple[float, float, float]]] = {t: [] for t in TYPES}
    started = time.perf_counter()
    for i in range(runs):
        turns, ended = episodes(c, rng)
        measured = plants(c, rng, resamples, seed + i)
        stories = [f"s{e}" for e in range(c.stories)]
        rates = corrected_rates(
            stories, turns, {t: ended[:, k] for k, t in enumerate(TYPES)}, measured, resamples, seed + i, 0.95
        )
        for rate in rates:
            got[rate.type].append((rate.value, rate.lo, rate.hi))
    took = time.perf_counter() - started
    lines = [
        f"### Condition {c.name}: {runs} runs, {c.stories} stories, cap {c.cap} turns, "
        f"{c.planted_per_story} planted and {c.clean_per_story} clean items per type and story ({took:.0f} s)",
        "",
        "| type | h | r | f | mean estimate | coverage % (MC se) | mean width | no interval |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, t in enumerate(TYPES):
        a = np.asarray(got[t])
        ok = ~np.isnan(a[:, 1])
        truth = c.h[k]
        cov = float(np.mean((a[ok, 1] <= truth + 1e-12) & (truth - 1e-12 <= a[ok, 2])))
        se = math.sqrt(cov * (1 - cov) / ok.sum())
        lines.append(
            f"| {t} | {truth:.3f} | {c.r[k]:.2f} | {c.f[k]:.3f} | {np.nanmean(a[:, 0]):.4f} | "
            f"{100 * cov:.1f} ({100 * se:.1f}) | {np.mean(a[ok, 2] - a[ok, 1]):.4f} | {int((~ok).sum())} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    parts = []
    for name in args.conditions:
        parts.append(simulate(replace(CONDITIONS[name]), args.runs, args.resamples, args.seed))
        print(parts[-1] + "\n", flush=True)
    if args.out:
        args.out.write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
