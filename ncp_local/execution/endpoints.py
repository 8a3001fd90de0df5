"""The roles served by an OpenAI-compatible endpoint: their settings, and the health check a run makes
before any episode starts.

The check waits (bounded) for the endpoint file a server job writes, then asks the server what it
serves (`/v1/models`, `/version`): it must serve the role's model name, and its window (when it
reports one) must hold the role's first turn (the longest prompt of the opening and turn 1, played
with the rig's own prompts as `mode=plan` plays them, plus what the call must keep for its answer).
Anything else is one line naming the role's endpoint key, exit 2, before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..bindings import Bindings
from ..config import ConfigError
from ..engines.openai import EndpointProblem, EndpointReport, OpenAIEndpointConfig, wait_for_endpoint
from ..plan.growth import Growth

__all__ = ["Endpoint", "check"]


@dataclass(frozen=True)
class Endpoint:
    """A role's endpoint as checked: the settings its engine starts with and what the server reported."""

    config: OpenAIEndpointConfig
    report: EndpointReport

    @property
    def served(self) -> dict[str, Any]:
        return self.report.card(self.config.model) or {}

    def manifest(self) -> dict[str, Any]:
        """For the manifest: where it was, the server's `/v1/models` answer and version."""
        return {
            "base_url": self.config.base_url,
            "served_model": self.config.model,
            "models": list(self.report.models),
            "version": self.report.version,
        }


def _key(settings: Mapping[str, Any]) -> str:
    return "file" if settings.get("file") and not settings.get("base_url") else "base_url"


def _first_turn(growth: Growth, role: str) -> tuple[int, str]:
    """The most tokens one of the role's calls takes at the opening or turn 1 (prompt + answer room)."""
    best, stage = 0, ""
    for g in growth.stages.values():
        if g.role != role:
            continue
        need = int(max(g.opening or 0, g.line.at(1) if not g.opening_only else 0) + g.need)
        if need > best:
            best, stage = need, g.stage
    return best, stage


def check(
    bindings: Bindings,
    roles: tuple[str, ...],
    growth: Callable[[], Growth | None],
    cache: dict[str, Endpoint] | None = None,
) -> dict[str, Endpoint]:
    """Each remote role's endpoint, waited for and checked (see the module doc); ConfigError when not.

    `growth`: the prompt projection, played only when a server reports a window to check (None: no
    episodes to play). `cache`: endpoints already checked, by settings (a sweep's points share them)."""
    out: dict[str, Endpoint] = {}
    played: list[Growth | None] = []
    for role in bindings.served(roles):
        binding = bindings[role]
        ep = binding.endpoint
        key = _key(ep)
        field = f"{role}.endpoint.{key}"
        if not ep.get("base_url") and not ep.get("file"):
            raise ConfigError(
                f"{role}.endpoint.base_url",
                f"{role}.engine=openai needs the server's address: "
                f"{role}.endpoint.base_url=URL or {role}.endpoint.file=PATH",
            )
        memo = repr(sorted(ep.items())) + repr(binding.endpoint_config("x").model_dump())
        if cache is not None and memo in cache:
            out[role] = cache[memo]
            continue
        file = None if ep.get("base_url") else ep["file"]
        started = time.monotonic()
        try:
            # Only an endpoint file is waited for (its server job may still be starting); a configured
            # URL must answer now.
            conf, report = wait_for_endpoint(
                file,
                None if file else binding.endpoint_config(),
                float(ep["wait_s"]) if file else 0.0,
                make=binding.endpoint_config,
            )
        except EndpointProblem as exc:
            raise ConfigError(field, f"health check: {exc}") from None
        if file is not None and time.monotonic() - started > 5:
            print(f"{role}: endpoint {conf.base_url} answered after {time.monotonic() - started:.0f} s", flush=True)
        endpoint = Endpoint(conf, report)
        window = report.window(conf.model)
        if window is not None and not played:
            played.append(growth())
        if window is not None and played[0] is not None:
            need, stage = _first_turn(played[0], role)
            if need > window:
                raise ConfigError(
                    field,
                    f"health check: {conf.base_url} serves '{conf.model}' with a {window}-token "
                    f"window, which does not hold the first turn ({stage} needs about {need} tokens "
                    f"with its answer; serve it with a larger --max-model-len)",
                )
        out[role] = endpoint
        if cache is not None:
            cache[memo] = endpoint
    return out
