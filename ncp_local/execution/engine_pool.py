"""From config to running engines: one engine per distinct model, per role's engine kind.

Roles in-process on the same model (same path and engine settings) share one
engine, so a 135M model playing narrator, player and auditor loads once;
roles on the same endpoint (same server, served model and client settings)
share one client and its connection pool; scripted roles share one scripted
engine. What may start is checked before, in `preflight` (endpoints there
too: `ready.endpoints`); this module only starts and stops engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..bindings import Bindings
from ..engines import registry
from ..engines.base import Engine, EngineDead
from ..engines.openai import OpenAIEndpointConfig
from ..engines.settings import EMBEDDED, ModelSettings
from ..protocol import ROLES
from ..rundir.identity import digest
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


class EnginePool:
    """Starts and stops the engines of the run's engine plan (`Bindings.groups`)."""

    def __init__(
        self, bindings: Bindings, roles: tuple[str, ...] = ROLES, endpoints: Mapping[str, Endpoint] | None = None
    ) -> None:
        self.bindings = bindings
        self.kind: str = bindings.engine.name
        self.roles = roles
        self.endpoints = dict(endpoints or {})
        self.kinds: dict[str, str] = {}  # engine key -> its kind (engines/registry.py)
        self.models: dict[str, ModelSettings] = {}
        self.role_key: dict[str, str] = {}
        for group in bindings.groups(roles, self._endpoint):
            self.models[group.key], self.kinds[group.key] = group.model, group.kind
            self.role_key.update({role: group.key for role in group.roles})
        self.engines: dict[str, Engine] = {}

    def _endpoint(self, role: str) -> OpenAIEndpointConfig:
        """The role's endpoint settings: as health-checked (its URL read from the endpoint file), else configured."""
        if role in self.endpoints:
            return self.endpoints[role].config
        return self.bindings[role].endpoint_config()

    def kind_of(self, role: str) -> str:
        return self.kinds[self.role_key[role]]

    def remote(self) -> tuple[str, ...]:
        """The roles served by an endpoint, not in this process."""
        return tuple(r for r in self.roles if registry.kind(self.kind_of(r)).served)

    def model_for(self, key: str) -> ModelSettings:
        """The model record an engine starts with: the run-wide `engine.deterministic` applied."""
        return self.bindings.started_model(self.models[key])

    def key_of(self, role: str) -> str:
        """One engine per distinct (engine settings, model settings): the same key across runs and points."""
        return digest({"engine": self.bindings.engine.model_dump(mode="json"), "model": self.role_key[role]})

    def describe(self) -> dict[str, Any]:
        out: dict[str, dict[str, Any]] = {}
        for role in self.roles:
            m = self.models[self.role_key[role]]
            out[role] = {
                "name": self.bindings[role].label,
                "path": m.path,
                "revision": m.revision,
                "engine": self.kind_of(role),
            }
            if role in self.endpoints:
                out[role]["endpoint"] = self.endpoints[role].manifest()
        return out

    async def start(self) -> dict[str, Engine]:
        by_key: dict[str, Engine] = {}
        try:
            for key in self.models:
                by_key[key] = await self.start_model(self.model_for(key), key)
        except BaseException:
            for b in by_key.values():
                await b.close()
            raise
        self.engines = by_key
        return {role: by_key[self.role_key[role]] for role in self.roles}

    async def start_model(self, model: ModelSettings, key: str | None = None) -> Engine:
        """One engine for one model record under the engine key `key` (default: this pool's top-level
        engine). A batched sweep starts each distinct model once for all its points
        (ncp_local/launch/shared_engines.py); the caller then closes it."""
        kind = self.kinds[key] if key is not None else self.kind
        try:
            return await self._start(model, kind, key)
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

    async def _start(self, model: ModelSettings, kind: str, key: str | None) -> Engine:
        # Each engine's package is imported only when it starts (vllm and openai are optional extras).
        row = registry.kind(kind)
        endpoint = None
        if row.served:
            endpoint = self._endpoint(next(r for r in self.roles if key is None or self.role_key[r] == key))
        return await row.starter()(model, self.bindings.engine, endpoint)

    async def close(self) -> None:
        for b in self.engines.values():
            await b.close()
        self.engines = {}
