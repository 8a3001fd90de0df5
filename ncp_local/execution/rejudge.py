"""An auditor judging a finished run's recorded turns again: the one harness mode=reaudit and mode=plant share.

Only the auditor's engine starts (the other roles point at its model, so the pool starts one engine), and a
role the mode keeps (mode=plant's planting model: the narrator's).
Every episode not yet saved goes to the engine at once through the call service (retries, per-call
seeds, the call log); each episode's result is sealed as it comes, so the same command resumes; a dead
engine is the one exit line, saying where the saved episodes are. What judging an episode means is the
mode's (`work`); everything around it is here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import TypeVar

from ..engines.base import EngineDead
from ..protocol import ROLES
from ..protocol.plant import PlantResult
from ..protocol.reaudit import ReauditResult
from ..rundir.layout import ENGINE_LOG
from ..rundir.store import RunDir, resume_hint
from . import engine_log
from .calls import CallService, with_engines
from .engine_pool import EnginePool
from .failures import Exit, exit_for
from .progress import Metered, Progress
from .ready import Ready

# A judged episode's sealed record.
R = TypeVar("R", ReauditResult, PlantResult)
# (calls, the episodes to judge, save one result) -> every judged episode's result
Work = Callable[[CallService, Iterable[str], Callable[[R], None]], Awaitable[dict[str, R]]]


def auditor_pool(ready: Ready, keep: tuple[str, ...] = ()) -> EnginePool:
    """The pool of a process that runs the auditor, and the roles of `keep` as configured (mode=plant's
    planting model is the narrator's); every other role is bound as the auditor, so it starts nothing more."""
    bound = ready.bindings.all_as("auditor")
    bound = replace(bound, roles={r: ready.bindings[r] if r in keep else b for r, b in bound.roles.items()})
    at = {r: "auditor" if r not in keep else r for r in ROLES}
    return EnginePool(bound, endpoints={r: ready.endpoints[at[r]] for r in ROLES if at[r] in ready.endpoints})


async def each_episode(
    names: Iterable[str], judge: Callable[[str], Awaitable[R]], on_result: Callable[[R], None] | None = None
) -> dict[str, R]:
    """Every named episode judged at once; `on_result` as each finishes. A dead engine raises as itself."""
    out: dict[str, R] = {}

    async def one(name: str) -> None:
        res = await judge(name)
        out[name] = res
        if on_result:
            on_result(res)

    try:
        async with asyncio.TaskGroup() as tg:
            for name in names:
                tg.create_task(one(name))
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return out


def judge_run(
    ready: Ready,
    engines: EnginePool,
    store: RunDir,
    what: str,
    sizes: Mapping[str, int],
    work: Work[R],
    roles: tuple[str, ...] = ("auditor",),
) -> dict[str, R] | Exit:
    """Every episode of `sizes` (episode -> its turns or items, for the progress line) judged by `work`
    unless already saved in `store`, which is marked done and closed. The results, or the exit of a dead
    engine."""
    out = store.root
    engine_log.place(out / ENGINE_LOG)
    try:
        done: dict[str, R] = {r.episode: r for r in store.iter_results()}
        todo = {e: n for e, n in sizes.items() if e not in done}
        if todo:
            done.update(asyncio.run(_judge(ready, engines, store, what, todo, work, roles)))
        else:
            print(f"all {len(done)} episodes already judged in {out}; nothing left to do")
        store.mark_done(len(done))
    except EngineDead as exc:
        known = exit_for(exc, resume_hint("the judged episodes are saved", out))
        assert known is not None
        return known
    finally:
        store.close()
    return done


async def _judge(
    ready: Ready,
    engines: EnginePool,
    store: RunDir,
    what: str,
    todo: dict[str, int],
    work: Work[R],
    roles: tuple[str, ...],
) -> dict[str, R]:
    started = await engines.start()
    bar = Progress(enabled=ready.cfg.progress, every_s=ready.cfg.progress_every_s)
    for name, n in todo.items():
        bar.add_run(what, [name], n)
    try:
        assert engines.bindings is not None
        bound = with_engines(engines.bindings, started, roles, wrap=lambda e: Metered(e, bar))
        calls = CallService(roles=bound, pack=ready.pack, store=store, seed=ready.cfg.seed)

        def save(res: R) -> None:
            store.write_result(res)
            bar.result(what, res.episode, todo[res.episode])

        bar.start()
        try:
            return await work(calls, list(todo), save)
        finally:
            bar.close()
    finally:
        await engines.close_all()
