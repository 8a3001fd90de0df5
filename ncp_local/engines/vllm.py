"""In-process vLLM engine (`AsyncLLM`) behind the `Engine` interface.

Every concurrent `generate` call becomes one engine request; the engine
batches whatever is in flight (continuous batching). Prompts are rendered
and tokenized here with the tokenizer vLLM itself uses for the model
(engines/chat_format.py), so the context guard is exact and the engine
receives token ids (nothing is tokenized twice).

vLLM's CPU build starts its engine core in a spawned process (a script that
starts an engine needs the `if __name__ == "__main__":` guard); on CUDA it forks
it. Either way each engine's processes are its own: the per-engine environment
is in place while they start and restored right after (engines/vllm_process.py),
and the watchdog's pipe is closed in forked children (engines/watchdog.py), so
closing one engine leaves the others untouched. The engine's arguments are
built in engines/vllm_args.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import watchdog
from .base import Completion, ContextOverflow, EngineDead, Message, Request
from .chat_format import ChatFormat, NoChatTemplate
from .grammar import adapt_schema
from .settings import ModelSettings, max_num_seqs_note
from .vllm_args import build_engine_args, engine_config, resolved_path, running_on_cpu
from .vllm_process import START_LOCK, engine_core_processes, engine_env, engine_environ, engine_processes

if TYPE_CHECKING:  # imported where used: vllm is optional, and vllm_process sets the environment first
    from vllm.sampling_params import SamplingParams


def _already_shut_down(*args: Any, **kwargs: Any) -> None:
    return None


class VLLMEngine:
    """A running in-process vLLM engine. Create with `await VLLMEngine.start(cfg)`."""

    def __init__(
        self, cfg: ModelSettings, engine: Any, chat: ChatFormat, model_path: Path, start_seconds: float
    ) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.start_seconds = start_seconds
        self._engine = engine
        self.chat = chat
        # What the engine actually runs with (the guard must match it exactly).
        self.max_model_len: int = engine.model_config.max_model_len
        self._watchdog: watchdog.Watchdog | None = None
        # What the engine runs with that differs from the model's settings, one
        # line each, for the run to print: max_num_seqs capped under deterministic.
        self.notes: tuple[str, ...] = tuple(n for n in (max_num_seqs_note(cfg),) if n)
        # Environment variables that this engine's start changed and that were
        # put back before the next engine (`engine_environ`).
        self.env_restored: tuple[str, ...] = ()
        # Prompt rendering + tokenization off the event loop (long prompts take
        # tens of ms); the lock keeps the tokenizer to one thread at a time
        # (count_tokens may be called from any thread).
        self._tok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tok-{cfg.name}")
        self._tok_lock = threading.RLock()
        self._closed = False
        # The grammars sent so far (`grammar_key`): vLLM compiles a grammar the first time it
        # sees it and serves it from its cache after, so a call's `grammar_new` says whether
        # its latency holds a compile (the measure of issue 26: outlines compiles per schema).
        self._grammars: set[str] = set()

    # ---- lifecycle -------------------------------------------------------

    @classmethod
    async def start(cls, cfg: ModelSettings) -> VLLMEngine:
        """Start the engine (about 20-30 s for the embedded model on 2 CPU cores).

        The blocking work (model conversion on first use, imports, spawning
        the engine, loading weights) runs in a worker thread, so an event loop
        that already serves another engine keeps going.
        """
        backend = await asyncio.to_thread(cls._start_blocking, cfg)
        try:
            backend._watchdog = watchdog.start(engine_processes(backend._engine))
        except Exception:
            await backend.close()
            raise
        return backend

    @classmethod
    async def from_model_config(cls, model: Any) -> VLLMEngine:
        """Start an engine from the run config's model record (see `engine_config`)."""
        return await cls.start(engine_config(model))

    @classmethod
    def _start_blocking(cls, cfg: ModelSettings) -> VLLMEngine:
        model_path = resolved_path(cfg)
        from vllm.v1.engine.async_llm import AsyncLLM

        # Before the weights load: a model vLLM could not render a chat for fails here.
        try:
            chat = ChatFormat.load(model_path, cfg)
        except NoChatTemplate as exc:
            raise ValueError(f"model '{cfg.name}' at {model_path} {exc}") from None
        on_cpu = running_on_cpu()
        args = build_engine_args(cfg, model_path, on_cpu=on_cpu)
        started = time.monotonic()
        with START_LOCK, engine_environ(engine_env(cfg, on_cpu)) as restored:
            # Builds the engine config (which reads the environment and writes
            # into it), starts the engine processes (which inherit it), loads
            # the weights, profiles memory.
            engine = AsyncLLM.from_engine_args(args)
        # From here on prompts go through the engine's own renderer (vLLM's chat path).
        if getattr(engine, "renderer", None) is not None:
            chat = ChatFormat.of_engine(engine, cfg)
        backend = cls(cfg, engine, chat, model_path, time.monotonic() - started)
        backend.env_restored = tuple(restored)
        return backend

    async def close(self) -> None:
        """Shut the engine down and wait for its processes to exit. Idempotent."""
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        if engine is not None:
            cores = engine_core_processes(engine)
            engine.shutdown()
            # vLLM force-kills an engine core that is slow to exit but does not
            # reap it; join to leave no zombie behind.
            for proc in cores:
                proc.join(timeout=1)
            # AsyncLLM.__del__ calls shutdown() again; if the object lives until
            # interpreter teardown (a traceback holding it is enough) that second
            # call fails on half-torn-down modules and prints a TypeError.
            engine.shutdown = _already_shut_down
        self._tok_pool.shutdown(wait=False, cancel_futures=True)
        wd, self._watchdog = self._watchdog, None
        if wd is not None:
            # `stop` tells it the engine is closed (EOF alone is not enough: it
            # needs every copy of the write end closed); it reaps anything left over.
            await asyncio.to_thread(wd.stop, 30)

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (benchmarks: no way inherits another's cache)."""
        if self._engine is not None:
            await self._engine.reset_prefix_cache()

    def _engine_setting(self, section: str, name: str) -> int | None:
        """A numeric setting the running engine resolved (None if closed or not there)."""
        try:
            return int(getattr(getattr(self._engine.vllm_config, section), name))
        except (AttributeError, TypeError):
            return None

    @property
    def block_size(self) -> int | None:
        """KV cache block size: prefix-cache hits come in whole blocks of this many tokens."""
        return self._engine_setting("cache_config", "block_size")

    @property
    def kv_tokens(self) -> int | None:
        """Tokens the engine's KV cache holds (its blocks x block size, as vLLM resolved them at start):
        what the scheduler admits episodes against (execution/admission.py)."""
        blocks, size = self._engine_setting("cache_config", "num_gpu_blocks"), self.block_size
        return blocks * size if blocks and size else None

    @property
    def max_num_seqs(self) -> int | None:
        """How many sequences the engine runs at once (the rest wait in its queue)."""
        return self._engine_setting("scheduler_config", "max_num_seqs")

    @property
    def watchdog_pid(self) -> int | None:
        """The pid of this engine's watchdog (None when closed), for leak checks."""
        return self._watchdog.pid if self._watchdog is not None else None

    @property
    def engine_pids(self) -> list[int]:
        """Pids of the engine's processes (engine core and workers), for leak checks."""
        return [p.pid for p in engine_processes(self._engine)] if self._engine is not None else []

    # ---- prompts ---------------------------------------------------------

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text, with the generation prompt (engines/chat_format.py)."""
        with self._tok_lock:
            return self.chat.render(messages)

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        """The token ids the engine is sent for these messages."""
        with self._tok_lock:
            return self.chat.tokenize(messages)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Prompt tokens the engine would see for these messages."""
        return len(self.tokenize(messages))

    # ---- generation ------------------------------------------------------

    def output_budget(self, prompt_tokens: int, request: Request) -> int:
        """The max_tokens to send: the request's (plus the thinking budget of a thinking
        model), clamped to the room the prompt leaves in the window. ContextOverflow when
        that room is below what the call needs (min(max_tokens, min_room), plus the budget)."""
        return output_budget(self.cfg, self.max_model_len, prompt_tokens, request)

    async def generate(self, request: Request) -> Completion:
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        engine = self._engine
        if engine is None:
            raise EngineDead(f"engine '{self.cfg.name}' is closed")
        if engine.errored:
            raise EngineDead(f"engine '{self.cfg.name}' is dead: {engine.dead_error!r}")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")

        started = time.monotonic()
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(self._tok_pool, self.tokenize, request.messages)
        budget = self.output_budget(len(ids), request)

        def failed(message: str) -> Completion:
            # One request's failure: the caller counts a failed attempt, the run goes on.
            return Completion(
                text="",
                finish_reason="error",
                prompt_tokens=len(ids),
                error=message,
                max_tokens_sent=budget,
                latency_s=time.monotonic() - started,
            )

        request_id = f"{self.cfg.name}-{uuid.uuid4().hex}"
        final = None
        grammar_new: bool | None = None
        # The engine's reasoning parser reads the template switch per request, as vLLM's server passes it.
        thinking = (
            {"reasoning_parser_kwargs": {"chat_template_kwargs": dict(self.chat.kwargs)}} if self.cfg.thinking else {}
        )
        try:
            params = sampling_params(
                request,
                budget,
                self.cfg.structured_outputs_backend,
                thinking_budget=self.cfg.thinking_budget if self.cfg.thinking else None,
            )
            grammar = grammar_key(params)
            grammar_new = None if grammar is None else grammar not in self._grammars
            if grammar is not None:
                self._grammars.add(grammar)
            async for out in engine.generate(tokens_input(ids), params, request_id, **thinking):
                final = out
        except asyncio.CancelledError:
            raise
        except EngineDeadError as e:
            raise EngineDead(f"engine '{self.cfg.name}' died: {e}") from e
        except Exception as e:
            # vLLM 0.33 raises a request's own failures from generate() (a
            # grammar that does not compile, a paused engine, a request that
            # fails validation) where 0.32 finished it with "error". Only an
            # engine that is gone ends the run.
            if engine.errored:
                raise EngineDead(f"engine '{self.cfg.name}' died: {e!r}") from e
            return dataclasses.replace(failed(_error_text(e)), grammar_new=grammar_new)
        if final is None or not final.outputs:
            return failed(f"engine '{self.cfg.name}' returned no output for {request_id}")

        choice = final.outputs[0]
        finish = choice.finish_reason or "error"
        error = None
        if finish == "error":
            error = f"engine finished the request with an error (stop_reason={choice.stop_reason!r})"
        text, thought, thought_tokens = choice.text, None, 0
        if self.cfg.thinking:
            split = split_thought(self.cfg, self.chat, choice.text, list(choice.token_ids))
            text, thought, thought_tokens = split.answer, split.thought, split.thought_tokens
        return Completion(
            text=text,
            thought=thought,
            thought_tokens=thought_tokens,
            finish_reason=finish,
            prompt_tokens=len(final.prompt_token_ids or ids),
            cached_tokens=final.num_cached_tokens or 0,
            generated_tokens=len(choice.token_ids),
            latency_s=time.monotonic() - started,
            error=error,
            max_tokens_sent=budget,
            grammar_new=grammar_new,
        )


def grammar_key(params: Any) -> str | None:
    """The constraint of a request as vLLM keys its compiled grammars (the JSON schema's text, or
    the regex), or None when the request is unconstrained."""
    structured = params.structured_outputs
    if structured is None:
        return None
    if structured.json is not None:
        return "json:" + json.dumps(structured.json)
    return f"regex:{structured.regex}"


def output_budget(cfg: ModelSettings, max_model_len: int, prompt_tokens: int, request: Request) -> int:
    """The max_tokens a request is sent with: its own, plus the thinking budget when the model
    thinks (the thought comes out of the same max_tokens), clamped to the window's room.
    ContextOverflow when the room is below what the call needs: its answer's minimum room,
    plus the thinking budget."""
    thinking = cfg.thinking_budget if cfg.thinking else 0
    room = max_model_len - prompt_tokens
    need = max(1, min(request.max_tokens, request.min_room)) + thinking
    if room < need:
        spent = f" ({thinking} of them for thinking)" if thinking else ""
        raise ContextOverflow(
            f"model '{cfg.name}': prompt of {prompt_tokens} tokens leaves {max(room, 0)} of "
            f"max_model_len {max_model_len} for output, below the {need}{spent} this call needs "
            f"(tags: {request.tags})"
        )
    return min(request.max_tokens + thinking, room)


@dataclasses.dataclass(frozen=True)
class Thought:
    answer: str
    thought: str | None
    thought_tokens: int


def split_thought(cfg: ModelSettings, chat: ChatFormat, text: str, token_ids: Sequence[int]) -> Thought:
    """A thinking model's output split by vLLM's own reasoning parser for the family.

    In-process there is no serving layer to do it: the parser class the server would use is
    run on the finished text, with the same template switch the prompt rendered with. No
    thought found: the whole text is the answer.
    """
    from vllm.reasoning import ReasoningParserManager

    parser = ReasoningParserManager.get_reasoning_parser(cfg.reasoning_parser)(
        chat.tokenizer, chat_template_kwargs=dict(chat.kwargs)
    )
    thought, answer = parser.extract_reasoning(text, None)
    if not thought:
        return Thought(answer=text if answer is None else answer, thought=None, thought_tokens=0)
    # Parsers that cannot count report 0: count the thought's own text then.
    tokens = parser.count_reasoning_tokens(token_ids) or chat.count_text(thought)
    return Thought(answer=answer or "", thought=thought, thought_tokens=tokens)


def sampling_params(
    request: Request, max_tokens: int | None = None, backend: str = "xgrammar", thinking_budget: int | None = None
) -> SamplingParams:
    """vLLM's SamplingParams for one request (max_tokens: the clamped budget, else the request's;
    thinking_budget: vLLM's thinking_token_budget, for a thinking model).

    The constraint is adapted to the engine's structured-output backend
    (engines/grammar.py); what the adaptation drops is checked after parsing.
    """
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    structured = None
    if request.json_schema is not None:
        structured = StructuredOutputsParams(json=adapt_schema(request.json_schema, backend))
    elif request.regex is not None:
        structured = StructuredOutputsParams(regex=request.regex)
    # A fresh object per request, seeded by the request itself.
    return SamplingParams(
        temperature=request.temperature,
        top_p=request.top_p,
        max_tokens=request.max_tokens if max_tokens is None else max_tokens,
        seed=request.seed,
        structured_outputs=structured,
        output_kind=RequestOutputKind.FINAL_ONLY,
        **({} if thinking_budget is None else {"thinking_token_budget": thinking_budget}),
    )


def _error_text(exc: BaseException) -> str:
    """The engine's own message, through wrappers that carry none (EngineGenerateError)."""
    parts: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).strip()
        parts.append(f"{type(e).__name__}: {text}" if text else type(e).__name__)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return " <- ".join(parts)[:2000]


async def start(model: ModelSettings, engine: Any, endpoint: Any) -> VLLMEngine:
    """The registry's start (engines/registry.py): an in-process engine for the model record."""
    return await VLLMEngine.from_model_config(model)
