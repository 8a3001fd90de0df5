"""The OpenAI-compatible backend at its boundary, with the HTTP client's call
replaced: a request's own error is a failed attempt; an overflow only when
the room the server left is below what the call needs; an unreachable
endpoint is EngineDead."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[openai]')")
import httpx  # noqa: E402

from ncp_local.engines.base import ContextOverflow, EngineDead, Message, Request  # noqa: E402
from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine  # noqa: E402

_HTTP = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _status(cls: type, code: int, message: str) -> Exception:
    return cls(message, response=httpx.Response(code, request=_HTTP), body=None)


def _answer(finish: str, prompt: int, completion: int) -> Any:
    usage = SimpleNamespace(prompt_tokens=prompt, completion_tokens=completion, prompt_tokens_details=None)
    choice = SimpleNamespace(finish_reason=finish, message=SimpleNamespace(content="x" * completion))
    return SimpleNamespace(choices=[choice], usage=usage)


def _generate(outcome: Any, request: Request):
    async def go():
        backend = OpenAIEngine(
            OpenAIEndpointConfig(name="ep", base_url="http://127.0.0.1:9/v1", model="m", max_retries=0)
        )

        async def create(**body: Any) -> Any:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        backend._client.chat.completions.create = create  # type: ignore[method-assign]
        try:
            return await backend.generate(request)
        finally:
            await backend.close()

    return asyncio.run(go())


def _req(max_tokens: int = 100, **kw: Any) -> Request:
    return Request(messages=(Message("user", "hi"),), temperature=0.5, top_p=1.0, max_tokens=max_tokens, seed=1, **kw)


@pytest.mark.parametrize(
    "exc",
    [
        _status(openai.BadRequestError, 400, "Grammar compilation failed: unsupported keyword"),
        _status(openai.UnprocessableEntityError, 422, "Grammar compilation failed: unsupported keyword"),
        _status(openai.InternalServerError, 500, "Grammar compilation failed: unsupported keyword"),
    ],
)
def test_a_request_error_is_a_failed_attempt(exc: Exception) -> None:
    c = _generate(exc, _req())
    assert c.finish_reason == "error" and c.text == "" and "Grammar compilation failed" in (c.error or "")


def test_overflow_only_below_what_the_call_needs() -> None:
    with pytest.raises(ContextOverflow):
        _generate(_status(openai.BadRequestError, 400, "This model's maximum context length is 1024 tokens"), _req())
    # The server capped 100 at the 70 tokens the window had left: a clamped budget, not an overflow.
    c = _generate(_answer("length", 954, 70), _req(100))
    assert c.finish_reason == "length" and c.max_tokens_sent == 70
    # ...unless the call needs more than that room.
    with pytest.raises(ContextOverflow, match="left room for only 70 .* below the 80"):
        _generate(_answer("length", 954, 70), _req(100, min_room=80))
    # Cut at the requested budget itself: an ordinary length finish.
    assert _generate(_answer("length", 10, 100), _req(100)).max_tokens_sent == 100


def test_unreachable_endpoint_is_engine_dead() -> None:
    with pytest.raises(EngineDead):
        _generate(openai.APIConnectionError(request=_HTTP), _req())


def test_an_answer_without_choices_is_a_failed_attempt() -> None:
    # Was a TypeError (mypy found the missing argument): an empty `choices` is the server's fault,
    # a failed attempt like any other.
    c = _generate(SimpleNamespace(choices=[], usage=None), _req())
    assert c.finish_reason == "error" and "no choices" in (c.error or "") and c.transport_errors == ()
