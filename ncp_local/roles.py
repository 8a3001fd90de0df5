"""Narrator methods and player conditions.

A narrator method is anything with `opening`, `respond`, `save`, `restore`;
the episode and the runner never look past that interface.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from .ledger import EpisodeState
from .prompts import PromptPack, narrate_vars, opening_vars, player_vars
from .spec import Spec, SpecError
from .stages import Narration

CONDITIONS: tuple[str, ...] = ("adversarial", "natural")


class Ask(Protocol):
    """One validated model call (retries and logging live in the runner)."""

    async def __call__(self, stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any: ...


class Narrator(Protocol):
    async def opening(self, spec: Spec, state: EpisodeState, ask: Ask) -> str: ...

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Ask) -> str: ...

    def save(self) -> dict[str, Any]: ...

    def restore(self, data: dict[str, Any]) -> None: ...


class BaselineNarrator:
    """The plain narrator: whole past responses in its history (PROTOCOL section 8)."""

    TEMPLATES: tuple[str, ...] = ()  # beyond the protocol's own

    def __init__(self, pack: PromptPack, **_: Any) -> None:
        self.pack = pack

    async def opening(self, spec: Spec, state: EpisodeState, ask: Ask) -> str:
        out: Narration = await ask("opening", "opening", opening_vars(spec, state))
        return out.text.strip()

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Ask) -> str:
        out: Narration = await ask("narrate", "narrate", narrate_vars(spec, state, player_input))
        return out.text.strip()

    def save(self) -> dict[str, Any]:
        return {}

    def restore(self, data: dict[str, Any]) -> None:
        return None


METHODS: dict[str, str] = {"baseline": "ncp_local.roles:BaselineNarrator",
                            "hiagent": "ncp_local.hiagent:HiAgentNarrator"}


def narrator_factory(method: str) -> type:
    """`baseline`, or a user class given as `package.module:Class`."""
    target = METHODS.get(method, method)
    if ":" not in target:
        raise SpecError("config", "method.name", f"unknown narrator method {method!r} "
                        f"(known: {', '.join(METHODS)}; or give package.module:Class)")
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SpecError("config", "method.name", f"cannot import {target!r}: {exc}") from None


class Player:
    """The simulated player for one condition; sees only the visible history."""

    def __init__(self, condition: str) -> None:
        if condition not in CONDITIONS:
            raise SpecError("config", "condition", f"unknown condition {condition!r} (known: {', '.join(CONDITIONS)})")
        self.template = f"player_{condition}"

    async def act(self, spec: Spec, state: EpisodeState, ask: Ask) -> str:
        text: str = await ask("player", self.template, player_vars(spec, state))
        return _first_action(text)


def _first_action(text: str) -> str:
    # Small models like to wrap the action in quotes or a label; the action
    # itself is what the narrator must see.
    text = text.strip().strip('"').strip()
    for label in ("Action:", "ACTION:", "PLAYER:", "Player:"):
        if text.startswith(label):
            text = text[len(label):].strip()
    return text
