"""Narrator methods written for the official NCP-Bench code, run unchanged.

An official method subclasses the official `Narrator` (`start_episode`, `open`, `respond`,
`checkpoint_state`, `restore_episode`) and owns a client with one call, `complete(messages, *, stage)
-> str`. `method.name=<module>:<Class>` naming such a class gets `adapter_for(cls)`: a rig narrator
(the `narrators.Narrator` protocol) that builds the official requests from the rig's state, runs the
method's synchronous code in a thread of its own, and gives it a client whose `complete()` hands the
call back to the event loop as a rig call (the narrator role's engine, per-call seeds, the stage's
grammar where the rig has that stage, retries, the call log). The loop keeps running every other
episode while the method waits, so its calls batch with theirs.

The official classes are found through the class's own MRO (the `ncpbench` package it imports);
nothing of the official code is copied here. Its stage names map to the rig's stages where the
rig has the same stage (`opening`, and the baseline's `method_response_generate` = `narrate`), so
those calls get the same seeds and grammar as the rig's own baseline; any other stage of a method
is sent as plain text under the narrator role, seeded apart by its name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..chat import Message
from .failures import CallFailed
from .ledger import EpisodeState, active_facts, first_pending_node
from .spec import Spec
from .turns import OPENING

Ask = Callable[..., Coroutine[Any, Any, Any]]  # narrators.Ask (which imports this module, so named again)

OFFICIAL_BASE = "ncpbench.narrator.Narrator"
# An official stage name -> the rig's stage of the same call (same seeds, same grammar).
STAGE_OF: dict[str, str] = {"opening": "opening", "method_response_generate": "narrate"}
# The narrator stage the rig logs a method's other calls under (plain text, no grammar).
PLAIN_STAGE = "narrate"
# How often a method's thread, waiting for its call, looks whether the run is still going.
WAIT_S = 0.5


def is_official_narrator(cls: Any) -> bool:
    """A subclass of the official `Narrator` (checked by name through its MRO: the rig never imports it)."""
    return inspect.isclass(cls) and any(f"{k.__module__}.{k.__qualname__}" == OFFICIAL_BASE for k in cls.__mro__[1:])


class OfficialOptions(BaseModel):
    """`method.*` for an official method: its constructor's keyword arguments (the client aside).
    `history` is the rig's own narrators' option, accepted and unused (the method decides what it shows)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    history: Literal["full", "first_line"] = "full"
    # The method's stages sent with the rig's grammar for that stage (the official runner's JSON mode:
    # both for its baseline, only `opening` for its HiAgent, whose turn answers are plain text).
    structured_stages: tuple[str, ...] = ("opening", "method_response_generate")


class _Client:
    """The method's model client: `complete()` runs on the method's thread and waits for a rig call on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, structured: tuple[str, ...]) -> None:
        self.loop = loop
        self.structured = frozenset(structured)
        self.ask: Ask | None = None  # the current turn's, set before each call into the method
        self.count: dict[str, int] = {}  # calls of one stage in this turn: the second one is seeded apart

    def bind(self, ask: Ask) -> None:
        self.ask, self.count = ask, {}

    def complete(self, messages: Sequence[Mapping[str, str]], *, stage: str) -> str:
        assert self.ask is not None, "complete() outside a turn"
        rig_stage = STAGE_OF.get(stage)
        n = self.count.get(stage, 0)
        self.count[stage] = n + 1
        # The first call of a mapped stage is seeded as the rig's own; a method's own re-ask (its own
        # retry on an answer it could not parse) or another stage gets a key of its own.
        key = ("" if rig_stage else stage) + (f"#{n}" if n else "")
        sent = tuple(Message(m["role"], m["content"]) for m in messages)
        call = self.ask(
            rig_stage or PLAIN_STAGE,
            "",
            {},
            messages=sent,
            grammar=rig_stage is not None and stage in self.structured,
            key=key,
            role="narrator",
        )
        try:
            future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(call, self.loop)
        except RuntimeError:  # the loop is closed: the run is over
            call.close()
            raise _Stop(None) from None
        while True:
            try:
                text: str = future.result(timeout=WAIT_S)
                return text
            except concurrent.futures.TimeoutError:
                if not self.loop.is_running():  # stopped with the call never run: nothing will answer
                    future.cancel()
                    raise _Stop(None) from None
            except concurrent.futures.CancelledError:
                raise _Stop(None) from None
            except Exception as exc:
                raise _Stop(exc) from None


class _Stop(BaseException):
    """A rig call's failure (or the run's end) carried through the method's own `except Exception`: the
    rig already retried the call, and an invalid or out-of-room episode ends as the rig's rules say,
    not after a second round of the method's retries."""

    def __init__(self, error: Exception | None) -> None:
        super().__init__(error)
        self.error = error


class OfficialMethod:
    """A rig narrator around one official method instance (one per episode, as the rig makes them)."""

    METHOD: type  # the official class (set by `adapter_for`)
    TEMPLATES: tuple[str, ...] = ()  # an official method brings its own prompts
    Options = OfficialOptions

    def __init__(
        self,
        pack: Any = None,
        roles: Any = None,
        history: str = "full",
        structured_stages: tuple[str, ...] = OfficialOptions().structured_stages,
        **options: Any,
    ) -> None:
        # `pack`, `roles`, `history`: what the rig gives every narrator; an official method has no use for them.
        self._structured = tuple(structured_stages)
        self._options = constructor_args(self.METHOD, options)
        self._client: _Client | None = None
        self._method: Any = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="official-method")
        self._restore: dict[str, Any] | None = None
        self._official = importlib.import_module("ncpbench.narrator")
        self._models = importlib.import_module("ncpbench.models")

    # ---- the official records, from the rig's state ----

    def _facts(self, state: EpisodeState) -> tuple[Any, ...]:
        return tuple(self._models.Fact(id=f.id, text=f.text, active=True) for f in active_facts(state.facts))

    def _commitments(self, spec: Spec, state: EpisodeState) -> tuple[Any, ...]:
        status = state.status_map
        return tuple(
            self._models.Commitment(
                id=c.id,
                kind=c.type,
                description=c.description,
                satisfaction_condition=c.satisfaction_condition,
                violation_condition=c.violation_condition,
                status=status.get(c.id, "pending"),
            )
            for c in spec.commitments
        )

    def _trajectory(self, spec: Spec, occurred: tuple[bool, ...]) -> tuple[Any, ...]:
        return tuple(
            self._models.TrajectoryNode(
                id=n.id, description=n.description, trigger_event=n.trigger_event, key_delta=n.key_delta, occurred=o
            )
            for n, o in zip(spec.trajectory, occurred, strict=True)
        )

    def _context(self, spec: Spec) -> Any:
        return self._official.EpisodeContext(
            episode_id=spec.id,
            player_role=spec.meta.player_role,
            trajectory=self._trajectory(spec, tuple(False for _ in spec.trajectory)),
        )

    # ---- running the method's synchronous code ----

    async def _call(self, ask: Ask, turn: int, name: str, *args: Any) -> Any:
        """`method.<name>(*args)` on the method's thread, with `ask` for the calls it makes. The method's own
        failure (its retries spent on answers it could not parse, a bad checkpoint) ends the episode
        `invalid` with its words, as a failed call does."""
        loop = asyncio.get_running_loop()
        if self._client is None:
            self._client = _Client(loop, self._structured)
            # Constructed on its thread too: a constructor may read files or load a tokenizer.
            self._method = await loop.run_in_executor(self._thread, partial(self.METHOD, self._client, **self._options))
        self._client.bind(ask)
        try:
            return await loop.run_in_executor(self._thread, getattr(self._method, name), *args)
        except _Stop as stop:
            if stop.error is not None:
                raise stop.error from None
            raise asyncio.CancelledError from None
        except Exception as exc:
            raise CallFailed(f"method.{name}", turn, f"{type(exc).__name__}: {exc}") from None

    async def opening(self, spec: Spec, state: EpisodeState, ask: Ask) -> str:
        await self._call(ask, OPENING, "start_episode", self._context(spec))
        request = self._official.OpeningRequest(
            player_role=spec.meta.player_role,
            active_facts=self._facts(state),
            commitments=self._commitments(spec, state),
            trajectory=self._trajectory(spec, state.node_occurred),
        )
        response = await self._call(ask, OPENING, "open", request)
        return str(response.text).strip()

    async def respond(self, spec: Spec, state: EpisodeState, player_input: str, ask: Ask) -> str:
        if self._restore is not None:  # resumed from a checkpoint: the method's state at that turn
            data, self._restore = self._restore, None
            await self._call(ask, len(state.exchanges), "restore_episode", self._context(spec), data)
        turn = len(state.exchanges)
        history = [self._models.StoryTurn(-1, None, state.opening)]
        history += [self._models.StoryTurn(i, x.player_input, x.response) for i, x in enumerate(state.exchanges)]
        pending = self._models.PendingFactUpdates(
            add_facts=tuple(state.pending.add_facts), negate_fact_ids=tuple(state.pending.negate_facts)
        )
        current = first_pending_node(state.node_occurred)
        request = self._official.NarratorRequest(
            turn_id=turn,
            player_role=spec.meta.player_role,
            player_input=player_input,
            history=tuple(history),
            active_facts=self._facts(state),
            commitments=self._commitments(spec, state),
            trajectory=self._trajectory(spec, state.node_occurred),
            current_node_id=spec.trajectory[current].id if current is not None else None,
            pending_fact_updates=pending,
        )
        response = await self._call(ask, turn, "respond", request)
        return str(response.text).strip()

    def save(self) -> dict[str, Any]:
        return dict(self._method.checkpoint_state()) if self._method is not None else {}

    def close(self) -> None:
        """The official runner's last call of an episode (Episode.run makes it)."""
        if self._method is not None:
            self._method.close_episode()

    def restore(self, data: dict[str, Any]) -> None:
        # The official restore needs the episode's context, which the next call brings.
        self._restore = dict(data)


def constructor_args(cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """`method.*` as the constructor's keyword arguments: a mapping given for a parameter annotated with a
    dataclass (HiAgent's `config: HiAgentRuntimeConfig | None`) is made into that dataclass."""
    try:
        hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]  # the class, not an instance
    except Exception:  # annotations that do not resolve: the options go as given
        hints = {}
    out = dict(options)
    for name, value in options.items():
        hint = hints.get(name)
        kinds: list[type] = [
            t for t in (typing.get_args(hint) or (hint,)) if isinstance(t, type) and dataclasses.is_dataclass(t)
        ]
        if isinstance(value, Mapping) and kinds:
            out[name] = kinds[0](**value)
    return out


def adapter_for(cls: type) -> type:
    """The rig narrator class that runs the official method `cls`."""
    return type(f"Official{cls.__name__}", (OfficialMethod,), {"METHOD": cls, "__module__": __name__})
