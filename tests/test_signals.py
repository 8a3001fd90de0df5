"""A signal that arrives while a run stops its engines: the stop runs to its end, and no CancelledError
leaves the run (it was a traceback and exit 1, found by sending SIGINT at random moments)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from ncp_local.execution.signals import signals_cancel, to_the_end


def test_a_signal_while_the_engines_stop_lets_the_stop_finish() -> None:
    stopped: list[str] = []
    closed: list[str] = []

    async def close_all() -> None:
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the close is still under way
        await asyncio.sleep(0.05)
        closed.append("engines")

    async def run() -> str:
        with signals_cancel(stopped):
            try:
                await asyncio.sleep(0)  # the run's groups: done
            finally:
                await to_the_end(close_all())
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cancel was taken back
        await asyncio.sleep(0)  # and does not come back at the next await
        return "finished"

    assert asyncio.run(run()) == "finished"
    assert closed == ["engines"] and stopped == ["SIGINT"]


def test_without_it_the_cancel_leaves_the_run() -> None:
    """What `to_the_end` is for: a shielded await alone raises the cancel out of the run."""
    stopped: list[str] = []

    async def close_all() -> None:
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.05)

    async def run() -> None:
        with signals_cancel(stopped):
            await asyncio.shield(close_all())

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())


def test_a_cancelled_stop_is_not_waited_for_forever() -> None:
    async def close_all() -> None:
        raise asyncio.CancelledError

    async def run() -> None:
        await to_the_end(close_all())

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
