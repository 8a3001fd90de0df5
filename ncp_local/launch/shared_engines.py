"""The engines a batched sweep shares between its points, and the groups of points whose engines fit.

Beside `execution.engine_pool.EnginePool` (one run's engines), a sweep keeps its own pool: engines
keyed as the EnginePool keys them (engine and model settings), each started once, on first use, for
every point that needs it, and closed when no group of points needs it any more. Points whose
engines do not fit the hardware together (the memory plan, `ncp_local.plan`) run in successive
groups, each engine placed (memory share, devices) as the plan gives it for its group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..bindings import Binding, Bindings, Sampling
from ..config import SCRIPTED, RunConfig
from ..engines.base import Engine
from ..engines.registry import kind
from ..engines.settings import ModelSettings
from ..execution.engine_pool import EnginePool
from ..plan import Plan, check
from ..protocol import ROLES
from ..protocol.stages import Bounds
from ..rundir.sweep_index import EngineRow
from .sweep_point import Point, point_cfg


@dataclass
class SharedEngine:
    key: str
    id: str
    model: ModelSettings  # as the first point that uses it configures it
    factory: EnginePool  # the pool of a point using it (engine kind and settings)
    role_key: str  # the pool's key of the model
    max_tokens: int = 0  # the largest output any role reserves on it (the plan's window check)
    placement: dict[str, Any] = field(default_factory=dict)  # share / devices from the group's plan
    engine: Engine | None = None
    starts: int = 0
    start_s: float = 0.0
    points: set[int] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    dead: bool = False

    @property
    def label(self) -> str:
        """What the engine plays, as a run's roles are labelled (bindings.Binding.label): its model's
        name, or `scripted` when it loads no model."""
        return self.model.name if kind(self.factory.kinds[self.role_key]).runs_model else SCRIPTED

    def started_model(self) -> Any:
        model = self.factory.model_for(self.role_key)
        return model.model_copy(update=self.placement) if self.placement else model

    def describe(self) -> EngineRow:
        return EngineRow(
            id=self.id,
            model=self.label,
            engine=self.factory.kinds[self.role_key],
            roles=tuple(sorted(self.roles)),
            points=tuple(sorted(self.points)),
            starts=self.starts,
            start_s=round(self.start_s, 1),
            placement=self.placement or None,
        )


class SharedEngines:
    """The sweep's engines by key: each started once, on first use, and closed when no group needs it."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.engines: dict[str, SharedEngine] = {}
        self.log = log
        self._locks: dict[str, asyncio.Lock] = {}

    def register(self, p: Point) -> None:
        # Only a runnable point is registered, and `prepare` gave each its EnginePool.
        assert p.engines is not None, f"sweep point {p.name} registered without its engines"
        for role in ROLES:
            key = p.keys[role]
            e = self.engines.get(key)
            if e is None:
                e = self.engines[key] = SharedEngine(
                    key, f"e{len(self.engines) + 1}", getattr(p.cfg, role).model, p.engines, p.engines.role_key[role]
                )
            e.points.add(p.num)
            e.roles.add(role)
            e.max_tokens = max(e.max_tokens, int(getattr(p.cfg, role).max_tokens))
            p.engine_ids[role] = e.id

    async def get(self, key: str) -> Engine:
        e = self.engines[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if e.engine is None:
                started = time.perf_counter()
                e.engine = await e.factory.start_model(e.started_model(), e.role_key)
                e.start_s += time.perf_counter() - started
                e.starts += 1
                self.log(
                    f"sweep: engine {e.id} ({e.label}, {e.factory.kinds[e.role_key]}) started in "
                    f"{time.perf_counter() - started:.1f} s for point(s) {', '.join(f'#{n}' for n in sorted(e.points))}"
                )
        assert e.engine is not None
        return e.engine

    async def close(self, key: str) -> None:
        e = self.engines[key]
        if e.engine is not None:
            engine, e.engine = e.engine, None
            await engine.close()

    async def keep_only(self, keys: set[str]) -> None:
        """Close the engines this group does not use (and any that died), freeing their memory first."""
        for key, e in self.engines.items():
            if e.engine is not None and (key not in keys or e.dead):
                await self.close(key)
            if key in keys:
                e.dead = False

    async def close_all(self) -> None:
        for key in self.engines:
            await self.close(key)


# ---- groups: the memory plan --------------------------------------------------------


def _plan_of(engines: list[SharedEngine], cfg: RunConfig) -> Plan:
    """`ncp_local.plan.check` on the group's distinct engines, one pseudo-role each (`cfg`: the group's
    first point's, for its `plan` and `engine` sections)."""
    names = tuple(_plan_role(e) for e in engines)
    bound = Bindings(
        cfg.engine,
        {
            n: Binding(
                role=n,
                engine=e.factory.kinds[e.role_key],
                model=(e.started_model() if e.engine is not None else e.model),
                sampling=Sampling(max_tokens=e.max_tokens),
                bounds=Bounds(),
                endpoint={},
                own_endpoint=frozenset(),
            )
            for n, e in zip(names, engines, strict=True)
        },
    )
    return check(cfg, names, bindings=bound)


def _plan_role(e: SharedEngine) -> str:
    """The engine's pseudo-role in `_plan_of`'s plan."""
    return f"engine_{e.id}"


def fits(engines: list[SharedEngine], cfg: RunConfig) -> bool:
    return not _plan_of(engines, cfg).fatal


def groups(points: list[Point], pool: SharedEngines) -> list[list[Point]]:
    """Points in order, cut into groups whose engines fit together; a run directory at most once per group."""
    out: list[list[Point]] = []
    current: list[Point] = []
    for p in points:
        keys = {k for q in current for k in q.keys.values()} | set(p.keys.values())
        clash = p.out in {q.out for q in current}
        if current and (clash or not fits([pool.engines[k] for k in sorted(keys)], point_cfg(p))):
            out.append(current)
            current = []
        current.append(p)
    if current:
        out.append(current)
    return out


def place(group: list[Point], pool: SharedEngines) -> None:
    """Shares and devices for the group's engines as the plan gives them together (engines already
    running keep theirs: the plan takes them as set)."""
    keys = sorted({k for p in group for k in p.keys.values()})
    engines = [pool.engines[k] for k in keys]
    plan = _plan_of(engines, point_cfg(group[0]))
    # The plan has engines for the in-process (vLLM) ones only (none for scripted or openai), one per
    # distinct model: each is found by its pseudo-roles, not by position.
    planned = {role: ep for ep in plan.engines for role in ep.roles}
    for e in engines:
        ep = planned.get(_plan_role(e))
        if e.engine is not None or ep is None:
            continue
        change: dict[str, Any] = {}
        if ep.share_planned and ep.share is not None:
            change["gpu_memory_utilization"] = ep.share
        if ep.devices_planned and ep.devices:
            change["devices"] = list(ep.devices)
        e.placement = change
