"""The OpenAI-compatible backend against a real vLLM server of the embedded model: the session's
served model (conftest `served`, tests/engine/served.py), shared with the mixed-engine runs."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from engine_helpers import free_port
from served import SERVED_NAME

from ncp_local.engines.base import ContextOverflow, Engine, Message, Request

SERVER_MAX_MODEL_LEN = 8192  # the model file's window, as the rig's engine runs it
# An 8k-token prefill on 2 busy cores: minutes, not the 2 minutes a short call gets.
PREFILL_S = 900.0


@pytest.fixture(scope="module")
def server(served) -> str:
    return served.url


@pytest.fixture(scope="module")
def client(server: str):
    from ncp_local.engines.openai import OpenAIEngine, OpenAIEndpointConfig

    loop = asyncio.new_event_loop()
    # chat_template_kwargs exercises the vLLM request-body extension (this
    # template ignores it; Qwen3's reads enable_thinking).
    cfg = OpenAIEndpointConfig(
        name="served", base_url=server, model=SERVED_NAME, timeout_s=120, max_retries=0,
        chat_template_kwargs={"enable_thinking": False}, max_concurrency=4,
    )
    backend = loop.run_until_complete(OpenAIEngine.start(cfg))

    def run(coro, timeout: float = 120.0):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))

    try:
        yield backend, run
    finally:
        loop.run_until_complete(backend.close())
        loop.close()


SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["consistent", "conflict"]},
        "fact_ids": {"type": "array", "items": {"type": "string", "enum": ["f_0", "f_1"]}, "maxItems": 2},
        "reason": {"type": "string", "maxLength": 30},
    },
    "required": ["verdict", "fact_ids", "reason"],
    "additionalProperties": False,
}


def _req(text: str, **kw) -> Request:
    base = dict(temperature=0.7, top_p=0.95, max_tokens=64, seed=7)
    base.update(kw)
    return Request(messages=(Message("system", "Reply with JSON only."), Message("user", text)), **base)


def test_is_a_backend(client) -> None:
    backend, _ = client
    assert isinstance(backend, Engine)


def test_json_schema_round_trip(client) -> None:
    backend, run = client
    req = _req("Facts: f_0 the door is red; f_1 it is night. Story: the blue door opens at noon. Audit it.",
               json_schema=SCHEMA)
    a = run(backend.generate(req))
    assert a.finish_reason == "stop", a
    jsonschema.validate(json.loads(a.text), SCHEMA)
    assert a.prompt_tokens > 0 and a.generated_tokens > 0 and a.latency_s > 0
    # Same seed, same text.
    b = run(backend.generate(req))
    assert b.text == a.text


def test_cached_tokens_are_reported(client) -> None:
    backend, run = client
    # Prefix caching works in whole KV blocks: the prompt must span several.
    history = " ".join(f"Turn {i}: room {i} has {i % 5} doors." for i in range(50))
    req = _req(history + " What next?", max_tokens=4)
    first = run(backend.generate(req))
    second = run(backend.generate(req))
    assert first.prompt_tokens == second.prompt_tokens > 400
    assert second.cached_tokens >= first.prompt_tokens // 2, (first, second)


def test_plain_text_and_length(client) -> None:
    backend, run = client
    c = run(backend.generate(_req("Tell a long story about the sea.", max_tokens=5, temperature=0.0)))
    assert c.finish_reason == "length"
    assert c.generated_tokens == 5


def test_context_overflow_maps(client) -> None:
    backend, run = client
    with pytest.raises(ContextOverflow):
        run(backend.generate(_req("word " * (SERVER_MAX_MODEL_LEN + 50))))
    # Fits alone, not with max_tokens: the server caps max_tokens, the backend
    # turns the early cut-off into ContextOverflow.
    # (Only visible when the output runs into the cap: a model that stops
    # early within the room left simply answers. Counting keeps it going.)
    counting = _counting_prompt(backend, run, SERVER_MAX_MODEL_LEN - 60)
    # min_room: the call needs its whole budget, so a capped one is an overflow.
    req = Request(messages=(Message("user", counting),), temperature=0.0, top_p=1.0, max_tokens=100, seed=7,
                  min_room=100)
    with pytest.raises(ContextOverflow, match="left room for only"):
        run(backend.generate(req), timeout=PREFILL_S)


def _counting_prompt(backend, run, tokens: int) -> str:
    """A counting prompt of about `tokens` tokens (measured with the server's own count)."""
    n = 200
    while True:
        text = "Count from 1 to 10000, separated by commas: " + ", ".join(str(i) for i in range(1, n)) + ","
        c = run(backend.generate(Request(messages=(Message("user", text),), temperature=0.0, top_p=1.0,
                                         max_tokens=1, seed=7)), timeout=PREFILL_S)
        if c.prompt_tokens >= tokens:
            return text
        n = int(n * tokens / c.prompt_tokens) + 5


def test_unknown_model_is_a_clear_error(server: str) -> None:
    from ncp_local.engines.openai import OpenAIEngine, OpenAIEndpointConfig

    cfg = OpenAIEndpointConfig(name="x", base_url=server, model="no-such-model", max_retries=0)
    with pytest.raises(ValueError, match="does not serve model 'no-such-model'"):
        asyncio.run(OpenAIEngine.start(cfg))


def test_missing_api_key_env_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ncp_local.engines.openai import OpenAIEngine, OpenAIEndpointConfig

    monkeypatch.delenv("NCP_TEST_NO_SUCH_KEY", raising=False)
    cfg = OpenAIEndpointConfig(name="x", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NCP_TEST_NO_SUCH_KEY")
    with pytest.raises(ValueError, match="NCP_TEST_NO_SUCH_KEY"):
        OpenAIEngine(cfg)


def test_unreachable_endpoint_is_engine_dead() -> None:
    from ncp_local.engines.base import EngineDead
    from ncp_local.engines.openai import OpenAIEngine, OpenAIEndpointConfig

    cfg = OpenAIEndpointConfig(name="x", base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0, timeout_s=5)
    with pytest.raises(EngineDead, match="not reachable"):
        asyncio.run(OpenAIEngine.start(cfg))
