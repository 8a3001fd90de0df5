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
import json
from collections.abc import Mapping
from typing import Any

from ..config import RunConfig, role_engine, role_kind
from ..engines import registry
from ..engines.base import Engine, EngineDead
from ..engines.settings import EMBEDDED, ModelSettings, share_engines, with_run_switches
from ..protocol import ROLES
from . import engine_log
from .endpoints import Endpoint, endpoint_config
from .identity import digest

# Said once per run that the embedded model plays: it is there to exercise the pipeline.
EMBEDDED_NOTE = (
    "note: the embedded SmolLM2-135M plays {roles}: it only exercises the pipeline, and its verdicts "
    "measure nothing (real models: see docs/guide/models-and-gpus.md)"
)


def embedded_note(cfg: RunConfig, roles: tuple[str, ...] = ROLES) -> str | None:
    """The one-line note when the embedded model plays a role on a real engine, else None."""
    # Only roles that run the embedded model on vLLM (not scripted, not behind an endpoint).
    playing = [r for r in roles if role_kind(cfg, r).in_process and getattr(cfg, r).model.path == EMBEDDED]
    return EMBEDDED_NOTE.format(roles=", ".join(playing)) if playing else None


class EnginePool:
    def __init__(
        self, cfg: RunConfig, roles: tuple[str, ...] = ROLES, endpoints: Mapping[str, Endpoint] | None = None
    ) -> None:
        self.cfg = cfg
        self.kind: str = cfg.engine.name
        self.roles = roles
        self.endpoints = dict(endpoints or {})
        self.kinds: dict[str, str] = {}  # engine key -> its kind (engines/registry.py)
        self.models: dict[str, ModelSettings] = {}
        self.role_key: dict[str, str] = {}
        by_kind: dict[str, list[str]] = {}
        for role in roles:
            by_kind.setdefault(role_engine(cfg, role), []).append(role)
        for kind, users in by_kind.items():
            row = registry.kind(kind)
            if row.in_process:
                groups = share_engines({role: getattr(cfg, role).model for role in users})
                # A run with every role in-process keeps the keys it always had (a batched sweep keys on them).
                named = {key if kind == self.kind else f"{kind}:{key}": value for key, value in groups.items()}
            elif row.served:
                named = {}
                for role in users:
                    key = f"{kind}:" + json.dumps(self._endpoint(role).model_dump(mode="json"), sort_keys=True)
                    first, shared = named.get(key, (getattr(cfg, role).model, ()))
                    named[key] = (first, (*shared, role))
            else:
                named = {kind: (getattr(cfg, users[0]).model, tuple(users))}
            for key, (model, shared) in named.items():
                self.models[key], self.kinds[key] = model, kind
                self.role_key.update({role: key for role in shared})
        self.engines: dict[str, Engine] = {}

    def _endpoint(self, role: str) -> Any:
        """The role's endpoint settings: as health-checked (its URL read from the endpoint file), else configured."""
        if role in self.endpoints:
            return self.endpoints[role].config
        return endpoint_config(self.cfg, role)

    def kind_of(self, role: str) -> str:
        return self.kinds[self.role_key[role]]

    def remote(self) -> tuple[str, ...]:
        """The roles served by an endpoint, not in this process."""
        return tuple(r for r in self.roles if registry.kind(self.kind_of(r)).served)

    def model_for(self, key: str) -> ModelSettings:
        """The model record an engine starts with: the run-wide `engine.deterministic` applied."""
        return with_run_switches(self.models[key], getattr(self.cfg.engine, "deterministic", False))

    def key_of(self, role: str) -> str:
        """One engine per distinct (engine settings, model settings): the same key across runs and points."""
        return digest({"engine": self.cfg.engine.model_dump(mode="json"), "model": self.role_key[role]})

    def describe(self) -> dict[str, Any]:
        out: dict[str, dict[str, Any]] = {}
        for role in self.roles:
            m = self.models[self.role_key[role]]
            out[role] = {
                "name": self.cfg.model_name(role),
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
        (ncp_local/launch/sweep.py); the caller then closes it."""
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
        return await row.starter()(model, self.cfg.engine, endpoint)

    async def close(self) -> None:
        for b in self.engines.values():
            await b.close()
        self.engines = {}
