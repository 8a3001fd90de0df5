"""What the store costs per committed turn, by turn: CPU and wall of each call the scheduler makes to
write a committed turn, timed in place during a real `mode=run` (scripted engine, nothing ends an
episode early, texts as long as a real narrator's unless --short).

    python scripts/commit_cost.py [--stories 16] [--turns 100] [--fsync-delay 0.02] [--method write_checkpoint]

`--method`: the RunDir method that writes a committed turn (today's `write_checkpoint`; name the new
writer's after a change of the store). Prints the median over the episodes at turns 1, 25, 50, 100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ncp_local.bench.rig_alone import REALISTIC  # noqa: E402
from ncp_local.config import validate  # noqa: E402
from ncp_local.execution import points  # noqa: E402
from ncp_local.execution.life import run_one  # noqa: E402
from ncp_local.rundir import atomic  # noqa: E402
from ncp_local.rundir.store import RunDir  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stories", type=int, default=16)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--fsync-delay", type=float, default=0.0)
    ap.add_argument("--method", default="write_checkpoint")
    ap.add_argument("--short", action="store_true", help="the scripted engine's short texts")
    ap.add_argument("--dataset", default="ncp_bench")
    args = ap.parse_args()
    timed: dict[int, list[tuple[float, float]]] = {}
    original = getattr(RunDir, args.method)

    def wrapped(self: RunDir, cp, *a, **k):  # type: ignore[no-untyped-def]
        c0, w0 = time.process_time(), time.perf_counter()
        out = original(self, cp, *a, **k)
        timed.setdefault(len(cp.turns), []).append((time.process_time() - c0, time.perf_counter() - w0))
        return out

    setattr(RunDir, args.method, wrapped)
    texts = [] if args.short else [f"engine.{k}={v}" for k, v in REALISTIC.items()]
    with tempfile.TemporaryDirectory(prefix="ncp-commit-cost-") as tmp:
        overrides = [
            f"dataset={args.dataset}",
            "engine=scripted",
            "engine.conflict_rate=0",
            "engine.node_rate=0",
            "engine.satisfy_rate=0",
            *texts,
            f"max_turns={args.turns}",
            f"limit={args.stories}",
            f"concurrency={args.stories}",
            "progress=false",
            f"out_dir={tmp}/run",
        ]
        with atomic.fsync_delay(args.fsync_delay):
            code = run_one(validate(points.load(overrides)))
        size = sum(f.stat().st_size for f in Path(tmp, "run", "results").glob("*.json")) / args.stories / args.turns
    print(
        f"{args.method}, {args.stories} episodes, fsync delay {1000 * args.fsync_delay:.0f} ms, "
        f"{size:.0f} bytes per turn of result (exit {code})"
    )
    print("| turn | CPU ms (median) | wall ms (median) | wall ms (max) |\n|---:|---:|---:|---:|")
    for t in (1, 25, 50, 100):
        if t in timed:
            cpu = statistics.median(c for c, _ in timed[t])
            wall = statistics.median(w for _, w in timed[t])
            print(f"| {t} | {1000 * cpu:.2f} | {1000 * wall:.2f} | {1000 * max(w for _, w in timed[t]):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
