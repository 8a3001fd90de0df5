"""`vllm serve` for a model file: the command line and environment that make a served model run as
the rig's in-process engine would (the same engine arguments: dtype, window, prefix caching,
structured-output backend and whitespace, sampling defaults from the request only, the CPU build's
whole-prompt prefill), plus the server's own flags and, across nodes, vLLM's distributed ones.

Used by the engine tests' served model and by `slurm/serve.sbatch` (through `slurm/submit.py`).
Nothing here imports vLLM.
"""

from __future__ import annotations

import importlib.util
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


# vLLM's graceful stop (`vllm serve --shutdown-timeout S`, in 0.32 and 0.33: VllmConfig.shutdown_timeout):
# on SIGTERM the engine stops taking new requests and finishes those running for up to S seconds, then
# aborts what is left; 0 (vLLM's default) aborts them at once. S stays inside the job's stop grace
# (slurm/serve.sbatch NCP_STOP_GRACE_S, 20 s) and Slurm's usual KillWait (30 s), with room for the
# engine's own teardown after it.
SHUTDOWN_FLAG = "--shutdown-timeout"
DRAIN_S = 12


def graceful_shutdown(vllm_root: Path | None = None) -> bool:
    """Whether the installed vLLM takes `--shutdown-timeout`: read from its argument parser's source
    (`vllm/engine/arg_utils.py`), not by importing vLLM (seconds, and a GPU library on a login node)."""
    if vllm_root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return False
        vllm_root = Path(next(iter(spec.submodule_search_locations)))
    try:
        source = (vllm_root / "engine" / "arg_utils.py").read_text(encoding="utf-8")
    except OSError:
        return False
    return f'"{SHUTDOWN_FLAG}"' in source


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
    drain_s: int | None = None,
) -> list[str]:
    """The arguments after `vllm serve`: the model, the rig's engine arguments for it (`tensor_parallel`:
    GPUs per node, default the model's own; `pipeline_parallel`: stages, one a node across nodes) and the
    server's flags. slurm/serve.sbatch adds where each part runs: vLLM's node rank flags, or Ray's backend,
    or data parallel's. `drain_s`: on SIGTERM, finish the requests in flight for up to that long
    (`--shutdown-timeout`; pass it only where `graceful_shutdown()` says the installed vLLM has it)."""
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
    if drain_s is not None:
        args += [SHUTDOWN_FLAG, str(drain_s)]
    return args


def serve_env(model: ModelSettings, on_cpu: bool = False) -> dict[str, str]:
    """The environment the server needs beside its flags (as the in-process engine starts with), but for
    the CPU build's thread binding: that depends on the cores of the node that serves, unknown where the
    job is submitted, so the rig's entry into vLLM's serve makes it there (engines/vllm_serve.py)."""
    env = {k: v for k, v in engine_env(model, on_cpu).items() if k != THREADS_BIND}
    return {**env, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
