"""The pacer: a pass of the event loop that has used its budget defers the next answered call."""

from __future__ import annotations

import asyncio
import time

from ncp_local.execution.calls import Pacer


def _order(budget_s: float, work_s: float = 0.0) -> list[str]:
    """Three calls answered in the same pass, each pacing then working `work_s`; a marker put in the
    pass's queue by the first shows which of them ran in that pass and which in a later one."""
    events: list[str] = []
    pacer = Pacer(budget_s)

    async def call(name: str) -> None:
        await pacer.pace()
        events.append(name)
        if name == "a":
            asyncio.get_running_loop().call_soon(events.append, "next pass")
        end = time.thread_time() + work_s  # the loop thread's CPU, which the pacer counts
        while time.thread_time() < end:
            pass

    async def main() -> None:
        await asyncio.gather(call("a"), call("b"), call("c"))

    asyncio.run(main())
    return events


def test_a_pass_within_its_budget_runs_every_ready_call() -> None:
    assert _order(budget_s=10.0) == ["a", "b", "c", "next pass"]


def test_a_pass_past_its_budget_defers_the_rest_to_the_next_pass() -> None:
    # b and c wait for the next pass; there b takes its budget and c waits for one more.
    assert _order(budget_s=0.005, work_s=0.01) == ["a", "next pass", "b", "c"]
