"""The engines of one process: one per distinct (engine settings, model settings), started once.

Every user of engines registers what its roles run on (`register`: a run's `Bindings`, or each point's
of a sweep) and is given each role's engine key; roles and points on the same model (same path and
engine settings) get the same key, so a 135M model playing narrator, player and auditor loads once
and a sweep's shared narrator loads once for all its points. Roles on the same endpoint (same server,
served model and client settings) share one client; scripted roles one scripted engine. An engine
starts on first use (`get`) and is closed when no one needs it any more (`keep_only`, `close_all`).
The pool knows nothing of points or runs: a registration may name the point it serves (`served`), for
the sweep index. What may start is checked before, in `preflight` (endpoints there too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bindings import Bindings
from ..config import SCRIPTED, EngineCfg
from ..engines import registry
from ..engines.base import Engine, EngineDead
from ..engines.openai import OpenAIEndpointConfig
from ..engines.settings import EMBEDDED, ModelSettings
from ..protocol import ROLES
from ..rundir.identity import digest
from ..rundir.sweep_index import EngineRow
from . import engine_log
from .endpoints import Endpoint

# Said once per run that the embedded model plays: it is there to exercise the pipeline.
EMBEDDED_NOTE = (
    "note: the embedded SmolLM2-135M plays {roles}: it only exercises the pipeline, and its verdicts "
    "measure nothing (real models: see docs/guide/models-and-gpus.md)"
)


def embedded_note(bindings: Bindings, roles: tuple[str, ...] = ROLES) -> str | None:
    """The one-line note when the embedded model plays a role on a real engine, else None."""
    # Only roles that run the embedded model on vLLM (not scripted, not behind an endpoint).
    playing = [r for r in bindings.in_process(roles) if bindings[r].model.path == EMBEDDED]
    return EMBEDDED_NOTE.format(roles=", ".join(playing)) if playing else None


@dataclass
class PoolEngine:
    """One engine of the pool: what starts it, and what it has served so far."""

    key: str
    id: str  # e1, e2, ... in order of registration (the sweep index names engines so)
    kind: str  # engines/registry.py's row
    model: ModelSettings  # as the first registration configures it (the plan reads it)
    switched: ModelSettings  # as it starts: the run-wide `engine.deterministic` applied, before any placement
    settings: EngineCfg  # the top-level `engine` section (part of the key)
    endpoint: OpenAIEndpointConfig | None = None  # a served engine's endpoint
    max_tokens: int = 0  # the largest output any role reserves on it (the plan's window check)
    placement: dict[str, Any] = field(default_factory=dict)  # share / devices a group's plan gave it
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
        return self.model.name if registry.kind(self.kind).runs_model else SCRIPTED

    def started_model(self) -> ModelSettings:
        return self.switched.model_copy(update=self.placement) if self.placement else self.switched

    def describe(self) -> EngineRow:
        return EngineRow(
            id=self.id,
            model=self.label,
            engine=self.kind,
            roles=tuple(sorted(self.roles)),
            points=tuple(sorted(self.points)),
            starts=self.starts,
            start_s=round(self.start_s, 1),
            placement=self.placement or None,
        )


class EnginePool:
    """The process's engines by key: each started once, on first use, and closed when no one needs it."""

    def __init__(
        self,
        bindings: Bindings | None = None,
        roles: tuple[str, ...] = ROLES,
        endpoints: Mapping[str, Endpoint] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.engines: dict[str, PoolEngine] = {}
        self.log = log
        self._locks: dict[str, asyncio.Lock] = {}
        # The first registration (a run's, a build's, a re-audit's own roles): `start`, `describe`.
        self.bindings = bindings
        self.endpoints = dict(endpoints or {})
        self.role_key: dict[str, str] = {}
        if bindings is not None:
            self.role_key = self.register(bindings, roles, endpoints)

    def register(
        self,
        bindings: Bindings,
        roles: tuple[str, ...] = ROLES,
        endpoints: Mapping[str, Endpoint] | None = None,
        served: int | None = None,
    ) -> dict[str, str]:
        """Each role's engine key for these bindings (an engine per distinct key, registered once);
        `endpoints`: the roles' endpoints as health-checked; `served`: the point served, for the index."""
        found = dict(endpoints or {})

        def endpoint(role: str) -> OpenAIEndpointConfig:
            # As health-checked (its URL read from the endpoint file), else as configured.
            return found[role].config if role in found else bindings[role].endpoint_config()

        keys: dict[str, str] = {}
        for group in bindings.groups(roles, endpoint):
            # One engine per distinct (engine settings, model settings): the same key across runs and points.
            key = digest({"engine": bindings.engine.model_dump(mode="json"), "model": group.key})
            e = self.engines.get(key)
            if e is None:
                served_endpoint = endpoint(group.roles[0]) if registry.kind(group.kind).served else None
                e = self.engines[key] = PoolEngine(
                    key,
                    f"e{len(self.engines) + 1}",
                    group.kind,
                    group.model,
                    bindings.started_model(group.model),
                    bindings.engine,
                    served_endpoint,
                )
            for role in group.roles:
                keys[role] = key
                e.roles.add(role)
                e.max_tokens = max(e.max_tokens, int(bindings[role].sampling.max_tokens))
            if served is not None:
                e.points.add(served)
        return keys

    async def get(self, key: str) -> Engine:
        """The engine of `key`, started now if it is not running."""
        e = self.engines[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if e.engine is None:
                started = time.perf_counter()
                e.engine = await self.start_model(e.started_model(), key)
                e.start_s += time.perf_counter() - started
                e.starts += 1
                if self.log is not None:
                    self.log(
                        f"sweep: engine {e.id} ({e.label}, {e.kind}) started in "
                        f"{time.perf_counter() - started:.1f} s for point(s) "
                        + ", ".join(f"#{n}" for n in sorted(e.points))
                    )
        assert e.engine is not None
        return e.engine

    async def of_roles(self, role_key: Mapping[str, str]) -> dict[str, Engine]:
        """role -> engine for a registration's keys, starting what is not running (in key order)."""
        for key in dict.fromkeys(role_key.values()):
            await self.get(key)
        return {role: await self.get(key) for role, key in role_key.items()}

    async def start(self) -> dict[str, Engine]:
        """The first registration's engines (a run, a build, a re-audit): role -> engine. An engine that
        fails to start closes the ones this call started."""
        try:
            return await self.of_roles(self.role_key)
        except BaseException:
            await self.close_all()
            raise

    async def start_model(self, model: ModelSettings, key: str) -> Engine:
        """One engine for one model record under the engine key `key`; a failure to start is one line."""
        kind = self.engines[key].kind
        try:
            row = registry.kind(kind)
            # Each engine's package is imported only when it starts (vllm and openai are optional extras).
            return await row.starter()(model, self.engines[key].settings, self.engines[key].endpoint)
        except (EngineDead, asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            # vLLM logs the root cause (e.g. not enough free memory for the KV share) and
            # raises a generic error: one line for the user; the log has the detail (its last
            # relevant lines follow the error line: failures.exit_for).
            log = engine_log.current()
            where = f"the cause is in {log}" if log else "the cause is in the log above"
            raise EngineDead(
                f"model {model.name!r} ({kind}): the engine failed to start: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''} "
                f"({where}; mode=plan checks memory first)"
            ) from None
        finally:
            engine_log.settle()  # the engine's libraries set up their loggers: to the log, not the terminal

    def describe(self) -> dict[str, dict[str, Any]]:
        """What plays each of the first registration's roles, as a manifest records it."""
        assert self.bindings is not None
        return roles_described(self, self.bindings, self.role_key, self.endpoints)

    def kind_of(self, role: str) -> str:
        """The engine kind of one of the first registration's roles."""
        return self.engines[self.role_key[role]].kind

    def remote(self) -> tuple[str, ...]:
        """The first registration's roles served by an endpoint, not in this process."""
        return tuple(r for r in self.role_key if registry.kind(self.kind_of(r)).served)

    async def close_one(self, key: str) -> None:
        e = self.engines[key]
        if e.engine is not None:
            engine, e.engine = e.engine, None
            await engine.close()

    async def keep_only(self, keys: set[str]) -> None:
        """Close the engines not in `keys` (and any that died), freeing their memory first."""
        for key, e in self.engines.items():
            if e.engine is not None and (key not in keys or e.dead):
                await self.close_one(key)
            if key in keys:
                e.dead = False

    async def close_all(self) -> None:
        for key in self.engines:
            await self.close_one(key)


def roles_described(
    pool: EnginePool, bindings: Bindings, role_key: Mapping[str, str], endpoints: Mapping[str, Endpoint]
) -> dict[str, dict[str, Any]]:
    """What played each role, as a run's manifest records it: its label, model path and revision, engine
    kind, and a served role's endpoint as health-checked."""
    out: dict[str, dict[str, Any]] = {}
    for role in (r for r in ROLES if r in role_key):
        e = pool.engines[role_key[role]]
        out[role] = {"name": bindings[role].label, "path": e.model.path, "revision": e.model.revision, "engine": e.kind}
        if role in endpoints:
            out[role]["endpoint"] = endpoints[role].manifest()
    return out
