"""`bench.speculative=true`: turn latency with the next turn's player asked after the audits and during them.

The same episodes, seeds and engine, played through (a fixed workload) twice from a cold prefix cache:
once asking each turn's player after the previous turn's audits (the order
PROTOCOL section 3 describes), once asking it as soon as the narration exists
(`speculative_player`, Episode's Speculation). A turn's latency is the time
between two commits of one episode. The results of both must be identical,
byte for byte: the bench says whether they were.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..execution.calls import CallService, RoleBinding
from ..execution.scheduler import EpisodeScheduler, EpisodeSettings
from ..protocol.player import Player
from ..protocol.prompts import PromptPack
from ..protocol.spec import Spec
from ..rundir.call_log import read_calls
from ..rundir.store import RunDir


async def _way(
    roles: dict[str, RoleBinding],
    specs: tuple[Spec, ...],
    pack: PromptPack,
    narrator_cls: type,
    player: Player,
    seed: int,
    turns: int,
    root: Path,
    speculative: bool,
) -> tuple[list[float], dict, int]:
    store = RunDir(root)
    store.open({"bench": root.name}, root.name)
    last: dict[str, float] = {}
    latencies: list[float] = []

    def on_turn(spec_id: str, n: int) -> None:
        now = time.perf_counter()
        if n > 0 and spec_id in last:  # n = 0: the opening committed; turns count from there
            latencies.append(now - last[spec_id])
        last[spec_id] = now

    scheduler = EpisodeScheduler(
        specs=specs,
        calls=CallService(roles=roles, pack=pack, store=store, seed=seed),
        store=store,
        settings=EpisodeSettings(
            max_turns=turns, concurrency=len(specs), play_through=True, speculative_player=speculative
        ),
        make_narrator=lambda: narrator_cls(pack=pack, roles=roles),
        player=player,
        on_turn=on_turn,
    )
    try:
        results = await scheduler.run()
    finally:
        store.close()
    dropped = sum(1 for c in read_calls(store.calls_path) if c.speculative)
    return latencies, {k: v.model_dump_json() for k, v in results.items()}, dropped


async def speculative_bench(
    backend: Any,
    roles: dict[str, RoleBinding],
    specs: tuple[Spec, ...],
    pack: PromptPack,
    narrator_cls: type,
    player: Player,
    seed: int,
    turns: int,
    note: Callable[[str], None],
) -> list[str]:
    """Both orders on the same seeds; mean and median turn latency, and whether the results are identical."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="ncp-bench-spec-") as tmp:
        for speculative in (False, True):
            reset = getattr(backend, "reset_prefix_cache", None)
            if reset is not None:
                await reset()
            out[speculative] = await _way(
                roles,
                specs,
                pack,
                narrator_cls,
                player,
                seed,
                turns,
                Path(tmp) / f"speculative-{speculative}",
                speculative,
            )
            note(f"bench: speculative_player={str(speculative).lower()} done")
    (seq, a, _), (spec, b, dropped) = out[False], out[True]
    differ = sorted(k for k in a if a[k] != b.get(k))
    mean_seq, mean_spec = statistics.mean(seq), statistics.mean(spec)
    return [
        f"speculative player: {len(specs)} episodes x {turns} turns, turn latency (s) after the audits: mean "
        f"{mean_seq:.1f}, median {statistics.median(seq):.1f}; during them: mean {mean_spec:.1f}, median "
        f"{statistics.median(spec):.1f}; {dropped} speculative call(s) dropped; results "
        + ("identical" if not differ else f"differ in {len(differ)} of {len(a)} episodes: {differ[:4]}"),
        f"speculative: turn_s after={mean_seq:.2f} during={mean_spec:.2f} during/after={mean_spec / mean_seq:.2f} "
        f"identical={str(not differ).lower()}",
    ]
