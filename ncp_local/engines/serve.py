"""`vllm serve` for a model file: the command line and environment that make a served model run as
the rig's in-process engine would (the same engine arguments: dtype, window, prefix caching,
structured-output backend and whitespace, sampling defaults from the request only, the CPU build's
whole-prompt prefill), plus the server's own flags and, across nodes, vLLM's distributed ones.

Used by the engine tests' served model and by `slurm/serve.sbatch` (through `slurm/submit.py`).
Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cpu_binding import THREADS_BIND
from .settings import ModelSettings
from .vllm_args import plain_engine_kwargs
from .vllm_process import engine_env

# Engine arguments the server takes otherwise (or not at all): the model is positional, devices come
# from the job's allocation (CUDA_VISIBLE_DEVICES), the served name is set with the server's flags.
_NOT_FLAGS = ("model", "device_ids", "served_model_name")
# Settings passed only when they differ from vLLM's default: a model file's data_parallel_size of 1
# says nothing, and across nodes slurm/serve.sbatch gives the job's own (one flag, not two); a
# model's replicas inside one node (data_parallel_size > 1) still reach its server.
_DEFAULTS = {"data_parallel_size": 1}
# Switches vLLM leaves off unless given: only an explicit `true` is passed (remote code runs only when asked).
_OFF_BY_DEFAULT = ("trust_remote_code",)


def flag(key: str, value: Any) -> list[str]:
    """One engine argument as vLLM's command line takes it (booleans as --x / --no-x, mappings as JSON)."""
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [name if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value, sort_keys=True)]
    return [name, str(value)]


def serve_args(
    model: ModelSettings,
    model_path: str | Path,
    *,
    served_name: str | None = None,
    host: str = "0.0.0.0",
    port: int = 8000,
    on_cpu: bool = False,
    tensor_parallel: int | None = None,
    pipeline_parallel: int = 1,
) -> list[str]:
    """The arguments after `vllm serve`: the model, the rig's engine arguments for it (`tensor_parallel`:
    GPUs per node, default the model's own; `pipeline_parallel`: stages, one a node across nodes) and the
    server's flags. slurm/serve.sbatch adds where each part runs: vLLM's node rank flags, or Ray's backend,
    or data parallel's."""
    if pipeline_parallel > 1:
        model = model.model_copy(
            update={"engine_args": {**model.engine_args, "pipeline_parallel_size": pipeline_parallel}}
        )
    kwargs = plain_engine_kwargs(model, model_path, on_cpu)
    if tensor_parallel is not None:
        kwargs["tensor_parallel_size"] = tensor_parallel
    args = [str(model_path), "--served-model-name", served_name or model.name, "--host", host, "--port", str(port)]
    for key, value in kwargs.items():
        if (
            key in _NOT_FLAGS
            or value is None
            or (key in _OFF_BY_DEFAULT and value is False)
            or (key in _DEFAULTS and value == _DEFAULTS[key])
        ):
            continue
        args += flag(key, value)
    # The server reports cached prompt tokens (the call log's cache hit) and keeps its log to errors.
    args += ["--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    return args


def serve_env(model: ModelSettings, on_cpu: bool = False) -> dict[str, str]:
    """The environment the server needs beside its flags (as the in-process engine starts with), but for
    the CPU build's thread binding: that depends on the cores of the node that serves, unknown where the
    job is submitted, so the rig's entry into vLLM's serve makes it there (engines/vllm_serve.py)."""
    env = {k: v for k, v in engine_env(model, on_cpu).items() if k != THREADS_BIND}
    return {**env, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
