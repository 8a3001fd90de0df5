"""`mode=merge out_dir=DIR` (or the run's own overrides): join a sharded run's shards."""

from __future__ import annotations

import sys

from ..config import RunConfig
from ..errors import InputError
from ..execution.merge import MergeError, merge
from ..exits import EXIT_BAD_INPUT
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..rundir import identity, layout
from ..rundir.store import RunDir


def main(cfg: RunConfig) -> int:
    root = layout.run_dir(cfg, "" if cfg.out_dir else identity.of_run(cfg).key)
    if not root.is_dir():
        raise InputError(
            root, "out_dir", "no such directory: give the sharded run's (out_dir=DIR, or the overrides it ran with)"
        )
    try:
        merged = merge(root)
    except MergeError as exc:
        print(f"error: merge: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for line in merged.problems:
        print(f"warning: {line}: not merged", file=sys.stderr)
    store = RunDir(merged.out)
    results = [store.load_result(s) for s in merged.specs]
    max_turns = int((merged.manifest.get("config") or {}).get("max_turns") or cfg.max_turns)
    print(results_table([(root.name, aggregate([episode_metrics(r) for r in results], max_turns))]))
    note = f" ({merged.ignored} result(s) outside this run's specs ignored)" if merged.ignored else ""
    print(f"merged {len(results)} results from {merged.count} shards into {store.results}{note}")
    return 0
