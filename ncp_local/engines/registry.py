"""The engine kinds: one table of what each backend is and what the rest of the rig asks of it.

A role's engine (`engine=...`, or `<role>.engine`) names a row here. Pre-flight reads the package
to check and the fix to print; the engine pool groups the roles and starts each engine through the
row's `start` ("module:function", imported only then, since vllm and openai are optional extras);
the plan, the identity, the labels and the cost table read the three facts below instead of
comparing names. Adding an engine kind: a row here, its module under `ncp_local/engines/` with its
`start` function, and its settings class in `config/sections.py`'s `EngineCfg` union.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..resources import engine_install_hint, install_hint
from .base import Engine
from .settings import ModelSettings

# start(model, engine settings, the role's endpoint settings or None) -> a started engine
Start = Callable[[ModelSettings, Any, Any], Awaitable[Engine]]


@dataclass(frozen=True)
class EngineKind:
    name: str
    start: str  # "module:function" of the kind's `Start`
    # The model is loaded in this process: the plan sizes its memory and window, its weights are
    # fingerprinted for the identity, and roles with the same model settings share one engine.
    in_process: bool = False
    # An OpenAI-compatible endpoint: health-checked before the run, one engine per endpoint, and the
    # identity takes the served model's name and what its server reports (its weights are not here).
    served: bool = False
    # False: answers come from a script, no model ran; labels, identities and cost say so.
    runs_model: bool = True
    package: str | None = None  # imported when the engine starts: pre-flight checks it is installed
    install: str = ""  # how to install the package
    requires: tuple[str, ...] = ()  # what the package itself imports to run: missing, it is not importable

    def starter(self) -> Start:
        module, _, function = self.start.partition(":")
        start: Start = getattr(importlib.import_module(module), function)
        return start


KINDS: dict[str, EngineKind] = {
    k.name: k
    for k in (
        EngineKind(
            "vllm",
            "ncp_local.engines.vllm:start",
            in_process=True,
            package="vllm",
            install=engine_install_hint(),
            requires=("torch",),
        ),
        EngineKind("scripted", "ncp_local.engines.scripted:start", runs_model=False),
        EngineKind(
            "openai",
            "ncp_local.engines.openai:start",
            served=True,
            package="openai",
            install=install_hint("openai"),
        ),
    )
}


def kind(name: str) -> EngineKind:
    """The row of an engine name the config has validated."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown engine kind {name!r} (known: {', '.join(KINDS)})") from None
