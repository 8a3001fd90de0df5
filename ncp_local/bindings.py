"""What each role runs on, decided once from the run's config.

`config/` holds what the user set, validated; this module resolves it into one typed `Binding` per
role (its engine kind, model settings, endpoint settings, sampling and output bounds) and the engine
plan (which roles share which engine). The rules that used to be re-derived from the whole config in
several modules live here: a role's own `<role>.engine` over the top-level `engine`, a role's
`endpoint` over the `engine=openai` group's, the label of what played a role (`scripted` when no
model ran), and how roles group into engines. Pre-flight, the engine pool, the endpoints' health
check, the identity and the plan take a `Bindings`; the reports read a recorded config's engines
with `recorded_engine` and `ran_no_model` below.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .config import SCRIPTED, EngineCfg, RunConfig
from .engines.openai import ENDPOINT_SETTINGS, OpenAIEndpointConfig
from .engines.registry import KINDS, EngineKind, kind
from .engines.settings import ModelSettings, share_engines, with_run_switches
from .protocol import ROLES
from .protocol.stages import Bounds

__all__ = [
    "Binding",
    "Bindings",
    "EngineGroup",
    "Sampling",
    "bind",
    "ran_no_model",
    "recorded_engine",
]


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 512


@dataclass(frozen=True)
class Binding:
    """One role as the run plays it."""

    role: str
    engine: str  # the engine kind's name (engines/registry.py)
    model: ModelSettings
    sampling: Sampling
    bounds: Bounds
    # The endpoint settings that are set: `<role>.endpoint` over the `engine=openai` group's (the
    # group's other options, extra_body, schema_name, ..., come along); read only when served.
    endpoint: Mapping[str, Any]
    own_endpoint: frozenset[str]  # the keys among them the role's own `endpoint` set

    @property
    def kind(self) -> EngineKind:
        return kind(self.engine)

    @property
    def label(self) -> str:
        """What played the role: its model's name, or `scripted` when no model ran."""
        return self.model.name if self.kind.runs_model else SCRIPTED

    @property
    def served_model(self) -> str:
        """The model name the role's endpoint serves: configured, else the role's model name."""
        return str(self.endpoint.get("model") or self.model.name)

    def endpoint_field(self, key: str) -> str:
        """The config key an endpoint setting came from, for an error line."""
        return f"{self.role}.endpoint.{key}" if key in self.own_endpoint else f"engine.{key}"

    def endpoint_config(self, base_url: str | None = None) -> OpenAIEndpointConfig:
        """The engine settings of the role's endpoint (`base_url`: as read from its endpoint file)."""
        fields: dict[str, Any] = {
            "name": self.model.name,
            "base_url": base_url or self.endpoint.get("base_url") or "",
            "model": self.served_model,
            "chat_template_kwargs": dict(self.model.chat_template_kwargs),
        }
        fields.update({k: self.endpoint[k] for k in ENDPOINT_SETTINGS if self.endpoint.get(k) is not None})
        return OpenAIEndpointConfig(**fields)


@dataclass(frozen=True)
class EngineGroup:
    """One engine of the plan: its key, kind, the model record it starts with, and the roles it serves."""

    key: str
    kind: str
    model: ModelSettings
    roles: tuple[str, ...]


@dataclass(frozen=True)
class Bindings:
    """Every role's binding, and the run-wide engine settings (the top-level `engine` group)."""

    engine: EngineCfg
    roles: Mapping[str, Binding]

    def __getitem__(self, role: str) -> Binding:
        return self.roles[role]

    def __iter__(self) -> Iterator[Binding]:
        return iter(self.roles.values())

    @property
    def deterministic(self) -> bool:
        """`engine.deterministic`: every in-process engine batch-invariant."""
        return bool(getattr(self.engine, "deterministic", False))

    def all_as(self, role: str) -> Bindings:
        """Every role bound as `role` is (a re-audit: the auditor's model for all, so one engine starts)."""
        return Bindings(self.engine, {r: replace(self.roles[role], role=r) for r in self.roles})

    def served(self, roles: Iterable[str] = ROLES) -> tuple[str, ...]:
        """The roles on an OpenAI-compatible endpoint."""
        return tuple(r for r in roles if self.roles[r].kind.served)

    def in_process(self, roles: Iterable[str] = ROLES) -> tuple[str, ...]:
        """The roles whose model loads in this process (planned, fingerprinted)."""
        return tuple(r for r in roles if self.roles[r].kind.in_process)

    def started_model(self, model: ModelSettings) -> ModelSettings:
        """The model record an engine starts with: the run-wide switches applied."""
        return with_run_switches(model, self.deterministic)

    def groups(
        self, roles: Iterable[str] = ROLES, endpoint: Callable[[str], OpenAIEndpointConfig] | None = None
    ) -> list[EngineGroup]:
        """The engine plan: in-process roles on the same model settings share one engine, roles on the
        same endpoint settings one client (`endpoint`: a role's as health-checked, default as
        configured), scripted roles one scripted engine. Keys are stable across runs and points: a
        run with every role on the top-level engine keeps the keys it always had."""
        endpoint = endpoint or (lambda role: self.roles[role].endpoint_config())
        by_kind: dict[str, list[str]] = {}
        for role in roles:
            by_kind.setdefault(self.roles[role].engine, []).append(role)
        out: list[EngineGroup] = []
        for name, users in by_kind.items():
            row = kind(name)
            named: dict[str, tuple[ModelSettings, tuple[str, ...]]]
            if row.in_process:
                shared = share_engines({role: self.roles[role].model for role in users})
                named = {key if name == self.engine.name else f"{name}:{key}": v for key, v in shared.items()}
            elif row.served:
                named = {}
                for role in users:
                    key = f"{name}:" + json.dumps(endpoint(role).model_dump(mode="json"), sort_keys=True)
                    first, sharing = named.get(key, (self.roles[role].model, ()))
                    named[key] = (first, (*sharing, role))
            else:
                named = {name: (self.roles[users[0]].model, tuple(users))}
            out.extend(EngineGroup(key, name, model, sharing) for key, (model, sharing) in named.items())
        return out


def _endpoint(cfg: RunConfig, role: str) -> tuple[dict[str, Any], frozenset[str]]:
    top = cfg.engine.model_dump(exclude={"name"}, exclude_none=True) if KINDS[cfg.engine.name].served else {}
    own = getattr(cfg, role).endpoint
    mine = own.model_dump(exclude_none=True, exclude_defaults=True)
    merged = {**top, **mine}
    merged.setdefault("wait_s", own.wait_s)
    return merged, frozenset(mine)


def bind(cfg: RunConfig) -> Bindings:
    """The run's roles resolved from its config (the config as planned, when pre-flight planned it)."""
    roles = {}
    for role in ROLES:
        rc = getattr(cfg, role)
        endpoint, own = _endpoint(cfg, role)
        roles[role] = Binding(
            role=role,
            engine=rc.engine or cfg.engine.name,
            model=rc.model,
            sampling=Sampling(rc.temperature, rc.top_p, rc.max_tokens),
            bounds=rc.bounds,
            endpoint=endpoint,
            own_endpoint=own,
        )
    return Bindings(cfg.engine, roles)


def recorded_engine(raw: Mapping[str, Any], role: str | None = None) -> str:
    """The engine a recorded config (a manifest's) gave a role, or the run (role None); "" if none."""
    own = (raw.get(role) or {}).get("engine") if role else None
    return str(own or (raw.get("engine") or {}).get("name") or "")


def ran_no_model(raw: Mapping[str, Any], role: str | None = None) -> bool:
    """A recorded config whose engine for the role (or the run) answers from a script: no model ran."""
    row = KINDS.get(recorded_engine(raw, role))
    return row is not None and not row.runs_model
