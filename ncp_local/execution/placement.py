"""Which points of a sweep play together, and where their engines go: points whose engines do not fit
the hardware together (the memory plan, `ncp_local.plan`) play in successive groups, each engine placed
(memory share, devices) as the plan gives it for its group."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..bindings import Binding, Bindings, Sampling
from ..config import RunConfig
from ..plan import Plan, check
from ..protocol.stages import Bounds
from .engine_pool import EnginePool, PoolEngine


class Placed(Protocol):
    """What grouping reads of a point (execution/life.Point)."""

    keys: dict[str, str]
    out: Path | None
    cfg: RunConfig | None


P = TypeVar("P", bound=Placed)


def _plan_of(engines: list[PoolEngine], cfg: RunConfig) -> Plan:
    """`ncp_local.plan.check` on the group's distinct engines, one pseudo-role each (`cfg`: the group's
    first point's, for its `plan` and `engine` sections)."""
    names = tuple(_plan_role(e) for e in engines)
    bound = Bindings(
        cfg.engine,
        {
            n: Binding(
                role=n,
                engine=e.kind,
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


def _plan_role(e: PoolEngine) -> str:
    """The engine's pseudo-role in `_plan_of`'s plan."""
    return f"engine_{e.id}"


def _cfg(p: Placed) -> RunConfig:
    assert p.cfg is not None
    return p.cfg


def fits(engines: list[PoolEngine], cfg: RunConfig) -> bool:
    return not _plan_of(engines, cfg).fatal


def groups(points: Sequence[P], pool: EnginePool) -> list[list[P]]:
    """Points in order, cut into groups whose engines fit together; a run directory at most once per group."""
    out: list[list[P]] = []
    current: list[P] = []
    for p in points:
        keys = {k for q in current for k in q.keys.values()} | set(p.keys.values())
        clash = p.out in {q.out for q in current}
        if current and (clash or not fits([pool.engines[k] for k in sorted(keys)], _cfg(p))):
            out.append(current)
            current = []
        current.append(p)
    if current:
        out.append(current)
    return out


def place(group: Sequence[Placed], pool: EnginePool) -> None:
    """Shares and devices for the group's engines as the plan gives them together (engines already
    running keep theirs: the plan takes them as set)."""
    keys = sorted({k for p in group for k in p.keys.values()})
    engines = [pool.engines[k] for k in keys]
    plan = _plan_of(engines, _cfg(group[0]))
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
