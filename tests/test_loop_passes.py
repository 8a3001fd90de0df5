"""The development instrument that names what a long pass of the event loop ran (bench/passes.py)."""

from __future__ import annotations

import asyncio
import asyncio.events
import time

import pytest

from ncp_local.bench import passes


def _work(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def _episode() -> None:
    await asyncio.sleep(0)
    _work(0.03)  # a long step, after its first await
    await asyncio.sleep(0)


def test_a_long_pass_is_named_by_the_task_and_where_it_resumed_and_stopped() -> None:
    async def main() -> None:
        await asyncio.gather(_episode(), asyncio.sleep(0))

    with passes.watching(threshold_ms=20) as w:
        asyncio.run(main())
    assert w is not None and len(w.long) == 1
    (long,) = w.long
    assert long.cpu_s >= 0.03
    name = max(long.by_label, key=long.by_label.__getitem__)
    assert name.startswith("_episode: sleep:") and name.count("sleep:") == 2, name
    assert long.by_label[name] >= 0.03 and long.counts[name] == 1
    assert any("_episode: sleep:" in line for line in w.lines())


def test_unset_it_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(passes.ENV, raising=False)
    run = asyncio.events.Handle._run
    with passes.watching() as w:
        assert w is None and asyncio.events.Handle._run is run
    monkeypatch.setenv(passes.ENV, "50")
    with passes.watching() as w:
        assert w is not None and w.threshold_s == 0.05 and asyncio.events.Handle._run is not run
    assert asyncio.events.Handle._run is run
