"""The `Engine` interface against an OpenAI-compatible HTTP endpoint
(a `vllm serve` on another node, or any compatible server).

Structured outputs go as `response_format={"type": "json_schema", ...}` with
`strict: true` (the server's own JSON-schema support: vLLM compiles it with its
structured-output backend); vLLM-specific knobs (e.g. `chat_template_kwargs` to
turn Qwen3 thinking off) go in the request body as vLLM's extensions.

Transport failures (connection errors, timeouts, HTTP 429 and 5xx) are retried
here, with exponential backoff, each failed try logged and returned with the
completion (`Completion.transport_errors`, written to the call log). A server
still unreachable after the retries, or still answering that it is shutting down,
is a dead engine (`EngineDead`: the run stops, exit 3, and resumes); another
429/5xx left after them is a failed attempt of that call. `probe` is the health check a run makes before any episode.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .base import Completion, ContextOverflow, EngineDead, Request
from .chat_format import THINKING_TEMPLATE_KEYS
from .grammar import adapt_schema

# How servers say the prompt + max_tokens does not fit (vLLM, OpenAI).
_OVERFLOW = re.compile(
    r"maximum context length|context_length_exceeded|context length|max_tokens.*too large"
    r"|too many tokens|exceeds the model",
    re.IGNORECASE,
)
_log = logging.getLogger(__name__)
BACKOFF_CAP_S = 60.0
# What vLLM's server answers (HTTP 500) to a new request while it stops: under `--shutdown-timeout` it
# drains the requests running and refuses the rest (measured on 0.32: "cannot schedule new futures after
# shutdown"), and an engine already gone is named as dead. Left after the retries, it is the server
# going away, not this request's fault: the engine-dead exit (the run resumes), never a failed attempt
# that would end the episode `invalid`.
_STOPPING = re.compile(r"after shutdown|shutting down|EngineDeadError|EngineCore encountered an issue", re.I)


class OpenAIEndpointConfig(BaseModel):
    """One model behind an OpenAI-compatible endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str  # our name for the model (logs, run records)
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    model: str  # the model name the server serves
    # Name of the environment variable holding the API key; None = no key
    # (local servers accept any placeholder).
    api_key_env: str | None = None
    timeout_s: float = Field(600.0, gt=0)
    # Retries of connection errors, timeouts, 429 and 5xx (by this engine, logged), the first after
    # backoff_s, each next one after twice as long (capped at BACKOFF_CAP_S).
    max_retries: int = Field(4, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    # Cap on requests in flight from this process (None = unlimited).
    max_concurrency: int | None = Field(None, ge=1)
    # vLLM extension: passed to the chat template, e.g. {"enable_thinking": False}.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Anything else for the request body (server-specific extensions).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    schema_name: str = "output"
    # Newer OpenAI models reject `max_tokens` and want `max_completion_tokens`.
    use_max_completion_tokens: bool = False
    # The server is `vllm serve`: send vLLM's request extensions (regex constraints).
    vllm_extensions: bool = False


# The endpoint settings taken as given, from the `engine=openai` group or a role's `endpoint`
# (the others, base_url and model, have their own fallbacks: bindings.Binding.endpoint_config).
ENDPOINT_SETTINGS: tuple[str, ...] = (
    "api_key_env",
    "timeout_s",
    "max_retries",
    "backoff_s",
    "max_concurrency",
    "schema_name",
    "use_max_completion_tokens",
    "extra_body",
    "vllm_extensions",
)


class OpenAIEngine:
    """Create with `await OpenAIEngine.start(cfg)` (checks that the endpoint serves the model)."""

    def __init__(self, cfg: OpenAIEndpointConfig) -> None:
        from openai import AsyncOpenAI

        if cfg.api_key_env is None:
            api_key = "EMPTY"
        else:
            api_key = os.environ.get(cfg.api_key_env, "")
            if not api_key:
                raise ValueError(
                    f"endpoint '{cfg.name}': environment variable {cfg.api_key_env} (api_key_env) is not set"
                )
        self.cfg = cfg
        self._client = AsyncOpenAI(base_url=cfg.base_url, api_key=api_key, timeout=cfg.timeout_s, max_retries=0)
        self._limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        self._closed = False

    @classmethod
    def from_config(cls, *, model: Any, engine: Any) -> OpenAIEngine:
        """From the run config: the role's model record and the `engine` group.

        The served model name is `engine.model` if given, else the model's
        name; the endpoint's settings (base_url, api_key_env, timeout_s,
        max_retries, max_concurrency, schema_name, use_max_completion_tokens,
        extra_body) come from the engine group; chat_template_kwargs from the
        model. No request is made here (see `start` for a checked start).
        """

        def get(obj: Any, key: str, default: Any = None) -> Any:
            if isinstance(obj, dict):
                return obj.get(key, default)
            return getattr(obj, key, default)

        fields: dict[str, Any] = {
            "name": get(model, "name"),
            "base_url": get(engine, "base_url"),
            "model": get(engine, "model") or get(model, "name"),
            "chat_template_kwargs": dict(get(model, "chat_template_kwargs") or {}),
        }
        if get(model, "thinking"):
            # The server's reasoning parser (vllm serve --reasoning-parser) splits the thought off;
            # the template's switch is turned on here, as the in-process engine does.
            fields["chat_template_kwargs"].update({key: True for key in THINKING_TEMPLATE_KEYS})
        for key in ENDPOINT_SETTINGS:
            value = get(engine, key)
            if value is not None:
                fields[key] = value
        return cls(OpenAIEndpointConfig(**fields))

    @classmethod
    async def start(cls, cfg: OpenAIEndpointConfig, *, check: bool = True) -> OpenAIEngine:
        import openai

        backend = cls(cfg)
        if check:
            try:
                served = [m.id async for m in backend._client.models.list()]
            except openai.APIConnectionError as e:
                await backend.close()
                raise EngineDead(f"endpoint '{cfg.name}' at {cfg.base_url} is not reachable: {e}") from e
            except openai.APIStatusError as e:  # e.g. 401: a wrong or missing API key
                await backend.close()
                raise ValueError(
                    f"endpoint '{cfg.name}' at {cfg.base_url} refused to list models "
                    f"(HTTP {e.status_code}): {e.message}"
                ) from e
            if cfg.model not in served:
                await backend.close()
                raise ValueError(
                    f"endpoint '{cfg.name}' at {cfg.base_url} does not serve model "
                    f"'{cfg.model}' (it serves: {', '.join(served) or 'nothing'})"
                )
        return backend

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.close()

    async def __aenter__(self) -> OpenAIEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _body(self, request: Request) -> dict[str, Any]:
        body: dict[str, Any] = dict(
            model=self.cfg.model,
            messages=[{"role": m.role, "content": m.content} for m in request.messages],
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            n=1,
        )
        if self.cfg.use_max_completion_tokens:
            body["max_completion_tokens"] = request.max_tokens
        else:
            body["max_tokens"] = request.max_tokens
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                # Free text without the non-blank pattern and minimum length (engines/grammar.py):
                # a vLLM server's xgrammar refuses the pattern (400) and writes no escape beside
                # either; the parser still holds every answer to the full schema.
                "json_schema": {
                    "name": self.cfg.schema_name,
                    "schema": adapt_schema(request.json_schema, "xgrammar"),
                    "strict": True,
                },
            }
        extra = dict(self.cfg.extra_body)
        if request.regex is not None and self.cfg.vllm_extensions:
            # vLLM's own request field; other servers have no plain-text constraint.
            extra["structured_outputs"] = {"regex": request.regex}
        if self.cfg.chat_template_kwargs:
            extra["chat_template_kwargs"] = dict(self.cfg.chat_template_kwargs)
        if extra:
            body["extra_body"] = extra
        return body

    async def _create(self, body: dict[str, Any]) -> Any:
        if self._limit is None:
            return await self._client.chat.completions.create(**body)
        async with self._limit:
            return await self._client.chat.completions.create(**body)

    async def generate(self, request: Request) -> Completion:
        import openai

        if self._closed:
            raise EngineDead(f"endpoint '{self.cfg.name}' is closed")
        body = self._body(request)
        started = time.monotonic()
        tries: list[str] = []  # transport failures retried, in order
        while True:
            try:
                resp = await self._create(body)
                break
            except openai.BadRequestError as e:
                if _OVERFLOW.search(str(e)):
                    raise ContextOverflow(f"endpoint '{self.cfg.name}': {e} (tags: {request.tags})") from e
                # This request's own fault (e.g. a schema the server's grammar
                # backend rejects): a failed attempt, not the end of the run.
                return self._failed(request, started, e, tries)
            except openai.UnprocessableEntityError as e:
                return self._failed(request, started, e, tries)
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
                # APITimeoutError is an APIConnectionError. A server that is starting, overloaded
                # or restarting answers again after a while: retried, each try counted and logged.
                what = _transport_error(e)
                if len(tries) < self.cfg.max_retries:
                    wait = min(self.cfg.backoff_s * 2 ** len(tries), BACKOFF_CAP_S)
                    tries.append(what)
                    _log.warning(
                        "endpoint '%s' at %s: %s; retry %d of %d in %.1f s (%s)",
                        self.cfg.name,
                        self.cfg.base_url,
                        what,
                        len(tries),
                        self.cfg.max_retries,
                        wait,
                        _tags(request),
                    )
                    await asyncio.sleep(wait)
                    continue
                tries.append(what)
                stopping = not isinstance(e, openai.APIConnectionError) and bool(_STOPPING.search(str(e)))
                if isinstance(e, openai.APIConnectionError) or stopping:
                    raise EngineDead(
                        f"endpoint '{self.cfg.name}' at {self.cfg.base_url} is "
                        f"{'stopping' if stopping else 'unreachable'} after {len(tries)} tries: {what}"
                    ) from e
                # Left after the retries; other requests may still be served.
                return self._failed(request, started, e, tries)

        if not resp.choices:
            return self._failed(request, started, RuntimeError("the response has no choices"), tries)
        choice = resp.choices[0]
        usage = resp.usage
        cached = 0
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens or 0
        sent = request.max_tokens
        if choice.finish_reason == "length" and usage is not None and usage.completion_tokens < request.max_tokens:
            # vLLM's server silently caps max_tokens at what is left of the
            # context window; a cut-off before the requested budget shows that
            # cap. Same contract as the in-process engine: too little room for
            # what the call needs is an overflow, else it was a clamped budget.
            sent = usage.completion_tokens
            need = max(1, min(request.max_tokens, request.min_room))
            if sent < need:
                raise ContextOverflow(
                    f"endpoint '{self.cfg.name}': prompt of {usage.prompt_tokens} tokens left room for "
                    f"only {usage.completion_tokens} of max_tokens {request.max_tokens}, below the {need} "
                    f"this call needs (tags: {request.tags})"
                )
        # A thinking model's thought, as vLLM's server returns it beside the answer.
        thought = getattr(choice.message, "reasoning_content", None) or getattr(choice.message, "reasoning", None)
        details = getattr(usage, "completion_tokens_details", None) if usage is not None else None
        return Completion(
            thought=thought,
            thought_tokens=int(getattr(details, "reasoning_tokens", 0) or 0) if thought else 0,
            text=choice.message.content or "",
            finish_reason=choice.finish_reason or "error",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_tokens=cached,
            generated_tokens=usage.completion_tokens if usage else 0,
            latency_s=time.monotonic() - started,
            max_tokens_sent=sent,
            transport_errors=tuple(tries),
        )

    def _failed(self, request: Request, started: float, exc: Exception, tries: list[str]) -> Completion:
        return Completion(
            text="",
            finish_reason="error",
            error=f"endpoint '{self.cfg.name}': {exc}",
            max_tokens_sent=request.max_tokens,
            latency_s=time.monotonic() - started,
            transport_errors=tuple(tries),
        )


def _transport_error(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"HTTP {status}: {text}" if status else f"{type(exc).__name__}: {text}"


def _tags(request: Request) -> str:
    t = request.tags
    return " ".join(f"{k}={t[k]}" for k in ("episode", "turn", "stage", "attempt") if k in t)


# ---- before a run: the endpoint file and the health check ------------------------------


class EndpointProblem(Exception):
    """The endpoint cannot serve this run (not answering, wrong model, window too small)."""


@dataclass(frozen=True)
class EndpointReport:
    """What a server said about itself: its `/v1/models` answer and its version (None if it has no /version)."""

    base_url: str
    models: tuple[dict[str, Any], ...]
    version: str | None

    def card(self, served: str) -> dict[str, Any] | None:
        return next((m for m in self.models if m.get("id") == served), None)

    def window(self, served: str) -> int | None:
        """The served model's context window, when the server reports one (vLLM's `max_model_len`)."""
        card = self.card(served) or {}
        value = card.get("max_model_len")
        return int(value) if isinstance(value, int) else None


def _root(base_url: str) -> str:
    """The server's root for /health and /version: the base URL without its trailing /v1."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _get_json(url: str, headers: dict[str, str], timeout_s: float) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        return json.loads(r.read().decode("utf-8"))


def probe(cfg: OpenAIEndpointConfig, timeout_s: float = 10.0) -> EndpointReport:
    """The server's `/v1/models` (it must serve `cfg.model`) and `/version`; EndpointProblem when not."""
    headers = {"Accept": "application/json"}
    if cfg.api_key_env:
        headers["Authorization"] = f"Bearer {os.environ.get(cfg.api_key_env, '')}"
    url = cfg.base_url.rstrip("/") + "/models"
    try:
        data = _get_json(url, headers, timeout_s)
        models = tuple(m for m in (data.get("data") or []) if isinstance(m, dict))
    except urllib.error.HTTPError as exc:
        raise EndpointProblem(f"{url} answered HTTP {exc.code}: {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EndpointProblem(f"{cfg.base_url} does not answer ({getattr(exc, 'reason', exc)})") from None
    except (ValueError, AttributeError) as exc:
        raise EndpointProblem(f"{url} is not an OpenAI model list ({exc})") from None
    try:
        version: str | None = str(_get_json(_root(cfg.base_url) + "/version", headers, timeout_s)["version"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        version = None  # a hosted API has no /version
    report = EndpointReport(cfg.base_url, models, version)
    if report.card(cfg.model) is None:
        served = ", ".join(str(m.get("id")) for m in models) or "nothing"
        raise EndpointProblem(f"{cfg.base_url} does not serve model '{cfg.model}' (it serves: {served})")
    return report


def read_endpoint_file(path: str | Path) -> str | None:
    """The base URL a server job wrote (one line, or JSON with `base_url`); None while there is none."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if text.startswith("{"):
        try:
            return str(json.loads(text)["base_url"])
        except (ValueError, KeyError, TypeError):
            return None
    return text or None


def wait_for_endpoint(
    file: str | Path | None, cfg: OpenAIEndpointConfig | None, wait_s: float, make: Any = None, poll_s: float = 2.0
) -> tuple[OpenAIEndpointConfig, EndpointReport]:
    """Wait (at most `wait_s`) for the endpoint file, when there is one, and a healthy server.

    `make(base_url)` builds the endpoint's settings once the URL is known. The last problem is raised
    (EndpointProblem) when the time is up; with `wait_s=0` the first one is.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if file is not None:
                url = read_endpoint_file(file)
                if url is None:
                    raise EndpointProblem(
                        f"endpoint file {file} is not there yet (the server job writes it once its /health answers)"
                    )
                cfg = make(url)
            assert cfg is not None
            return cfg, probe(cfg)
        except EndpointProblem as exc:
            if time.monotonic() + poll_s > deadline:
                waited = f" after waiting {wait_s:.0f} s" if wait_s else ""
                raise EndpointProblem(f"{exc}{waited}") from None
            time.sleep(poll_s)


async def start(model: Any, engine: Any, endpoint: OpenAIEndpointConfig) -> OpenAIEngine:
    """The registry's start (engines/registry.py): a client of the role's endpoint, as health-checked."""
    return OpenAIEngine(endpoint)
