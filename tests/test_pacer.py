"""The pacer: a pass of the event loop that has used its budget queues the next answered calls."""

from __future__ import annotations

import asyncio
import asyncio.base_events
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers import Scripted, make_spec
from ncp_local.engines.scripted import RandomPolicy
from ncp_local.execution import calls
from ncp_local.execution.calls import Pacer
from ncp_local.protocol.prompts import PromptPack
from ncp_local.rundir.store import RunDir


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
    # and g in the pass after theirs (let go while they ran, so ahead of what d put in that pass).
    events = _order(budget_s=0.01, work_s=0.004, n=7)
    assert events == ["a", "b", "c", "a's next pass", "d", "e", "f", "g", "d's next pass"]


def test_a_call_stopped_while_queued_holds_up_none_of_the_others() -> None:
    assert _order(budget_s=0.005, work_s=0.01, n=4, cancel="b") == ["a", "a's next pass", "c", "d", "d's next pass"]


def test_what_runs_unpaced_in_a_pass_counts_against_it() -> None:
    # An episode back from its audits or its speculative player does its work before it next paces: the
    # pass's clock runs from the pass's start, so calls that pace after such work wait for the next pass.
    events: list[str] = []
    pacer = Pacer(0.005)

    def unpaced() -> None:
        _work(0.01)
        asyncio.get_running_loop().call_soon(events.append, "the next pass")

    async def call(name: str) -> None:
        await pacer.pace()
        events.append(name)

    async def main() -> None:
        await pacer.pace()  # a first step: the pacer watches the passes from here
        asyncio.get_running_loop().call_soon(unpaced)  # the next pass, ahead of a's and b's first steps
        await asyncio.wait_for(asyncio.gather(call("a"), call("b")), timeout=5)

    asyncio.run(main())
    assert events == ["the next pass", "a", "b"]


def test_a_call_let_go_into_a_full_pass_waits_again_first_in_line() -> None:
    # a's 12 ms fill its pass; b, c (free) are let go one a pass at a's cost, then d-g at once at c's; d
    # takes 12 ms, so e, f, g find the pass full and wait again, e first.
    events: list[str] = []
    pacer = Pacer(0.01)

    async def call(name: str) -> None:
        await pacer.pace()
        events.append(name)
        if name in "ad":
            asyncio.get_running_loop().call_soon(events.append, f"{name}'s next pass")
            _work(0.012)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(call(n) for n in "abcdefg")), timeout=5)

    asyncio.run(main())
    assert events.index("d's next pass") < events.index("e")
    assert [e for e in events if len(e) == 1] == list("abcdefg")


def test_many_episodes_answered_at_once_fill_no_pass_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """80 episodes on an engine that answers at once (every answer ready in the same pass). The loop's
    work is counted, not timed: a prompt rendered, an answer made by the engine, an answer parsed and a
    turn committed are 1 ms each on the pacer's clock. No pass may do many more than the budget's 10,
    whatever runs there unpaced (an episode back from its speculative player, a new episode, a let-go
    call, the engine's answers) included; unpaced, a pass did every episode's."""
    work = [0]
    per_pass: list[int] = []
    clock = SimpleNamespace(thread_time=lambda: work[0] / 1000, perf_counter=time.perf_counter, time=time.time)
    monkeypatch.setattr(calls, "time", clock)
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def one_pass(self: asyncio.AbstractEventLoop) -> None:
        before = work[0]
        run_once(self)
        per_pass.append(work[0] - before)

    def counted(f: Callable[..., Any]) -> Callable[..., Any]:
        def unit(*args: Any, **kwargs: Any) -> Any:
            work[0] += 1
            return f(*args, **kwargs)

        return unit

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "_run_once", one_pass)
    monkeypatch.setattr(calls, "parse", counted(calls.parse))
    monkeypatch.setattr(PromptPack, "render", counted(PromptPack.render))
    monkeypatch.setattr(RandomPolicy, "answer", counted(RandomPolicy.answer))
    monkeypatch.setattr(RunDir, "write_checkpoint", counted(RunDir.write_checkpoint))
    specs = [make_spec(f"s{i}") for i in range(80)]
    Scripted(tmp_path, specs, max_turns=3, concurrency=80, speculative_player=True, pacer=Pacer(0.01)).run()
    assert sum(per_pass) > 80 * 3 * 3 * 5  # every episode played its turns
    assert max(per_pass) <= 14, sorted(per_pass)[-5:]  # main's pacer: 88 (every episode's first prompt)
