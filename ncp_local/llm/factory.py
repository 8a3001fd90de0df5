"""From config to running backends: one engine per distinct model.

Roles that name the same model (same path and engine settings) share one
engine, so a 135M model playing narrator, player and auditor loads once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from .base import Backend, EngineDead

ROLES = ("narrator", "player", "auditor")
EMBEDDED = "embedded"
# The package each engine imports when it starts, and how to install it (pyproject extras).
ENGINE_PACKAGES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "pip install -e '.[cpu]' (CPU; torch first, see README) or -e '.[gpu]' (GPU)"),
    "openai": ("openai", "pip install -e '.[openai]'"),
}


def _model_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a local model folder (vLLM reads config.json, or params.json in Mistral format)."""
    try:
        if not path.exists():
            return "no such path"
        if not path.is_dir():
            return "is a file, not a model folder"
        if not any(path.iterdir()):
            return "is an empty folder"
        if not ((path / "config.json").is_file() or (path / "params.json").is_file()):
            return "has no config.json: not a model folder"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return None


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
        """Every local model path exists and every `engine_args` key is one vLLM
        takes; fails before anything loads, naming the field."""
        import importlib.util
        import os

        from ..config import ConfigError

        if self.kind in ENGINE_PACKAGES:
            package, install = ENGINE_PACKAGES[self.kind]
            if importlib.util.find_spec(package) is None:
                raise ConfigError("engine", f"engine={self.kind} needs the {package} package, which is not "
                                  f"installed: {install}")
        if self.kind == "openai":
            key_env = getattr(self.cfg.engine, "api_key_env", None)
            if key_env and not os.environ.get(key_env):
                raise ConfigError("engine.api_key_env", f"environment variable {key_env} is not set")
        if self.kind != "vllm":
            return
        for role in self.roles:
            model = self.models[self.role_key[role]]
            problem = None if model.path == EMBEDDED else _model_dir_problem(Path(model.path).expanduser())
            if problem:
                raise ConfigError(f"{role}.model.path", f"model {model.name!r}: {model.path}: {problem} "
                                  "(set models_root or NCP_MODELS_ROOT, or override the path)")
        for role in self.roles:
            model = self.models[self.role_key[role]]
            if not model.engine_args:
                continue
            from .vllm_backend import engine_args_problem

            try:
                problem = engine_args_problem(model)
            except ImportError as exc:
                raise ConfigError(f"{role}.model.engine_args", f"cannot check them: vllm is not importable "
                                  f"({exc}); install the cpu or gpu extra") from None
            if problem is not None:
                raise ConfigError(f"{role}.model.engine_args.{problem[0]}", f"model {model.name!r}: {problem[1]}")
        for role in self.roles:
            self._check_grammar(role)

    def _check_grammar(self, role: str) -> None:
        """Every schema this role's stages use compiles for its model's structured-output backend."""
        from ..config import ConfigError
        from ..stages import STAGES, UNBOUNDED
        from .grammar import stage_unsupported

        backend = self.models[self.role_key[role]].structured_outputs_backend
        bounds = getattr(getattr(self.cfg, role), "bounds", None) or UNBOUNDED
        asked = {role, "builder"} if role == "auditor" else {role}
        for stage in (s.name for s in STAGES.values() if s.role in asked and s.json):
            why = stage_unsupported(stage, backend, bounds)
            if why:
                raise ConfigError(f"{role}.model.structured_outputs_backend",
                                  f"{backend} cannot take the {stage} schema: {why}")

    def model_for(self, key: str) -> Any:
        """The model record an engine starts with: the run-wide `engine.deterministic` applied."""
        model = self.models[key]
        if getattr(self.cfg.engine, "deterministic", False) and not model.deterministic:
            return model.model_copy(update={"deterministic": True})
        return model

    def describe(self) -> dict[str, Any]:
        out = {}
        for role in self.roles:
            m = self.models[self.role_key[role]]
            out[role] = {"name": m.name, "path": m.path, "revision": m.revision, "engine": self.kind}
        return out

    async def start(self) -> dict[str, Backend]:
        by_key: dict[str, Backend] = {}
        try:
            for key in self.models:
                by_key[key] = await self._start_one(self.model_for(key))
        except BaseException:
            for b in by_key.values():
                await b.close()
            raise
        self.backends = by_key
        return {role: by_key[self.role_key[role]] for role in self.roles}

    async def start_model(self, model: Any) -> Backend:
        """One engine for one model record, outside `start` (a batched sweep starts each distinct
        model once for all its points: ncp_local/sweep.py). The caller closes it."""
        return await self._start_one(model)

    async def _start_one(self, model: Any) -> Backend:
        try:
            return await self._start_backend(model)
        except (EngineDead, asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            # vLLM logs the root cause (e.g. not enough free memory for the KV share) and
            # raises a generic error: one line for the user, the log above has the detail.
            raise EngineDead(f"model {model.name!r} ({self.kind}): the engine failed to start: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''} "
                             "(the cause is in the log above; mode=plan checks memory first)") from None

    async def _start_backend(self, model: Any) -> Backend:
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
