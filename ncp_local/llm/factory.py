"""From config to running backends: one engine per distinct model.

Roles that name the same model (same path and engine settings) share one
engine, so a 135M model playing narrator, player and auditor loads once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Backend

ROLES = ("narrator", "player", "auditor")
EMBEDDED = "embedded"


def _model_key(model: Any) -> str:
    return json.dumps(model.model_dump(exclude={"name"}), sort_keys=True)


class Engines:
    def __init__(self, cfg: Any, roles: tuple[str, ...] = ROLES) -> None:
        self.cfg = cfg
        self.kind: str = cfg.engine.name
        self.roles = roles
        self.models: dict[str, Any] = {}  # key -> ModelCfg
        self.role_key: dict[str, str] = {}
        for role in roles:
            model = getattr(cfg, role).model
            key = _model_key(model)
            self.models.setdefault(key, model)
            self.role_key[role] = key
        self.backends: dict[str, Backend] = {}

    def check(self) -> None:
        """Every local model path exists; fails before anything loads."""
        from ..config import ConfigError

        if self.kind != "vllm":
            return
        for role in self.roles:
            model = self.models[self.role_key[role]]
            if model.path == EMBEDDED:
                continue
            if not Path(model.path).expanduser().exists():
                raise ConfigError(f"{role}.model.path", f"model {model.name!r}: no such path {model.path} "
                                  "(set models_root or NCP_MODELS_ROOT, or override the path)")

    def describe(self) -> dict[str, Any]:
        out = {}
        for role in self.roles:
            m = self.models[self.role_key[role]]
            out[role] = {"name": m.name, "path": m.path, "revision": m.revision, "engine": self.kind}
        return out

    async def start(self) -> dict[str, Backend]:
        by_key: dict[str, Backend] = {}
        try:
            for key, model in self.models.items():
                by_key[key] = await self._start_one(model)
        except BaseException:
            for b in by_key.values():
                await b.close()
            raise
        self.backends = by_key
        return {role: by_key[self.role_key[role]] for role in self.roles}

    async def _start_one(self, model: Any) -> Backend:
        if self.kind == "scripted":
            from .scripted import RandomPolicy, ScriptedBackend

            e = self.cfg.engine
            return ScriptedBackend(policy=RandomPolicy(
                conflict_rate=getattr(e, "conflict_rate", 0.1), overturn_rate=getattr(e, "overturn_rate", 0.3),
                node_rate=getattr(e, "node_rate", 0.35), satisfy_rate=getattr(e, "satisfy_rate", 0.25)),
                delay_s=float(getattr(e, "delay_s", 0.0) or 0.0), die_after_calls=getattr(e, "die_after_calls", None))
        if self.kind == "openai":
            from .openai_backend import OpenAIBackend

            e = self.cfg.engine
            return OpenAIBackend.from_config(model=model, engine=e)
        from .vllm_backend import VLLMBackend

        return await VLLMBackend.from_model_config(model)

    async def close(self) -> None:
        for b in self.backends.values():
            await b.close()
        self.backends = {}
