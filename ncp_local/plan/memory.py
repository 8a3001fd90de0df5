"""Engines on devices: which GPUs each engine gets, its memory share, its KV cache.

vLLM's `gpu_memory_utilization` is the fraction of each of its GPUs an
engine may take, and in 0.33 everything the engine allocates counts inside
it: weights, the activation peak of a profiling step of
`max_num_batched_tokens` tokens, CUDA graphs (the profiler's graph estimate,
`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`, on by default, comes out of the
KV cache: `vllm/v1/worker/gpu_worker.py`), NCCL and attention buffers, then
the KV cache. Only each process's CUDA context lives outside. An engine
refuses to start when less than its share is free, or when its KV cache
cannot hold one request of `max_model_len` tokens (plan/kv.py). Engines that
share a GPU must therefore get shares that add up to less than the whole:
the plan gives each its weights, `plan.overhead_gib` and the same number of
`max_model_len` requests of KV cache (the number the most crowded GPU
allows), unless the user set the share. When even one request each does not
fit, the plan says what to change, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..bindings import Bindings
from ..config import PlanCfg, RunConfig
from ..engines.settings import max_num_seqs_note
from .checkpoint import model_facts
from .facts import DTYPE_BYTES, ModelFacts, dtype_bytes
from .hardware import GIB, Inventory
from .kv import (
    DEFAULT_BLOCK_SIZE,
    KvSizing,
    kv_heads_per_device,
    step_tokens,
    steps_in_flight,
)


@dataclass(frozen=True)
class Problem:
    """Something that stops the plan (fatal) or that the user should know (a note)."""

    field: str
    message: str
    fatal: bool = True


@dataclass
class EnginePlan:
    index: int
    roles: tuple[str, ...]
    model: Any  # the ModelSettings of these roles
    facts: ModelFacts | None
    tp: int
    dp: int = 1  # replicas inside the engine (data_parallel_size), each on `tp` GPUs of its own
    reserved: int = 0  # the largest max_tokens among its roles: the window must hold more
    devices: tuple[int, ...] = ()
    devices_planned: bool = False
    share: float | None = None
    share_planned: bool = False
    weights_bytes: int = 0  # in memory, the whole model
    expert_bytes: int = 0  # of weights_bytes, the routed experts' (sharded over every GPU of the engine)
    compute_bytes: int = 2
    kv_dtype_bytes: int = 2
    kv_state_bytes: int | None = None  # a packed MLA cache layout (fp8_ds_mla), bytes per token and layer
    kv: KvSizing | None = None  # the KV cache layout per device, by vLLM's rules
    kv_bytes: int = 0  # the KV cache, per device (per process on a CPU)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.model.name)

    @property
    def path(self) -> str:
        """The config path of this engine's model, through its first role (what an error names)."""
        return f"{self.roles[0]}.model"

    @property
    def label(self) -> str:
        return f"{'/'.join(self.roles)} {self.name}"

    @property
    def window(self) -> int:
        return int(self.model.max_model_len)

    def engine_arg(self, key: str, default: Any = None) -> Any:
        args = getattr(self.model, "engine_args", None) or {}
        return args.get(key, getattr(self.model, key, default))

    def setting(self, key: str, value: Any, new_key: bool = False) -> str:
        """The override(s) that change `key` for this engine: for every role it serves, so the roles keep
        sharing one engine (`new_key`: a key the model file lacks, e.g. in engine_args, takes Hydra's `+`)."""
        plus = "+" if new_key else ""
        return " ".join(f"{plus}{role}.model.{key}={value}" for role in self.roles)

    @property
    def gpus(self) -> int:
        """The GPUs the engine takes: tensor parallel x data parallel."""
        return self.tp * self.dp

    def weights_at(self, tp: int) -> int:
        """Weights on each GPU at tensor parallel `tp`: the routed experts over every GPU of the engine
        (tensor x data parallel), the rest over tensor parallel (each replica holds it)."""
        experts = min(self.expert_bytes, self.weights_bytes)
        return (self.weights_bytes - experts) // tp + experts // (tp * self.dp)

    def device_weights(self, overhead: int) -> int:
        return self.weights_at(self.tp) + overhead

    def total_weights(self) -> int:
        """Weights over all the engine's GPUs: every replica's dense weights, the experts once."""
        experts = min(self.expert_bytes, self.weights_bytes)
        return (self.weights_bytes - experts) * self.dp + experts

    def window_kv(self) -> int:
        """KV bytes per device vLLM must find to start: one `max_model_len` request and its null block."""
        return self.kv.startup_bytes() if self.kv else 0

    def request_kv(self) -> int:
        """KV bytes per device of one `max_model_len` request (the figure in vLLM's start-up error)."""
        return self.kv.request_bytes() if self.kv else 0

    def device_need(self, overhead: int) -> int:
        """The least memory per device this engine starts with: weights, overhead and one request."""
        explicit = self.engine_arg("kv_cache_memory_bytes")
        return self.device_weights(overhead) + max(int(explicit or 0), self.window_kv())

    def sequences_at(self, tokens: int) -> float:
        """How many sequences of `tokens` the KV cache holds at once."""
        if self.kv is None or tokens <= 0:
            return 0.0
        usable = max(0, self.kv_bytes - self.kv.block_bytes())
        return self.dp * usable / self.kv.held_bytes(min(tokens, self.window))

    def windows(self) -> float:
        """`max_model_len` requests at once (vLLM's "Maximum concurrency"), over all replicas."""
        return self.dp * self.kv.max_concurrency(self.kv_bytes) if self.kv else 0.0

    def capacity_tokens(self) -> int:
        """vLLM's "KV cache size: N tokens" (each replica logs its own; here their sum)."""
        return self.dp * self.kv.capacity_tokens(self.kv_bytes) if self.kv else 0


def share_is_planned(value: Any) -> bool:
    """`null` or `auto` in a model file: the plan sets the share; a number is the user's."""
    return value is None or (isinstance(value, str) and value.strip().lower() == "auto")


def engines_of(bindings: Bindings, roles: tuple[str, ...]) -> list[EnginePlan]:
    """One engine per distinct model of the in-process `roles`, as the engine pool groups them
    (`Bindings.groups`)."""
    plans = []
    for i, group in enumerate(bindings.groups(roles)):
        model, users = group.model, group.roles
        # What the engine will run with: under deterministic=true its max_num_seqs is capped (engines/settings).
        note = max_num_seqs_note(bindings.started_model(model))
        plans.append(
            EnginePlan(
                index=i,
                roles=users,
                model=model,
                facts=None,
                tp=int(getattr(model, "tensor_parallel_size", 1) or 1),
                dp=int(getattr(model, "data_parallel_size", 1) or 1),
                reserved=max(bindings[r].sampling.max_tokens for r in users),
                notes=[note] if note else [],
            )
        )
    return plans


# kv_cache_dtype values whose scales or packing vLLM adds to the page: sized here at one byte an element.
_KV_FORMATS_NOT_MODELLED = ("per_token_head", "nvfp4", "turboquant", "octave", "ultraquant", "_ds_mla")


def read_facts(
    engines: list[EnginePlan], problems: list[Problem], on_disk_only: bool = False, on_gpu: bool = True
) -> None:
    """Each engine's model facts; `on_disk_only` (mode=run) leaves out models whose weights are not there,
    since the run's own path check refuses them first, with the plainer message."""
    for e in engines:
        try:
            e.facts = model_facts(e.name, str(e.model.path))
        except ValueError as exc:
            problems.append(Problem(f"{e.path}.path", str(exc)))
            continue
        if on_disk_only and e.facts is not None and not e.facts.on_disk:
            e.facts = None
            continue
        if e.facts is None:
            # The run's own path check names the missing directory; the plan can only say what it lacks.
            problems.append(
                Problem(
                    f"{e.path}.path",
                    f"{e.label}: no config.json at {e.model.path} and no built-in "
                    "facts for this model: its memory is not planned",
                    fatal=False,
                )
            )
            continue
        e.compute_bytes = dtype_bytes(str(getattr(e.model, "dtype", "auto")), e.facts)
        e.weights_bytes = loaded_weights(e, e.facts)
        # Scaled as the weights are (a bf16 checkpoint run in float32 doubles both).
        e.expert_bytes = int(e.facts.expert_bytes * e.weights_bytes / max(e.facts.loaded_bytes, 1))
        kv = str(e.engine_arg("kv_cache_dtype", "auto") or "auto").lower()
        e.kv_dtype_bytes = e.compute_bytes if kv == "auto" else DTYPE_BYTES.get(kv, 1 if kv.startswith("fp8") else 2)
        e.kv_state_bytes = mla_state_bytes(kv, e.facts)
        if e.kv_state_bytes is None and any(k in kv for k in _KV_FORMATS_NOT_MODELLED):
            e.notes.append(
                f"kv_cache_dtype={kv}: sized at one byte an element; its scales and packing are not modelled"
            )
            e.kv_dtype_bytes = 1
        e.kv = sizing(e, e.facts, on_gpu)


def loaded_weights(e: EnginePlan, f: ModelFacts) -> int:
    """The weights the engine holds in all: a quantized checkpoint as stored (vLLM keeps FP8 and INT4
    weights as they are), else its parameters at the engine's dtype; MTP layers left out (not loaded
    without speculative decoding)."""
    if f.mtp_bytes:
        e.notes.append(
            f"{f.mtp_layers} multi-token-prediction layer(s) in the checkpoint, "
            f"{gib(f.mtp_bytes)} (estimated), not loaded: vLLM loads them only for speculative "
            "decoding, which the rig does not turn on"
        )
    if f.quantization:
        return f.loaded_bytes
    if e.engine_arg("quantization"):
        # Quantized on load: the checkpoint's size is the honest upper bound we know.
        e.notes.append(f"quantization={e.engine_arg('quantization')}: weights counted at checkpoint size")
        return f.loaded_bytes
    return int(f.loaded_bytes / f.stored_dtype_bytes * e.compute_bytes)


# 0.33 `MLAAttention.get_kv_cache_spec` `state_content_bytes`: packed MLA layouts, bytes per token and layer.
DS_MLA_STATE_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


def mla_state_bytes(kv_cache_dtype: str, f: ModelFacts) -> int | None:
    """The packed per-token size of an MLA layer's cache, when the cache dtype packs it; None otherwise.

    DeepSeek-V3.2 runs sparse MLA (FlashMLA sparse on Hopper), which serves any other fp8 cache dtype
    as `fp8_ds_mla` (0.33 `_canonicalize_sparse_mla_kv_cache_dtype`); dense MLA (Kimi-K2.5) keeps fp8 at
    one byte an element."""
    if not f.latent_dim:
        return None
    if kv_cache_dtype in DS_MLA_STATE_BYTES:
        return DS_MLA_STATE_BYTES[kv_cache_dtype]
    if f.indexer_bytes and kv_cache_dtype.startswith("fp8"):
        return DS_MLA_STATE_BYTES["fp8_ds_mla"]
    return None


def sizing(e: EnginePlan, f: ModelFacts, on_gpu: bool) -> KvSizing:
    """The engine's KV layout per device as vLLM will build it from its settings."""
    args = getattr(e.model, "engine_args", None) or {}
    # Without the hybrid KV cache manager vLLM treats sliding-window layers as full attention
    # (0.33 `unify_hybrid_kv_cache_specs`); it is on by default on CUDA and CPU.
    hybrid = not args.get("disable_hybrid_kv_cache_manager")
    sliding = f.sliding_layers if (f.sliding_window and hybrid) else 0
    return KvSizing(
        full_layers=f.layers - sliding,
        sliding_layers=sliding,
        sliding_window=f.sliding_window if sliding else None,
        kv_heads=kv_heads_per_device(f.kv_heads, e.tp),
        head_dim=f.head_dim,
        dtype_bytes=e.kv_dtype_bytes,
        block_size=int(args.get("block_size") or DEFAULT_BLOCK_SIZE),
        max_model_len=e.window,
        step_tokens=step_tokens(args, e.window, int(getattr(e.model, "max_num_seqs", 1)), on_gpu),
        steps_in_flight=steps_in_flight(args),
        latent_dim=f.latent_dim,
        state_bytes=e.kv_state_bytes,
        indexer_bytes=f.indexer_bytes,
    )


def check_windows(bindings: Bindings, engines: list[EnginePlan], problems: list[Problem]) -> None:
    """The window each engine is asked to run against what the model supports and what each role reserves."""
    for e in engines:
        if e.facts is not None and e.facts.native_window:
            longest = e.facts.extended_window(e.engine_arg("hf_overrides"))
            if e.window > longest:
                hint = (
                    "or turn on rope scaling (YaRN) in engine_args.hf_overrides"
                    if longest == e.facts.native_window
                    else ""
                )
                problems.append(
                    Problem(
                        f"{e.path}.max_model_len",
                        f"{e.label}: max_model_len {e.window} is over the "
                        f"model's {longest}-token window (vLLM refuses it): set "
                        f"{e.setting('max_model_len', longest)} {hint}".strip(),
                    )
                )
        longest = e.facts.extended_window(e.engine_arg("hf_overrides")) if e.facts is not None else 0
        for role in e.roles:
            reserved = bindings[role].sampling.max_tokens
            if reserved >= e.window:
                raise_it = (
                    f", or raise {role}.model.max_model_len (the model holds {longest})" if longest > e.window else ""
                )
                problems.append(
                    Problem(
                        f"{role}.max_tokens",
                        f"{role}: max_tokens {reserved} leaves no room for a "
                        f"prompt in {e.name}'s {e.window}-token window: lower {role}.max_tokens"
                        f"{raise_it}",
                    )
                )


def check_heads(engines: list[EnginePlan], problems: list[Problem]) -> None:
    """Tensor parallel must divide the attention heads, and divide or be divided by the KV heads
    (0.33 `ModelConfig.verify_with_parallel_config`; `QKVParallelLinear` replicates KV heads only
    by a whole factor): otherwise vLLM refuses the model at start."""
    for e in engines:
        f = e.facts
        if f is None or e.tp == 1 or not f.heads or tp_fits_heads(f, e.tp):
            continue
        ok = [t for t in (1, 2, 4, 8) if tp_fits_heads(f, t)]
        problems.append(
            Problem(
                f"{e.path}.tensor_parallel_size",
                f"{e.label}: tensor_parallel_size={e.tp} does not split its {f.heads} attention heads "
                f"and {f.kv_heads} KV heads evenly (vLLM refuses it): set "
                f"{e.setting('tensor_parallel_size', max(ok))} (it takes {ok})",
            )
        )


def check_expert_split(engines: list[EnginePlan], problems: list[Problem]) -> None:
    """Block-quantized FP8 experts sliced by tensor parallel must keep whole blocks on each GPU: vLLM
    refuses to load otherwise (0.33 fp8_utils.py `validate_fp8_block_shape_moe`: "not divisible by weight
    quantization block_n"). Without expert parallel the MoE layers are sliced over tensor parallel x data
    parallel ranks; with it each GPU holds whole experts."""
    for e in engines:
        f = e.facts
        if f is None or not f.weight_block or not f.moe_intermediate or e.engine_arg("enable_expert_parallel"):
            continue
        ranks = e.gpus
        if ranks > 1 and (f.moe_intermediate // ranks) % f.weight_block:
            problems.append(
                Problem(
                    f"{e.path}.enable_expert_parallel",
                    f"{e.label}: its FP8 experts ({f.moe_intermediate} columns in "
                    f"{f.weight_block}-wide blocks) sliced over {ranks} GPUs give "
                    f"{f.moe_intermediate // ranks} a GPU, not whole blocks (vLLM refuses to load "
                    f"them): set {e.setting('enable_expert_parallel', 'true')}",
                )
            )


def tp_fits_heads(f: ModelFacts, tp: int) -> bool:
    kv_ok = (tp % f.kv_heads == 0) if tp >= f.kv_heads else (f.kv_heads % tp == 0)
    return f.heads % tp == 0 and kv_ok


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# vLLM 0.32's CPU worker holds this much beside its weights before the KV cache
# (measured here: 1.64 GiB resident with 0.5 GiB of weights).
CPU_RUNTIME_BYTES = int(1.2 * GIB)


def plan_cpu(engines: list[EnginePlan], inv: Inventory, pc: PlanCfg, problems: list[Problem]) -> None:
    """On a CPU the share is of the NUMA node's RAM: the worker's weights and runtime, then the KV cache."""
    ram = inv.ram_bytes
    known = [e for e in engines if e.facts is not None]
    planned = [
        e
        for e in known
        if share_is_planned(e.model.gpu_memory_utilization) and not e.engine_arg("kv_cache_memory_bytes")
    ]
    for e in known:
        explicit = e.engine_arg("kv_cache_memory_bytes")
        if explicit:
            e.kv_bytes = int(explicit)
            continue
        if e in planned:
            e.share = math.floor(1000 * pc.cpu_share / max(1, len(planned))) / 1000
            e.share_planned = True
        else:
            e.share = float(e.model.gpu_memory_utilization)
        e.kv_bytes = max(0, int(e.share * ram) - e.weights_bytes - CPU_RUNTIME_BYTES)
    if not ram or not known:
        return
    total = sum(e.weights_bytes + CPU_RUNTIME_BYTES + e.kv_bytes for e in known)
    if total > ram:
        problems.append(
            Problem(
                f"{known[0].path}.gpu_memory_utilization",
                f"weights, runtime and KV caches need {gib(total)}, NUMA node 0 has {gib(ram)} of "
                "RAM: lower the models' gpu_memory_utilization (their share of RAM on a CPU)",
            )
        )
    for e in known:
        if e.kv_bytes < e.window_kv():
            problems.append(
                Problem(
                    f"{e.path}.gpu_memory_utilization",
                    f"{e.label}: a KV cache of "
                    f"{gib(e.kv_bytes)} cannot hold one {e.window}-token sequence "
                    f"({gib(e.window_kv())}; vLLM refuses to start): raise its share of RAM or "
                    f"lower {e.path}.max_model_len",
                )
            )


def apply(cfg: RunConfig, engines: list[EnginePlan]) -> RunConfig:
    """The config with planned shares and devices filled in, so the engines start as planned."""
    updates: dict[str, Any] = {}
    for e in engines:
        change: dict[str, Any] = {}
        if e.share_planned and e.share is not None:
            change["gpu_memory_utilization"] = e.share
        if e.devices_planned and e.devices:
            change["devices"] = list(e.devices)
        if not change:
            continue
        for role in e.roles:
            rc = getattr(cfg, role)
            updates[role] = rc.model_copy(update={"model": rc.model.model_copy(update=change)})
    return cfg.model_copy(update=updates) if updates else cfg
