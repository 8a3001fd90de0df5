"""SIGTERM and SIGINT while a run plays: they cancel its task, and are handed back when it ends."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager


@contextmanager
def signals_cancel(stopped: list[str]) -> Iterator[None]:
    """Inside the block, SIGTERM (Slurm preemption) and SIGINT cancel the running task, their names added to
    `stopped`. On leaving, each gets back the handler it had: a handler left behind would cancel whatever
    the task does next (the bench's later ways)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in before:

        def on_signal(name: str = sig.name) -> None:
            stopped.append(name)
            if task:
                task.cancel()

        loop.add_signal_handler(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


async def to_the_end(work: Awaitable[None]) -> None:
    """Await `work` to its end, though a signal cancels the caller meanwhile (SIGINT as a run stops its
    engines): the stop it asks for is already under way. The cancellation is taken back, so that it does
    not surface later as a CancelledError out of the run (a traceback and exit 1)."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            await asyncio.shield(task)
            return
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            me = asyncio.current_task()
            if me is not None:
                me.uncancel()
