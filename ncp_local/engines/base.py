"""The one interface every engine implements: `generate(request) -> completion`, `close()`.

An engine knows models, not the protocol: a request carries opaque tags
(stage, episode, turn, attempt) only so that logs and scripted tests can key
on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..chat import Message

__all__ = ["Completion", "ContextOverflow", "Engine", "EngineDead", "Message", "Request"]


@dataclass(frozen=True)
class Request:
    messages: tuple[Message, ...]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    json_schema: dict[str, Any] | None = None
    # A plain-text constraint (a regular expression), for outputs that are not JSON.
    regex: str | None = None
    # Opaque labels (stage, episode, turn, attempt, role); never read by a real engine.
    tags: dict[str, Any] = field(default_factory=dict)
    # The fewest output tokens this call can make do with. A backend sends
    # min(max_tokens, window - prompt) and raises ContextOverflow only when
    # that room is below min(max_tokens, min_room).
    min_room: int = 64


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" | "length" | "error" ...
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    latency_s: float = 0.0
    # The engine's own message when it could not run the request
    # (finish_reason "error": a grammar that fails to compile, a rejected request).
    error: str | None = None
    # The output budget the engine was given (max_tokens clamped to the room
    # the prompt left in the window); None when the backend does not know it.
    max_tokens_sent: int | None = None
    # Whether this engine had not been sent this grammar before, so that it compiled it for this
    # call (its compile time is then inside latency_s); None when the backend does not know.
    grammar_new: bool | None = None
    # Transport failures retried before this answer (an endpoint's connection errors, timeouts, 429/5xx).
    transport_errors: tuple[str, ...] = ()
    # A thinking model's thought, split off by the engine's reasoning parser: `text` is
    # then the answer after it. Its tokens are among `generated_tokens`.
    thought: str | None = None
    thought_tokens: int = 0


class ContextOverflow(Exception):
    """The prompt leaves less room in the model's context window than the call needs."""


class EngineDead(Exception):
    """The engine process is gone; the run cannot go on (resume later)."""


@runtime_checkable
class Engine(Protocol):
    async def generate(self, request: Request) -> Completion: ...

    async def close(self) -> None: ...
