"""The pacer: a pass of the event loop that has used its budget queues the next answered calls."""

from __future__ import annotations

import asyncio
import time

from ncp_local.execution.calls import Pacer


def _work(seconds: float) -> None:
    end = time.thread_time() + seconds  # the loop thread's CPU, which the pacer counts
    while time.thread_time() < end:
        pass


def _order(budget_s: float, work_s: float = 0.0, n: int = 3, cancel: str = "") -> list[str]:
    """`n` calls answered in the same pass, each pacing then working `work_s`; a marker put in the pass's
    queue by the first (and the fourth) shows which of them ran in that pass and which in a later one. `cancel`: a call
    stopped while it waits."""
    events: list[str] = []
    pacer = Pacer(budget_s)

    async def call(name: str) -> None:
        await pacer.pace()
        events.append(name)
        if name in ("a", "d"):
            asyncio.get_running_loop().call_soon(events.append, f"{name}'s next pass")
        _work(work_s)

    async def main() -> None:
        tasks = {name: asyncio.ensure_future(call(name)) for name in "abcdefgh"[:n]}
        if cancel:
            await asyncio.sleep(0)  # all of them have paced
            tasks[cancel].cancel()
        await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), timeout=5)

    asyncio.run(main())
    return events


def test_a_pass_within_its_budget_runs_every_ready_call() -> None:
    assert _order(budget_s=10.0) == ["a", "b", "c", "a's next pass"]


def test_a_pass_past_its_budget_queues_the_rest_for_the_next_pass() -> None:
    # b and c wait for the next pass; there b takes its budget and c waits for one more.
    assert _order(budget_s=0.005, work_s=0.01) == ["a", "a's next pass", "b", "c"]


def test_a_later_pass_lets_go_as_many_as_a_pass_ran() -> None:
    # 4 ms each in a 10 ms budget: a, b, c in the first pass (c starts at 8 ms), then d, e, f together,
    # and g in the pass after theirs.
    events = _order(budget_s=0.01, work_s=0.004, n=7)
    assert events == ["a", "b", "c", "a's next pass", "d", "e", "f", "d's next pass", "g"]


def test_a_call_stopped_while_queued_holds_up_none_of_the_others() -> None:
    assert _order(budget_s=0.005, work_s=0.01, n=4, cancel="b") == ["a", "a's next pass", "c", "d", "d's next pass"]
