"""mode=plant's estimates against a known truth: a scripted auditor of set recall and false-alarm rate per type.

Usage: python scripts/plant_sim.py [--runs 500] [--stories 30] [--turns 2] [--resamples 1000]
                                   [--conditions A B] [--seed 0] [--out FILE.md]

One scripted source run is played once (the official release's first `--stories` stories, or the rig's own
specs when NCP_BENCH_DATASET is unset, 6 turns); its items are drawn as mode=plant draws them. Then each
simulated run judges every item twice through the mode's own path (modes/plant.judge_all: the call service,
the audit stages, the double-check, a run directory), by two scripted auditors whose call seeds differ
from run to run, and measures them as the mode does (report/plants.py):

- A: every story alike. Auditor 1 finds fact / commitment / player_input plants with chance 0.80 / 0.60 /
  0.90 and flags clean turns as fact / commitment / player_input with 0.05 / 0.03 / 0.02; auditor 2 finds
  them with 0.60 / 0.50 / 0.90 (a paired difference of -0.20 / -0.10 / 0) and flags with the same rates.
  Both name a found plant with another id of its type than the planted one with chance 0.25 / 0.10 / 0
  (so the id named right is recall x 0.75 / 0.90 / 1).
- B: stories differ. Each story's recall of each type is drawn per run from a Beta of the same mean and
  concentration 4 (auditor 2's from the same draw, shifted by its difference), so a story's items are
  correlated: what the clustered intervals are for.

Per figure it prints the truth, the mean estimate, the share of 95% intervals covering the truth with its
Monte Carlo standard error, and the mean width; for the paired differences the same, and how often p < 0.05
(the power, or the size where the truth is 0). docs/measurements/2026-12-07-planted.md holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ncp_local.engines.base import Request  # noqa: E402
from ncp_local.engines.scripted import PlantJudge, RandomPolicy, ScriptedEngine  # noqa: E402
from ncp_local.execution.calls import CallService, RoleBinding, Sampling  # noqa: E402
from ncp_local.modes.plant import judge_all  # noqa: E402
from ncp_local.protocol.plant import draw_items  # noqa: E402
from ncp_local.protocol.prompts import PromptPack  # noqa: E402
from ncp_local.protocol.stages import CONFLICT_TYPES  # noqa: E402
from ncp_local.report.plants import compare_auditors, measure  # noqa: E402
from ncp_local.report.runs import attach_specs, load_run  # noqa: E402
from ncp_local.rundir.store import RunDir  # noqa: E402

RECALL_1 = {"fact": 0.80, "commitment": 0.60, "player_input": 0.90}
RECALL_2 = {"fact": 0.60, "commitment": 0.50, "player_input": 0.90}
FALSE_ALARM = {"fact": 0.05, "commitment": 0.03, "player_input": 0.02}
# Of the plants found, named with another id of their type (a fact plant always has one: `response_internal`).
WRONG_ID = {"fact": 0.25, "commitment": 0.10, "player_input": 0.0}
CONCENTRATION = 4.0


class StoryJudge(PlantJudge):
    """A PlantJudge whose recall differs by story (condition B): the story's rates are looked up per call."""

    def __init__(self, by_story: dict[str, dict[str, float]], false_alarm: dict[str, float]) -> None:
        super().__init__(recall={}, false_alarm=false_alarm, wrong_id=dict(WRONG_ID))
        self.by_story = by_story

    def answer(self, request: Request) -> str:
        self.recall = self.by_story[str(request.tags["episode"])]
        return super().answer(request)


def source_run(root: Path, stories: int) -> Any:
    dataset = os.environ.get("NCP_BENCH_DATASET")
    args = [sys.executable, str(ROOT / "run.py"), "engine=scripted", f"limit={stories}", "max_turns=6"]
    args += [f"out_dir={root / 'src'}", "progress=false", "engine.conflict_rate=0.05"]
    args += ["dataset=ncp_bench"] if dataset else ["dataset.path=" + str(ROOT / "specs")]
    done = subprocess.run(args, cwd=root, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    run = load_run(str(root / "src"))
    attach_specs(run, None, required=True)
    return run


def story_rates(rng: random.Random, stories: list[str], condition: str) -> tuple[dict, dict]:
    """Each story's recall for auditor 1 and 2 (the same for every story in A)."""
    one, two = {}, {}
    for s in stories:
        if condition == "A":
            one[s], two[s] = dict(RECALL_1), dict(RECALL_2)
            continue
        r1 = {t: rng.betavariate(RECALL_1[t] * CONCENTRATION, (1 - RECALL_1[t]) * CONCENTRATION) for t in RECALL_1}
        one[s] = r1
        two[s] = {t: min(1.0, max(0.0, r1[t] + RECALL_2[t] - RECALL_1[t])) for t in r1}
    return one, two


def judged(source: Any, items: dict, judge: PlantJudge, seed: int, root: Path) -> list:
    engine = ScriptedEngine(policy=RandomPolicy(add_fact_rate=0.2, negate_fact_rate=0.05), plant=judge)
    store = RunDir(root)
    store.open({"kind": "sim"}, identity=f"sim{seed}")
    calls = CallService(
        roles={"auditor": RoleBinding(engine, Sampling(), "scripted")}, pack=PromptPack.load(), store=store, seed=seed
    )
    try:
        out = asyncio.run(judge_all(source, items, calls, concurrency=256))
    finally:
        store.close()
    return [out[e] for e in items]


def truths() -> dict[str, float]:
    t = {f"recall:{k}": v for k, v in RECALL_1.items()} | {f"type_right:{k}": v for k, v in RECALL_1.items()}
    t |= {f"id_right:{k}": v * (1 - WRONG_ID[k]) for k, v in RECALL_1.items()}
    t["false_alarm"] = 1 - math.prod(1 - v for v in FALSE_ALARM.values())
    t |= {f"false_alarm:{k}": v for k, v in FALSE_ALARM.items()}
    return t


def simulate(condition: str, runs: int, stories: int, turns: int, resamples: int, seed: int, tmp: Path) -> str:
    source = source_run(tmp, stories)
    items = {}
    for name, result in source.results.items():
        drawn = draw_items(source.specs[result.spec_id], result, CONFLICT_TYPES, turns, "end", seed)
        if drawn:
            items[name] = drawn
    per_type = {t: sum(i.kind == t for its in items.values() for i in its) for t in ("clean", *CONFLICT_TYPES)}
    truth = truths()
    diff_truth = {f"recall:{t}": RECALL_2[t] - RECALL_1[t] for t in CONFLICT_TYPES}
    hits: dict[str, list[tuple[float, float, float]]] = {k: [] for k in truth}
    diffs: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in diff_truth}
    rng = random.Random(seed)
    started = time.perf_counter()
    for i in range(runs):
        one, two = story_rates(rng, list(items), condition)
        r1 = judged(source, items, StoryJudge(one, FALSE_ALARM), 2 * i + 1, tmp / f"r{i}a")
        r2 = judged(source, items, StoryJudge(two, FALSE_ALARM), 2 * i + 2, tmp / f"r{i}b")
        fig = measure("1", "", "", r1, resamples, i, 0.95)
        for s in fig.shares:
            if s.figure.key in hits:
                hits[s.figure.key].append((s.value, s.lo, s.hi))
        for d in compare_auditors([("1", r1), ("2", r2)], resamples, i, 0.95)[0].rows:
            if d.figure.key in diffs:
                diffs[d.figure.key].append((d.diff, d.lo, d.hi, d.p))
    took = time.perf_counter() - started
    lines = [
        f"### Condition {condition}: {runs} runs, {len(items)} episodes of {stories} stories, items per kind "
        + ", ".join(f"{k} {v}" for k, v in per_type.items())
        + f" ({took:.0f} s)",
        "",
        "| figure | truth | mean | coverage % (MC se) | mean width |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, rows in hits.items():
        a = np.asarray(rows)
        cov = np.mean((a[:, 1] <= truth[k] + 1e-12) & (truth[k] - 1e-12 <= a[:, 2]))
        se = math.sqrt(cov * (1 - cov) / len(a))
        lines.append(
            f"| {k} | {truth[k]:.3f} | {a[:, 0].mean():.3f} | {100 * cov:.1f} ({100 * se:.1f}) | "
            f"{np.mean(a[:, 2] - a[:, 1]):.3f} |"
        )
    lines += [
        "",
        "| paired difference (2 - 1) | truth | mean | coverage % (MC se) | mean width | p < 0.05 % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k, rows in diffs.items():
        a = np.asarray(rows)
        cov = np.mean((a[:, 1] <= diff_truth[k] + 1e-12) & (diff_truth[k] - 1e-12 <= a[:, 2]))
        se = math.sqrt(cov * (1 - cov) / len(a))
        lines.append(
            f"| {k} | {diff_truth[k]:+.2f} | {a[:, 0].mean():+.3f} | {100 * cov:.1f} ({100 * se:.1f}) | "
            f"{np.mean(a[:, 2] - a[:, 1]):.3f} | {100 * np.mean(a[:, 3] < 0.05):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--stories", type=int, default=30)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--conditions", nargs="+", default=["A", "B"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    parts = []
    for c in args.conditions:
        with tempfile.TemporaryDirectory(prefix="plant-sim-") as tmp:
            parts.append(simulate(c, args.runs, args.stories, args.turns, args.resamples, args.seed, Path(tmp)))
            print(parts[-1] + "\n", flush=True)
    if args.out:
        args.out.write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
