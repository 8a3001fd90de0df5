"""`vllm serve` for a model file: the command line and environment that make a served model run as
the rig's in-process engine would (the same engine arguments: dtype, window, prefix caching,
structured-output backend and whitespace, sampling defaults from the request only, the CPU build's
whole-prompt prefill), plus the server's own flags and, across nodes, vLLM's distributed ones.

Used by the engine tests' served model and by `slurm/serve.sbatch` (through `slurm/submit.py`).
Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .settings import ModelSettings
from .vllm import engine_env, plain_engine_kwargs

# Engine arguments the server takes otherwise (or not at all): the model is positional, devices come
# from the job's allocation (CUDA_VISIBLE_DEVICES), the served name is set with the server's flags.
_NOT_FLAGS = ("model", "device_ids", "served_model_name")


@dataclass(frozen=True)
class Layout:
    """How one served model spreads: tensor parallel inside a node, and across `nodes` either
    pipeline parallel over a Ray cluster or vLLM's own multi-node data parallel."""

    nodes: int = 1
    tensor_parallel: int = 1  # GPUs per node the model's layers are split over
    across: Literal["pipeline", "data"] = "pipeline"

    @property
    def gpus(self) -> int:
        return self.nodes * self.tensor_parallel


def flag(key: str, value: Any) -> list[str]:
    """One engine argument as vLLM's command line takes it (booleans as --x / --no-x, mappings as JSON)."""
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [name if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value, sort_keys=True)]
    return [name, str(value)]


def serve_args(model: ModelSettings, model_path: str | Path, *, served_name: str | None = None,
               host: str = "0.0.0.0", port: int = 8000, on_cpu: bool = False,
               layout: Layout = Layout()) -> list[str]:
    """The arguments after `vllm serve`: the model, the rig's engine arguments for it, the server's flags
    and the layout's parallel flags. With one node the model's own `tensor_parallel_size` is kept unless
    the layout sets more."""
    kwargs = plain_engine_kwargs(model, model_path, on_cpu)
    tp = layout.tensor_parallel if layout.tensor_parallel > 1 or layout.nodes > 1 else kwargs.get(
        "tensor_parallel_size", 1)
    kwargs["tensor_parallel_size"] = tp
    args = [str(model_path), "--served-model-name", served_name or model.name, "--host", host, "--port", str(port)]
    for key, value in kwargs.items():
        if key not in _NOT_FLAGS and value is not None:
            args += flag(key, value)
    if layout.nodes > 1 and layout.across == "pipeline":
        # Ray: the head runs on the first node, workers join from the others (slurm/serve.sbatch).
        args += ["--pipeline-parallel-size", str(layout.nodes), "--distributed-executor-backend", "ray"]
    elif layout.nodes > 1:
        args += ["--data-parallel-size", str(layout.nodes), "--data-parallel-size-local", "1"]
    # The server reports cached prompt tokens (the call log's cache hit) and keeps its log to errors.
    args += ["--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    return args


def data_parallel_args(rank: int, head: str, rpc_port: int) -> list[str]:
    """Multi-node data parallel: every node names the head's address and RPC port; a node past the
    first (`rank` > 0) serves no HTTP, it runs its engine for the head (`--headless`)."""
    own = ["--data-parallel-address", head, "--data-parallel-rpc-port", str(rpc_port)]
    return own if rank == 0 else [*own, "--headless", "--data-parallel-start-rank", str(rank)]


def serve_env(model: ModelSettings, on_cpu: bool = False) -> dict[str, str]:
    """The environment the server needs beside its flags (as the in-process engine starts with)."""
    return {**engine_env(model, on_cpu), "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
