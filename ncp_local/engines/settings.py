"""What an engine needs to know about its model: the one schema `conf/model/*.yaml`,
the engines and `mode=plan` read.

Plain settings, owned by the engine layer: the config nests them under each
role, and nothing here knows a role, a stage or a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# `path` value that means: the embedded SmolLM2 model (engines/embedded.py).
EMBEDDED = "embedded"
# vLLM's per-step token budget on GPU when `engine_args` leaves `max_num_batched_tokens` unset: its
# own default for AsyncLLM is 2048, and this workload is long prefills (a prompt is 5-36k tokens),
# so a larger step feeds the GPU in fewer chunks. The engine starts with it and the plan sizes
# sliding-window KV and activations by it.
GPU_STEP_TOKENS = 16384


class ModelSettings(BaseModel):
    """One model and how its engine runs: the one schema `conf/model/*.yaml`,
    the engines and `mode=plan` read. Unknown keys are an error (a typo
    must not pass silently); vLLM settings the rig does not read itself go in
    `engine_args`, checked against vLLM's own engine arguments before start."""

    # Unknown keys are refused and values strict (`max_num_seqs=true` is not 1), as in the whole config.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    # A local model directory, or "embedded" for the converted SmolLM2 wheel model.
    path: str
    revision: str | None = None  # the HF commit downloaded; recorded in the manifest, not sent to vLLM
    dtype: str = "auto"
    # The window the rig guards and the engine runs with.
    max_model_len: int = Field(8192, gt=0)
    # On GPU, the share of GPU memory for weights + KV cache. On CPU, the share
    # of RAM (per NUMA node) reserved for the KV cache (0.3 works here; 0.92 fails).
    # None: planned (ncp_local/plan): engines sharing a GPU get shares that fit together.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    # An explicit KV cache size; overrides the share above.
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    # Replicas of the model inside the one engine (vLLM's data_parallel_size: AsyncLLM starts one engine
    # core per replica and spreads the requests over them), each on tensor_parallel_size GPUs of the node.
    data_parallel_size: int = Field(1, ge=1)
    # MoE layers split by expert over the tensor_parallel_size x data_parallel_size GPUs instead of
    # slicing every expert (vLLM's enable_expert_parallel); attention stays tensor parallel.
    enable_expert_parallel: bool = False
    # Indices into the visible GPUs (vLLM's device_ids: under Slurm, into its
    # CUDA_VISIBLE_DEVICES allocation), tensor_parallel_size x data_parallel_size of them, replica r
    # on the r-th run of tensor_parallel_size; [] = the first ones visible.
    devices: list[int] = []
    # Passed to the chat template; `thinking` below sets the family's thinking switch in it.
    chat_template_kwargs: dict[str, Any] = {}
    # Load the tokenizer (and model) code the checkpoint ships, as vLLM's trust_remote_code.
    # Off unless a model file says so: it runs code from the model folder.
    trust_remote_code: bool = False
    # The model thinks before it answers. The template's thinking switch follows it; vLLM's
    # `reasoning_parser` separates the thought, and the grammar applies only to the answer after it.
    thinking: bool = False
    # vLLM's reasoning-parser name for the family (qwen3, deepseek_v3, kimi_k2, ...); needed when thinking.
    reasoning_parser: str | None = None
    # Tokens a thought may take (vLLM's thinking_token_budget ends it there). The output reservation of
    # every call of a thinking model is its stage's answer plus this.
    thinking_budget: int = Field(4096, ge=1)
    structured_outputs_backend: Literal["xgrammar", "guidance", "outlines"] = "xgrammar"
    enforce_eager: bool = False
    max_num_seqs: int = Field(64, ge=1)
    # CPU build only: cores vLLM keeps free of model threads (VLLM_CPU_NUM_OF_RESERVED_CPU);
    # None = vLLM's choice (1 here, leaving the model one of 2 cores).
    cpu_reserved_cores: int | None = Field(None, ge=0)
    seed: int = 0  # the engine's own seed; every request carries its own
    # GPU engines: VLLM_BATCH_INVARIANT=1 (results independent of batch
    # composition, slower). `engine.deterministic=true` sets it for every model.
    deterministic: bool = False
    # Any other vLLM engine argument (AsyncEngineArgs field), e.g. hf_overrides,
    # quantization, kv_cache_dtype, language_model_only, max_num_batched_tokens.
    engine_args: dict[str, Any] = {}

    @field_validator("devices")
    @classmethod
    def _devices_fit_tensor_parallel(cls, v: list[int], info: ValidationInfo) -> list[int]:
        if len(set(v)) != len(v) or any(d < 0 for d in v):
            raise ValueError(f"devices must be distinct non-negative indices into the visible GPUs, got {v}")
        # tensor_parallel_size and data_parallel_size are declared above devices, so they are validated
        # (and here) first.
        tp, dp = info.data.get("tensor_parallel_size"), info.data.get("data_parallel_size", 1)
        if v and tp is not None and dp is not None and len(v) != tp * dp:
            layout = f"tensor_parallel_size={tp}" + (f" x data_parallel_size={dp}" if dp > 1 else "")
            raise ValueError(
                f"{len(v)} device(s) {v} for {layout}: give exactly {tp * dp} "
                "(or devices=[] for the first visible ones)"
            )
        return v

    @property
    def gpus(self) -> int:
        """The GPUs this model's engine takes: tensor parallel x data parallel."""
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def engine_key(self) -> str:
        """Models with equal settings (the name aside) run on one engine."""
        return json.dumps(self.model_dump(exclude={"name"}), sort_keys=True)


def share_engines(models: Mapping[str, ModelSettings]) -> dict[str, tuple[ModelSettings, tuple[str, ...]]]:
    """Group the users of models (e.g. roles) by engine: key -> (the first user's model, its users)."""
    groups: dict[str, tuple[ModelSettings, tuple[str, ...]]] = {}
    for user, model in models.items():
        first, users = groups.get(model.engine_key, (model, ()))
        groups[model.engine_key] = (first, (*users, user))
    return groups


# Under `deterministic` an engine runs at most this many sequences at once.
# Batch invariance (VLLM_BATCH_INVARIANT=1) is meant to make a request's tokens
# independent of its batch neighbours, but vLLM users report batch-invariant runs
# that still differ at about 44 sequences in flight and agree again with fewer
# (issue 22). 32 keeps a margin below that; the rest of the episodes wait in the
# engine's queue, which costs throughput, not results. A smaller `max_num_seqs`
# is kept as set. `scripts/gpu_acceptance.sh` checks the result at the run's
# own concurrency on the GPU at hand.
DETERMINISTIC_MAX_NUM_SEQS = 32


def engine_max_num_seqs(model: ModelSettings) -> int:
    """The max_num_seqs the engine runs with: the model's, capped under `deterministic`.

    `model` is the record the engine starts with (the run-wide
    `engine.deterministic` already applied, as execution/engine_pool does).
    """
    if model.deterministic:
        return min(model.max_num_seqs, DETERMINISTIC_MAX_NUM_SEQS)
    return model.max_num_seqs


def max_num_seqs_note(model: ModelSettings) -> str | None:
    """One line saying the cap lowered this model's max_num_seqs, or None when it did not."""
    capped = engine_max_num_seqs(model)
    if capped == model.max_num_seqs:
        return None
    return (
        f"model '{model.name}': max_num_seqs {model.max_num_seqs} -> {capped} under deterministic=true "
        f"(batch-invariant runs are reported to differ at about 44 sequences in flight; "
        f"at most {DETERMINISTIC_MAX_NUM_SEQS} run at once, the rest wait)"
    )


def with_run_switches(model: ModelSettings, deterministic: bool) -> ModelSettings:
    """The record an engine starts with: the run-wide `engine.deterministic` applied to the model's own."""
    if deterministic and not model.deterministic:
        return model.model_copy(update={"deterministic": True})
    return model
