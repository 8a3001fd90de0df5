"""The collector during play (execution/playing.py): after each collection past the young generation the
heap is frozen, so a full collection walks next to nothing; a point's end gives it all back."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from ncp_local.execution.playing import FreezeSurvivors


@pytest.mark.parametrize("generation", [1, 2])
def test_what_survives_an_older_collection_is_frozen_on_the_loops_next_pass(generation: int) -> None:
    async def go() -> tuple[bool, bool, int]:
        hook = FreezeSurvivors(asyncio.get_running_loop())
        gc.callbacks.append(hook)
        try:
            before = gc.get_freeze_count()
            survivor: list[list[int]] = [[1]]
            gc.collect(generation)  # the survivor moves on to an older generation
            walked = any(o is survivor for o in gc.get_objects(generation=min(generation + 1, 2)))
            await asyncio.sleep(0)  # the freeze runs early in the next pass, outside the collection
            await asyncio.sleep(0)
            frozen = not any(o is survivor for g in range(3) for o in gc.get_objects(generation=g))
            return walked, frozen, gc.get_freeze_count() - before
        finally:
            gc.callbacks.remove(hook)
            gc.unfreeze()

    walked, frozen, more = asyncio.run(go())
    assert walked and frozen and more >= 2  # the list and its inner list


def test_a_young_collection_freezes_nothing() -> None:
    async def go() -> int:
        hook = FreezeSurvivors(asyncio.get_running_loop())
        gc.callbacks.append(hook)
        try:
            before = gc.get_freeze_count()
            gc.collect(0)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return gc.get_freeze_count() - before
        finally:
            gc.callbacks.remove(hook)

    assert asyncio.run(go()) == 0


def test_a_freeze_still_scheduled_when_play_ends_does_nothing() -> None:
    async def go() -> int:
        hook = FreezeSurvivors(asyncio.get_running_loop())
        gc.callbacks.append(hook)
        try:
            gc.collect()  # the freeze is scheduled ...
            hook.stop()  # ... and play ends before the loop's next pass
            before = gc.get_freeze_count()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return gc.get_freeze_count() - before
        finally:
            gc.callbacks.remove(hook)
            gc.unfreeze()

    assert asyncio.run(go()) == 0


def test_a_run_leaves_the_collector_as_it_found_it(tmp_path: Path) -> None:
    hooks, thresholds = list(gc.callbacks), gc.get_threshold()
    run = run_cli("engine=scripted", "limit=2", "max_turns=3", "progress=false", f"out_dir={tmp_path / 'r'}")
    assert run.returncode == 0, run.stderr
    assert gc.callbacks == hooks and gc.get_threshold() == thresholds and gc.get_freeze_count() == 0


def test_the_heap_stays_frozen_until_the_writer_has_made_the_points_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unfrozen as play returned, a full collection in the writer's thread walked every ending it still
    held (420 ms of the loop at 800 episodes): play waits for the writer first. The writer is slowed so
    that it is still making results when the episodes are done."""
    from ncp_local import config as config_mod
    from ncp_local import modes
    from ncp_local.protocol.episode import Ending

    frozen: list[int] = []
    made = Ending.result_json

    def slow(self: Ending, handed: Any) -> bytes:
        time.sleep(0.3)
        frozen.append(gc.get_freeze_count())
        return made(self, handed)

    monkeypatch.setattr(Ending, "result_json", slow)
    overrides = ["engine=scripted", "engine.conflict_rate=0", "limit=2", "max_turns=2", "progress=false"]
    assert modes.main(config_mod.compose([*overrides, f"out_dir={tmp_path / 'r'}"])) == 0
    assert len(frozen) == 2 and all(n > 0 for n in frozen), frozen
    assert gc.get_freeze_count() == 0
