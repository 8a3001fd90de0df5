"""Engine per role and endpoints as settings, without a model: the config and identity of a role on
an endpoint, how the pool groups roles, what the plan covers, the health check against a small fake
OpenAI server (answers, serves the model, window holds the first turn), the endpoint file, and the
client's retries with backoff. The real server is in tests/engine/test_mixed_engines.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

openai = pytest.importorskip("openai", reason="openai is not installed (pip install -e '.[openai]')")
import httpx  # noqa: E402

from ncp_local import config as config_mod  # noqa: E402
from ncp_local.bindings import bind  # noqa: E402
from ncp_local.config import ConfigError  # noqa: E402
from ncp_local.engines.base import EngineDead, Message, Request  # noqa: E402
from ncp_local.engines.openai import OpenAIEndpointConfig, OpenAIEngine, read_endpoint_file  # noqa: E402
from ncp_local.execution.engine_pool import EnginePool  # noqa: E402
from ncp_local.execution.preflight import preflight  # noqa: E402
from ncp_local.plan import check  # noqa: E402
from ncp_local.rundir import identity  # noqa: E402


def _raw(*overrides: str) -> dict[str, Any]:
    return OmegaConf.to_container(config_mod.compose(list(overrides)), resolve=True)  # type: ignore[return-value]


def _cfg(*overrides: str) -> config_mod.RunConfig:
    return config_mod.validate(_raw(*overrides))


# ---- a fake OpenAI-compatible server: /v1/models and /version only ---------------------------


class _Fake(BaseHTTPRequestHandler):
    models: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v1/models":
            body = {"object": "list", "data": self.server.models}  # type: ignore[attr-defined]
        elif self.path == "/version":
            body = {"version": "0.0-fake"}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_server() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    server.models = [
        {
            "id": "served-m",
            "object": "model",
            "root": "/srv/models/SmolLM2-135M",
            "owned_by": "vllm",
            "max_model_len": 8192,
            "created": 1,
        }
    ]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _url(server: Any) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def _remote(url: str, *more: str) -> tuple[str, ...]:
    return ("auditor.engine=openai", f"auditor.endpoint.base_url={url}", "auditor.endpoint.model=served-m", *more)


# ---- config, identity, pool, plan ------------------------------------------------------------


def test_a_role_defaults_to_the_top_level_engine_and_unchanged_configs_keep_their_identity() -> None:
    cfg = _cfg()
    assert [bind(cfg)[r].engine for r in ("narrator", "player", "auditor")] == ["vllm"] * 3
    default = identity.of_run(cfg)
    # Saying the default engine out loud is the same experiment; the new keys are not in the settings.
    assert identity.of_run(_cfg("auditor.engine=vllm")).key == default.key
    assert (
        "engine" not in default.parts["settings"]["auditor"] and "endpoint" not in default.parts["settings"]["auditor"]
    )
    assert all("engine" not in m for m in default.parts["models"].values())


def test_a_remote_role_is_identified_by_the_served_model_not_the_url() -> None:
    a = identity.of_run(_cfg(*_remote("http://a:1/v1")))
    b = identity.of_run(_cfg(*_remote("http://b:2/v1")))
    assert a.key == b.key  # where the server is is placement
    assert a.parts["models"]["auditor"] == {
        "kind": "endpoint",
        "served_model": "served-m",
        "revision": None,
        "reported": None,
        "engine": "openai",
    }
    other = identity.of_run(_cfg(*_remote("http://a:1/v1", "auditor.endpoint.model=other")))
    assert other.key != a.key
    assert 'auditor served_model "served-m" -> "other"' in identity.differences(a.parts, other.parts)
    assert identity.differences(identity.of_run(_cfg()).parts, a.parts)[0] == "auditor weights: embedded -> endpoint"


def test_roles_share_in_process_engines_and_endpoints() -> None:
    pool = EnginePool(bind(_cfg(*_remote("http://a:1/v1"))))
    assert pool.role_key["narrator"] == pool.role_key["player"] != pool.role_key["auditor"]
    assert pool.kind_of("narrator") == "vllm" and pool.kind_of("auditor") == "openai" and pool.remote() == ("auditor",)
    both = EnginePool(bind(_cfg("engine=openai", "engine.base_url=http://a:1/v1", "narrator.engine=vllm")))
    assert both.role_key["player"] == both.role_key["auditor"] and both.remote() == ("player", "auditor")
    assert both.describe()["narrator"]["engine"] == "vllm"


def test_the_plan_covers_in_process_engines_and_says_which_roles_are_remote() -> None:
    plan = check(_cfg(*_remote("http://a:1/v1")))
    assert plan.remote == ("auditor",)
    assert [e.roles for e in plan.engines] == [("narrator", "player")]


# ---- the health check -------------------------------------------------------------------------


@pytest.mark.engine_libs
def test_health_check_records_the_servers_answer(fake_server: Any) -> None:
    ready = preflight(_cfg(*_remote(_url(fake_server))))
    ep = ready.endpoints["auditor"]
    assert ep.config.base_url == _url(fake_server) and ep.config.model == "served-m"
    assert ep.manifest()["version"] == "0.0-fake" and ep.manifest()["models"][0]["id"] == "served-m"
    parts = identity.of_run(ready.cfg, endpoints=ready.endpoints).parts
    # The server's folder by name, not where it lies; the start time is not identity.
    assert parts["models"]["auditor"]["reported"] == {
        "id": "served-m",
        "root": "SmolLM2-135M",
        "max_model_len": 8192,
        "owned_by": "vllm",
    }


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"id": "another"}, "does not serve model 'served-m' (it serves: another)"),
        ({"max_model_len": 600}, "with a 600-token window, which does not hold the first turn"),
    ],
)
@pytest.mark.engine_libs
def test_health_check_refuses_in_one_line(fake_server: Any, change: dict[str, Any], expected: str) -> None:
    fake_server.models = [{**fake_server.models[0], **change}]
    with pytest.raises(ConfigError, match="auditor.endpoint.base_url: health check: ") as err:
        preflight(_cfg(*_remote(_url(fake_server))))
    assert expected in str(err.value) and "\n" not in str(err.value)


@pytest.mark.engine_libs
def test_health_check_on_a_server_that_does_not_answer() -> None:
    with pytest.raises(
        ConfigError,
        match=r"auditor.endpoint.base_url: health check: http://127.0.0.1:9/v1 does "
        r"not answer",
    ):
        preflight(_cfg(*_remote("http://127.0.0.1:9/v1")))
    with pytest.raises(ConfigError, match=r"auditor.endpoint.base_url: auditor.engine=openai needs the server"):
        preflight(_cfg("auditor.engine=openai"))


@pytest.mark.engine_libs
def test_the_endpoint_file_is_waited_for_bounded(fake_server: Any, tmp_path: Path) -> None:
    file = tmp_path / "endpoint"
    over = ("auditor.engine=openai", f"auditor.endpoint.file={file}", "auditor.endpoint.model=served-m")
    with pytest.raises(
        ConfigError,
        match=r"auditor.endpoint.file: health check: endpoint file .* is not there yet "
        r"\(the server job writes it once its /health answers\) after waiting 1 s",
    ):
        preflight(_cfg(*over, "auditor.endpoint.wait_s=1"))
    # Written while the run waits: it goes on.
    timer = threading.Timer(1.0, lambda: file.write_text(_url(fake_server) + "\n"))
    timer.start()
    ready = preflight(_cfg(*over, "auditor.endpoint.wait_s=30"))
    timer.join()
    assert ready.endpoints["auditor"].config.base_url == _url(fake_server)
    file.write_text(json.dumps({"base_url": "http://x:1/v1"}))
    assert read_endpoint_file(file) == "http://x:1/v1"


# ---- retries with backoff ---------------------------------------------------------------------

_HTTP = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def _answer() -> Any:
    from types import SimpleNamespace

    usage = SimpleNamespace(prompt_tokens=5, completion_tokens=2, prompt_tokens_details=None)
    return SimpleNamespace(
        choices=[SimpleNamespace(finish_reason="stop", message=SimpleNamespace(content="ok"))], usage=usage
    )


def _generate(outcomes: list[Any], monkeypatch: pytest.MonkeyPatch, **cfg: Any) -> tuple[Any, list[float]]:
    waits: list[float] = []

    async def no_sleep(s: float) -> None:
        waits.append(s)

    monkeypatch.setattr("ncp_local.engines.openai.asyncio.sleep", no_sleep)

    async def go() -> Any:
        backend = OpenAIEngine(OpenAIEndpointConfig(name="ep", base_url="http://127.0.0.1:9/v1", model="m", **cfg))
        todo = list(outcomes)

        async def create(**body: Any) -> Any:
            item = todo.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item

        backend._client.chat.completions.create = create  # type: ignore[method-assign]
        try:
            return await backend.generate(
                Request(messages=(Message("user", "hi"),), temperature=0.5, top_p=1.0, max_tokens=10, seed=1)
            )
        finally:
            await backend.close()

    return asyncio.run(go()), waits


def _status(cls: type, code: int) -> Exception:
    return cls("busy", response=httpx.Response(code, request=_HTTP), body=None)


def test_transport_failures_are_retried_with_backoff_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ncp_local.engines.openai")
    flaky = [
        openai.APIConnectionError(request=_HTTP),
        _status(openai.RateLimitError, 429),
        _status(openai.InternalServerError, 503),
        _answer(),
    ]
    c, waits = _generate(flaky, monkeypatch, max_retries=3, backoff_s=0.5)
    assert c.text == "ok" and waits == [0.5, 1.0, 2.0]
    assert [e.split(":")[0] for e in c.transport_errors] == ["APIConnectionError", "HTTP 429", "HTTP 503"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(line.startswith("endpoint 'ep' at http://127.0.0.1:9/v1: ") for line in lines)
    assert [line.split("; ")[1].split(" (")[0] for line in lines] == [
        "retry 1 of 3 in 0.5 s",
        "retry 2 of 3 in 1.0 s",
        "retry 3 of 3 in 2.0 s",
    ]


def test_an_endpoint_that_stays_down_is_engine_dead_and_a_busy_one_a_failed_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(EngineDead, match="unreachable after 3 tries"):
        _generate([openai.APIConnectionError(request=_HTTP)] * 3, monkeypatch, max_retries=2, backoff_s=0.1)
    c, waits = _generate([_status(openai.InternalServerError, 503)] * 3, monkeypatch, max_retries=2, backoff_s=0.1)
    assert c.finish_reason == "error" and len(c.transport_errors) == 3 and waits == [0.1, 0.2]
