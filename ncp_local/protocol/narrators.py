"""Narrator methods: the baseline, and how a method is found and its options checked.

A narrator method is anything with `opening`, `respond`, `save`, `restore`;
the episode and the runner never look past that interface.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InputError
from .ledger import EpisodeState
from .official_method import adapter_for, is_official_narrator
from .prompts import PromptPack, narrate_vars, opening_vars
from .spec import Spec
from .stages import Narration


class Ask(Protocol):
    """One validated model call (retries and logging live in the runner)."""

    async def __call__(self, stage: str, template: str, variables: dict[str, str], **kw: Any) -> Any: ...


class Narrator(Protocol):
    async def opening(self, spec: Spec, state: EpisodeState, ask: Ask) -> str: ...

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Ask) -> str: ...

    def save(self) -> dict[str, Any]: ...

    def restore(self, data: dict[str, Any]) -> None: ...

    # Optional: `close()`, called once when the episode's run ends (protocol/episode.py), for a method
    # that holds resources per episode (an official method's `close_episode`).


class NarratorOptions(BaseModel):
    """A narrator method's options (everything under `method` but its name); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # How its own past passages are shown: whole, or cut to their first line as
    # the reference's narrator sees them (experiment=paper; PROTOCOL section 8).
    history: Literal["full", "first_line"] = "full"


class BaselineNarrator:
    """The plain narrator (PROTOCOL section 3): the current node, its own past passages, this input."""

    TEMPLATES: tuple[str, ...] = ()  # beyond the protocol's own
    Options: type[BaseModel] = NarratorOptions

    def __init__(self, pack: PromptPack, history: str = "full", **_: Any) -> None:
        self.pack = pack
        self.first_line_history = history == "first_line"

    async def opening(self, spec: Spec, state: EpisodeState, ask: Ask) -> str:
        out: Narration = await ask("opening", "opening", opening_vars(spec, state))
        return out.text.strip()

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Ask) -> str:
        out: Narration = await ask(
            "narrate", "narrate", narrate_vars(spec, state, player_input, self.first_line_history)
        )
        return out.text.strip()

    def save(self) -> dict[str, Any]:
        return {}

    def restore(self, data: dict[str, Any]) -> None:
        return None


METHODS: dict[str, str] = {
    "baseline": "ncp_local.protocol.narrators:BaselineNarrator",
    "hiagent": "ncp_local.protocol.hiagent:HiAgentNarrator",
}


# The official repository's packages: its core (`ncpbench`, the repository's root) and each paper
# method's, `ncpbench_reference_<method>` in `reference-methods/<method>`.
OFFICIAL_CORE = "ncpbench"
OFFICIAL_METHOD_PREFIX = "ncpbench_reference_"


def official_install_hint(module: str, exc: BaseException) -> str | None:
    """For an official package that is not installed: which one, and the command that installs it."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not (missing == OFFICIAL_CORE or missing.startswith(OFFICIAL_METHOD_PREFIX)):
        return None
    clone = "/path/to/NCP-Bench"  # a clone of the official repository
    paths = [clone]
    if module.startswith(OFFICIAL_METHOD_PREFIX):
        paths.append(f"{clone}/reference-methods/{module.removeprefix(OFFICIAL_METHOD_PREFIX)}")
    return (
        f"the official package {missing!r} is not installed; install it from a clone of the official "
        f"repository: pip install {' '.join(f'-e {p}' for p in paths)} (docs/guide/official-benchmark.md)"
    )


def narrator_factory(method: str) -> type:
    """`baseline`, or a user class given as `package.module:Class`."""
    target = METHODS.get(method, method)
    if ":" not in target:
        raise InputError(
            "config",
            "method.name",
            f"unknown narrator method {method!r} (known: {', '.join(METHODS)}; or give package.module:Class)",
        )
    module, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        hint = official_install_hint(module, exc)
        raise InputError("config", "method.name", f"cannot import {target!r}: {hint or exc}") from None
    # A method written for the official NCP-Bench code runs as it is, behind an adapter.
    if is_official_narrator(cls):
        return adapter_for(cls)
    # Checked here, before any engine starts: a class that is not a narrator
    # would otherwise fail at the first opening.
    missing = [m for m in ("opening", "respond", "save", "restore") if not callable(getattr(cls, m, None))]
    if not inspect.isclass(cls) or missing:
        raise InputError(
            "config",
            "method.name",
            f"{target!r} is not a narrator class: neither the rig's kind "
            f"(needs opening, respond, save, restore; missing: {', '.join(missing) or 'a class'}) "
            "nor a subclass of the official ncpbench Narrator",
        )
    return cls


def narrator_options(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """A method's options checked against its `Options` model (a plugin without one takes them as given)."""
    model = getattr(cls, "Options", None)
    if model is None:
        return dict(options)
    try:
        checked: dict[str, Any] = model.model_validate(options).model_dump()
        return checked
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        got = repr(err.get("input"))[:60]
        raise InputError("config", f"method.{key}", f"{err['msg']} (got {got})") from None
