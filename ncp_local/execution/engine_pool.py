"""From config to running engines: one engine per distinct model.

Roles that name the same model (same path and engine settings) share one
engine, so a 135M model playing narrator, player and auditor loads once.
What may start is checked before, in `preflight`; this module only starts and
stops engines.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..config import SCRIPTED, RunConfig
from ..engines.base import Engine, EngineDead
from ..engines.scripted import RandomPolicy, ScriptedEngine
from ..engines.settings import EMBEDDED, ModelSettings, share_engines, with_run_switches
from ..protocol import ROLES
from . import engine_log
from .identity import digest


# Said once per run that the embedded model plays: it is there to exercise the pipeline.
EMBEDDED_NOTE = ("note: the embedded SmolLM2-135M plays {roles}: it only exercises the pipeline, and its verdicts "
                 "measure nothing (real models: see README \"Models, GPUs, offline use\")")


def embedded_note(cfg: RunConfig, roles: tuple[str, ...] = ROLES) -> str | None:
    """The one-line note when the embedded model plays a role on a real engine, else None."""
    if cfg.engine.name == SCRIPTED:
        return None
    playing = [r for r in roles if getattr(cfg, r).model.path == EMBEDDED]
    return EMBEDDED_NOTE.format(roles=", ".join(playing)) if playing else None


class EnginePool:
    def __init__(self, cfg: RunConfig, roles: tuple[str, ...] = ROLES) -> None:
        self.cfg = cfg
        self.kind: str = cfg.engine.name
        self.roles = roles
        groups = share_engines({role: getattr(cfg, role).model for role in roles})
        self.models: dict[str, ModelSettings] = {key: model for key, (model, _) in groups.items()}
        self.role_key: dict[str, str] = {role: key for key, (_, users) in groups.items() for role in users}
        self.engines: dict[str, Engine] = {}

    def model_for(self, key: str) -> ModelSettings:
        """The model record an engine starts with: the run-wide `engine.deterministic` applied."""
        return with_run_switches(self.models[key], getattr(self.cfg.engine, "deterministic", False))

    def key_of(self, role: str) -> str:
        """One engine per distinct (engine settings, model settings): the same key across runs and points."""
        return digest({"engine": self.cfg.engine.model_dump(mode="json"), "model": self.role_key[role]})

    def describe(self) -> dict[str, Any]:
        out = {}
        for role in self.roles:
            m = self.models[self.role_key[role]]
            out[role] = {"name": self.cfg.model_name(role), "path": m.path, "revision": m.revision, "engine": self.kind}
        return out

    async def start(self) -> dict[str, Engine]:
        by_key: dict[str, Engine] = {}
        try:
            for key in self.models:
                by_key[key] = await self.start_model(self.model_for(key))
        except BaseException:
            for b in by_key.values():
                await b.close()
            raise
        self.engines = by_key
        return {role: by_key[self.role_key[role]] for role in self.roles}

    async def start_model(self, model: ModelSettings) -> Engine:
        """One engine for one model record (a batched sweep starts each distinct model once for all
        its points: ncp_local/launch/sweep.py; the caller then closes it)."""
        try:
            return await self._start(model)
        except (EngineDead, asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            # vLLM logs the root cause (e.g. not enough free memory for the KV share) and
            # raises a generic error: one line for the user; the log has the detail (its last
            # relevant lines follow the error line: failures.exit_for).
            log = engine_log.current()
            where = f"the cause is in {log}" if log else "the cause is in the log above"
            raise EngineDead(f"model {model.name!r} ({self.kind}): the engine failed to start: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''} "
                             f"({where}; mode=plan checks memory first)") from None
        finally:
            engine_log.settle()  # the engine's libraries set up their loggers: to the log, not the terminal

    async def _start(self, model: ModelSettings) -> Engine:
        e = self.cfg.engine
        # Each engine's package is imported only when it starts (vllm and openai are optional extras).
        if e.name == "scripted":
            return ScriptedEngine(policy=RandomPolicy(conflict_rate=e.conflict_rate, overturn_rate=e.overturn_rate,
                                                      node_rate=e.node_rate, satisfy_rate=e.satisfy_rate),
                                  delay_s=e.delay_s, die_after_calls=e.die_after_calls)
        if e.name == "openai":
            from ..engines.openai import OpenAIEngine

            return OpenAIEngine.from_config(model=model, engine=e)
        from ..engines.vllm import VLLMEngine

        return await VLLMEngine.from_model_config(model)

    async def close(self) -> None:
        for b in self.engines.values():
            await b.close()
        self.engines = {}
