"""The OpenAI-compatible backend against a real vLLM server of the embedded model: the session's
served model (conftest `served`, tests/engine/served.py), shared with the mixed-engine runs.

Token counts come from the server itself (`/tokenize`: the chat template applied, no prefill), and the
window from what it reports (`/v1/models`' `max_model_len`), so no test depends on guessing either."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from engine_helpers import embedded_roles, free_port, stage_calls
from ncp_local.engines.base import ContextOverflow, Engine, Message, Request
from served import SERVED_NAME

ROOT = Path(__file__).resolve().parents[2]
# An 8k-token prefill on 2 busy cores: minutes, not the 2 minutes a short call gets.
PREFILL_S = 900.0


@pytest.fixture(scope="module")
def server(served) -> str:
    return served.url


@pytest.fixture(scope="module")
def client(server: str):
    from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine

    loop = asyncio.new_event_loop()
    # chat_template_kwargs exercises the vLLM request-body extension (this
    # template ignores it; Qwen3's reads enable_thinking).
    cfg = OpenAIEndpointConfig(
        name="served",
        base_url=server,
        model=SERVED_NAME,
        timeout_s=120,
        max_retries=0,
        chat_template_kwargs={"enable_thinking": False},
        max_concurrency=4,
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
    req = _req(
        "Facts: f_0 the door is red; f_1 it is night. Story: the blue door opens at noon. Audit it.", json_schema=SCHEMA
    )
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


def _window(server: str) -> int:
    """The served model's window, as the server reports it to the rig's health check."""
    from ncp_local.engines.openai import OpenAIEndpointConfig, probe

    window = probe(OpenAIEndpointConfig(name="served", base_url=server, model=SERVED_NAME)).window(SERVED_NAME)
    assert window is not None, "vLLM's /v1/models reports max_model_len"
    return window


def _tokens(server: str, text: str) -> int:
    """The prompt tokens of one user message as the server counts them (its /tokenize: template applied)."""
    body = json.dumps({"model": SERVED_NAME, "messages": [{"role": "user", "content": text}]}).encode()
    root = server.removesuffix("/v1")
    request = urllib.request.Request(root + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return int(json.loads(r.read())["count"])


def test_context_overflow_maps(client, server: str) -> None:
    backend, run = client
    window = _window(server)
    # Clearly over the window (half as long again), so no tokenizer detail can make it fit.
    too_long = "word " * (window * 3 // 2)
    assert _tokens(server, too_long) > window
    with pytest.raises(ContextOverflow, match=f"endpoint 'served': .*maximum context length is {window} tokens"):
        run(
            backend.generate(
                Request(messages=(Message("user", too_long),), temperature=0.0, top_p=1.0, max_tokens=16, seed=7)
            )
        )
    # Fits alone, not with max_tokens: the server caps max_tokens, the backend
    # turns the early cut-off into ContextOverflow.
    # (Only visible when the output runs into the cap: a model that stops
    # early within the room left simply answers. Counting keeps it going.)
    counting, room = _counting_prompt(server, window)
    # min_room: the call needs its whole budget, so a capped one is an overflow.
    req = Request(
        messages=(Message("user", counting),), temperature=0.0, top_p=1.0, max_tokens=100, seed=7, min_room=100
    )
    with pytest.raises(ContextOverflow, match=f"left room for only {room} of max_tokens 100"):
        run(backend.generate(req), timeout=PREFILL_S)


def _counting_prompt(server: str, window: int) -> tuple[str, int]:
    """A counting prompt that leaves between 8 and 40 tokens of the window (by the server's count), and
    that room. Found by bisection on the numbers listed; the server only tokenizes (no prefill)."""

    def text(n: int) -> str:
        return "Count from 1 to 10000, separated by commas: " + ", ".join(str(i) for i in range(1, n)) + ","

    low, high = 2, window  # each number is at least one token: `window` numbers never fit
    while low < high:
        mid = (low + high + 1) // 2
        if window - _tokens(server, text(mid)) >= 8:
            low = mid
        else:
            high = mid - 1
    room = window - _tokens(server, text(low))
    assert 8 <= room <= 40, room
    return text(low), room


def test_every_audit_stage_schema_goes_to_the_server_and_parses(served, tmp_path: Path) -> None:
    """The auditor's real stage schemas (ids from real protocol state, the embedded model's bounds), through
    the rig's own endpoint path (endpoint settings from the config, the call service's parse and retries),
    sent to the served model: the server takes each one (a schema its grammar backend refuses is a 400)
    and every stage gets an answer that passes its contract."""
    from omegaconf import OmegaConf

    from ncp_local.bindings import bind
    from ncp_local.config import compose, validate
    from ncp_local.engines.openai import OpenAIEngine
    from ncp_local.execution.calls import CallService, RoleBinding
    from ncp_local.protocol.prompts import TEMPLATES, PromptPack
    from ncp_local.protocol.spec import load_dataset
    from ncp_local.protocol.stages import STAGES
    from ncp_local.rundir.call_log import read_calls
    from ncp_local.rundir.store import RunDir

    cfg = validate(
        OmegaConf.to_container(
            compose(
                [
                    "dataset.path=specs",
                    "auditor.engine=openai",
                    f"auditor.endpoint.base_url={served.url}",
                    f"auditor.endpoint.model={SERVED_NAME}",
                    "auditor.endpoint.max_retries=0",
                ]
            ),
            resolve=True,
        )
    )
    spec = load_dataset(ROOT / "specs").specs[0]
    calls = [c for c in stage_calls(spec, build=False) if STAGES[c[0]].role == "auditor"]
    assert {c[0] for c in calls} == {
        "fact_update",
        "conflict_check",
        "double_check",
        "trajectory_check",
        "status_check",
    }
    sampling, bounds = embedded_roles()["auditor"]
    store = RunDir(tmp_path)
    store.open({"test": True}, "served-stage-schemas")

    async def go() -> list:
        async with OpenAIEngine(bind(cfg)["auditor"].endpoint_config()) as backend:
            service = CallService(
                roles={"auditor": RoleBinding(backend, sampling, "smollm2", bounds)},
                pack=PromptPack.load(required=TEMPLATES),
                store=store,
                seed=0,
            )
            return await asyncio.gather(
                *(
                    service.ask(spec.id, 0, stage, template, variables, ids=ids, key=template, extra=extra)
                    for stage, template, variables, ids, extra in calls
                )
            )

    try:
        answers = asyncio.run(asyncio.wait_for(go(), 900))
    finally:
        store.close()
    assert len(answers) == len(calls) and all(a is not None for a in answers)
    logged = read_calls(tmp_path / "calls.jsonl")
    # The server refused no schema (its refusals are logged as the endpoint's errors), and every stage
    # ended with an answer that passed its contract.
    assert not [c.error for c in logged if "endpoint '" in (c.error or "")]
    assert {c.key for c in logged if c.error is None} == {template for _, template, *_ in calls}


def test_unknown_model_is_a_clear_error(server: str) -> None:
    from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine

    cfg = OpenAIEndpointConfig(name="x", base_url=server, model="no-such-model", max_retries=0)
    with pytest.raises(ValueError, match="does not serve model 'no-such-model'"):
        asyncio.run(OpenAIEngine.start(cfg))


def test_missing_api_key_env_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine

    monkeypatch.delenv("NCP_TEST_NO_SUCH_KEY", raising=False)
    cfg = OpenAIEndpointConfig(
        name="x", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NCP_TEST_NO_SUCH_KEY"
    )
    with pytest.raises(ValueError, match="NCP_TEST_NO_SUCH_KEY"):
        OpenAIEngine(cfg)


def test_unreachable_endpoint_is_engine_dead() -> None:
    from ncp_local.engines.base import EngineDead
    from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine

    cfg = OpenAIEndpointConfig(
        name="x", base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0, timeout_s=5
    )
    with pytest.raises(EngineDead, match="not reachable"):
        asyncio.run(OpenAIEngine.start(cfg))
