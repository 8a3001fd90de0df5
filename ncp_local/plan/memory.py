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
from dataclasses import dataclass, field, replace
from typing import Any

from ..engines.settings import max_num_seqs_note, share_engines, with_run_switches
from .facts import DTYPE_BYTES, ModelFacts, dtype_bytes, model_facts
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


def engines_of(cfg: Any, roles: tuple[str, ...]) -> list[EnginePlan]:
    """One engine per distinct model, as the engine pool groups roles (engines/settings.share_engines)."""
    groups = share_engines({role: getattr(cfg, role).model for role in roles})
    deterministic = bool(getattr(cfg.engine, "deterministic", False))
    plans = []
    for i, (model, users) in enumerate(groups.values()):
        # What the engine will run with: under deterministic=true its max_num_seqs is capped (engines/settings).
        note = max_num_seqs_note(with_run_switches(model, deterministic))
        plans.append(
            EnginePlan(
                index=i,
                roles=users,
                model=model,
                facts=None,
                tp=int(getattr(model, "tensor_parallel_size", 1) or 1),
                dp=int(getattr(model, "data_parallel_size", 1) or 1),
                reserved=max(int(getattr(getattr(cfg, r), "max_tokens", 0) or 0) for r in users),
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
            f"{_gib(f.mtp_bytes)} (estimated), not loaded: vLLM loads them only for speculative "
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


def check_windows(cfg: Any, engines: list[EnginePlan], problems: list[Problem]) -> None:
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
            reserved = int(getattr(cfg, role).max_tokens)
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
        if f is None or e.tp == 1 or not f.heads or _tp_fits_heads(f, e.tp):
            continue
        ok = [t for t in (1, 2, 4, 8) if _tp_fits_heads(f, t)]
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


def _tp_fits_heads(f: ModelFacts, tp: int) -> bool:
    kv_ok = (tp % f.kv_heads == 0) if tp >= f.kv_heads else (f.kv_heads % tp == 0)
    return f.heads % tp == 0 and kv_ok


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# vLLM 0.32's CPU worker holds this much beside its weights before the KV cache
# (measured here: 1.64 GiB resident with 0.5 GiB of weights).
CPU_RUNTIME_BYTES = int(1.2 * GIB)


def plan_cpu(engines: list[EnginePlan], inv: Inventory, pc: Any, problems: list[Problem]) -> None:
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
                f"weights, runtime and KV caches need {_gib(total)}, NUMA node 0 has {_gib(ram)} of "
                "RAM: lower the models' gpu_memory_utilization (their share of RAM on a CPU)",
            )
        )
    for e in known:
        if e.kv_bytes < e.window_kv():
            problems.append(
                Problem(
                    f"{e.path}.gpu_memory_utilization",
                    f"{e.label}: a KV cache of "
                    f"{_gib(e.kv_bytes)} cannot hold one {e.window}-token sequence "
                    f"({_gib(e.window_kv())}; vLLM refuses to start): raise its share of RAM or "
                    f"lower {e.path}.max_model_len",
                )
            )


# ---- GPUs ----------------------------------------------------------------------------------


def _place(engines: list[EnginePlan], n: int, overhead: int, problems: list[Problem]) -> None:
    """Devices for each engine: as set, else the least loaded ones (tensor parallel k takes k)."""
    load = [0] * n
    for e in engines:
        given = tuple(int(d) for d in (getattr(e.model, "devices", None) or ()))
        if not given:
            continue
        bad = [d for d in given if d >= n]
        if bad:
            problems.append(
                Problem(
                    f"{e.path}.devices",
                    f"{e.label}: devices {list(given)} name GPU(s) {bad}, but "
                    f"{n} GPU(s) are visible (indices 0-{n - 1}): fix {e.path}.devices",
                )
            )
            given = tuple(d for d in given if d < n)
        if len(given) != e.gpus:
            layout = f"tensor_parallel_size={e.tp}" + (f" x data_parallel_size={e.dp}" if e.dp > 1 else "")
            problems.append(
                Problem(f"{e.path}.devices", f"{e.label}: {len(given)} device(s) for {layout}: give {e.gpus} or none")
            )
        e.devices = given
        for d in given:
            load[d] += e.device_need(overhead)
    order = sorted((e for e in engines if not e.devices), key=lambda e: (-e.gpus, -e.weights_bytes, e.index))
    for e in order:
        k = min(e.gpus, n)
        chosen = sorted(sorted(range(n), key=lambda d: (load[d], d))[:k])
        e.devices, e.devices_planned = tuple(chosen), True
        for d in chosen:
            load[d] += e.device_need(overhead)


def _tp_problem(e: EnginePlan, engines: list[EnginePlan], inv: Inventory, pc: Any, overhead: int) -> Problem:
    n = len(inv.gpus)
    cap = pc.max_device_share * sum(g.total_bytes for g in inv.gpus)
    need = sum(x.total_weights() + (overhead + x.window_kv()) * min(x.gpus, n) for x in engines)
    others = [x for x in engines if x is not e]
    what = (
        f"{e.label} has tensor_parallel_size={e.tp}"
        + (f" x data_parallel_size={e.dp}" if e.dp > 1 else "")
        + f" but {n} GPU(s) are visible"
    )
    if e.dp > 1 and e.tp <= n:
        return Problem(
            f"{e.path}.data_parallel_size",
            f"{what}: set {e.setting('data_parallel_size', n // e.tp)}, or run on {e.gpus} GPUs",
        )
    if need > cap:
        held = " + ".join(f"{x.name} {_gib(x.weights_bytes)}" for x in [e, *others])
        return Problem(
            f"{e.path}.tensor_parallel_size",
            f"{what}, and the weights alone ({held}) plus one max_model_len request of KV cache each need "
            f"{_gib(need)}, "
            f"more than {n} x {_gib(inv.gpus[0].total_bytes)} x {pc.max_device_share} = {_gib(cap)}: "
            f"run on {e.gpus} GPUs (plan.gpus or the allocation), or choose a smaller {e.roles[0]} model",
        )
    return Problem(
        f"{e.path}.tensor_parallel_size", f"{what}: set {e.setting('tensor_parallel_size', n)}, or run on {e.tp} GPUs"
    )


@dataclass(frozen=True)
class _Gpu:
    """One GPU as the plan fills it: its size and what the engines on it need at least."""

    index: int
    name: str
    size: int
    room: int  # plan.max_device_share of it
    engines: tuple[EnginePlan, ...]
    need: int  # weights, overhead and one max_model_len request of each engine on it (scaled to this GPU)
    weights: int  # weights and overhead alone
    least_shares: float  # the engines' smallest workable shares, each rounded up as the plan rounds them


def _smallest(e: EnginePlan, size: list[int]) -> int:
    # An engine's share is one number for all its GPUs, set by the smallest: on a larger one it takes more.
    return min(size[d] for d in e.devices) if e.devices else size[0]


def _least_share(e: EnginePlan, size: list[int], overhead: int) -> float:
    """The smallest share (to 0.001, rounded up) that starts the engine: weights, overhead, one request."""
    return math.ceil(1000 * e.device_need(overhead) / _smallest(e, size)) / 1000


def _gpus(engines: list[EnginePlan], inv: Inventory, size: list[int], overhead: int, cap: float) -> list[_Gpu]:
    out = []
    for d, g in enumerate(inv.gpus):
        on = tuple(e for e in engines if d in e.devices)
        need = sum(e.device_need(overhead) * size[d] / _smallest(e, size) for e in on)
        weights = sum(e.device_weights(overhead) * size[d] / _smallest(e, size) for e in on)
        least = sum(_least_share(e, size, overhead) for e in on)
        out.append(_Gpu(d, g.name, size[d], int(cap * size[d]), on, int(need), int(weights), least))
    return out


# A window the plan suggests must hold the largest answer its roles reserve and this much prompt besides.
MIN_PROMPT_ROOM = 4096


def _largest_window(e: EnginePlan, kv_budget: int) -> int:
    """The largest max_model_len (a multiple of 1024) whose start-up KV fits `kv_budget`; 0 if none does."""
    assert e.kv is not None
    lo, hi = 0, e.window // 1024
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if replace(e.kv, max_model_len=mid * 1024).startup_bytes() <= kv_budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * 1024


def _alone_at_tp(e: EnginePlan, room: int, overhead: int) -> int | None:
    """The smallest tensor parallel size (at least the engine's) with which it fits GPUs of `room` alone."""
    assert e.kv is not None and e.facts is not None
    for tp in (1, 2, 4, 8):
        if tp < e.tp or (e.facts.heads and not _tp_fits_heads(e.facts, tp)):
            continue
        kv = replace(e.kv, kv_heads=kv_heads_per_device(e.facts.kv_heads, tp))
        if e.weights_at(tp) + overhead + kv.startup_bytes() <= room:
            return tp
    return None


def _shorter(e: EnginePlan, kv_budget: int) -> int | None:
    """A max_model_len to suggest for `e` within `kv_budget` bytes of KV cache, if a useful one fits."""
    window = _largest_window(e, kv_budget)
    return window if window >= e.reserved + MIN_PROMPT_ROOM else None


def _crowded_problem(gpu: _Gpu, engines: list[EnginePlan], n: int, overhead: int, pc: Any) -> Problem:
    """One line for a GPU that cannot hold its engines with one request each, whatever the shares:
    a shorter window if the weights fit, else GPUs of their own (with the tensor parallel each needs)."""
    parts = " + ".join(f"{e.label} {_gib(e.device_need(overhead))}" for e in gpu.engines)
    head = (
        f"GPU {gpu.index} ({gpu.name}, {_gib(gpu.size)}) cannot hold {parts} (weights, plan.overhead_gib="
        f"{pc.overhead_gib:g} and one max_model_len request of KV cache each) = {_gib(gpu.need)} within "
        f"plan.max_device_share={pc.max_device_share} x {_gib(gpu.size)} = {_gib(gpu.room)}"
    )
    return (
        _fix_by_spreading(gpu, engines, n, head, overhead)
        or _fix_by_window(gpu, head, overhead)
        or _fix_by_gpus(gpu, engines, n, head, overhead, pc)
        or Problem(
            "plan.gpus", f"{head}: run on more GPUs (plan.gpus, or the job's allocation), or choose smaller models"
        )
    )


def _need_at_tp(e: EnginePlan, tp: int, overhead: int) -> int:
    """What the engine needs per GPU (weights, overhead, one request) at tensor parallel `tp`."""
    assert e.kv is not None and e.facts is not None
    kv = replace(e.kv, kv_heads=kv_heads_per_device(e.facts.kv_heads, tp))
    return e.weights_at(tp) + overhead + kv.startup_bytes()


def _fix_by_spreading(gpu: _Gpu, engines: list[EnginePlan], n: int, head: str, overhead: int) -> Problem | None:
    """A smaller engine crowding a large one (an auditor on 2 of the 8 GPUs a tensor-parallel-8 narrator
    takes): the same engine at a larger tensor parallel, spread over the least loaded GPUs, may fit
    beside it on every GPU (the widest such spread is named: it crowds each GPU least). Only engines
    the plan places (devices not set) are moved."""
    for x in sorted(gpu.engines, key=lambda e: (e.gpus, e.index)):
        if x.devices_planned is False or x.facts is None or x.kv is None or x.dp > 1:
            continue
        others = [0] * n
        for e in engines:
            if e is not x and e.facts is not None and e.kv is not None:
                for d in e.devices:
                    others[d] += e.device_need(overhead)
        for tp in (8, 4, 2):  # the widest first: it leaves the most room on each GPU
            if tp <= x.tp or tp > n or (x.facts.heads and not _tp_fits_heads(x.facts, tp)):
                continue
            least = sorted(range(n), key=lambda d: (others[d], d))[:tp]
            if all(others[d] + _need_at_tp(x, tp, overhead) <= gpu.room for d in least):
                return Problem(
                    f"{x.path}.tensor_parallel_size",
                    f"{head}: set {x.setting('tensor_parallel_size', tp)} (its weights spread over {tp} "
                    f"GPUs beside the others), or run on more GPUs",
                )
    return None


def _fix_by_window(gpu: _Gpu, head: str, overhead: int) -> Problem | None:
    """The weights fit: a shorter window (or an fp8 KV cache) for the engine whose KV cache takes most."""
    if gpu.weights > gpu.room:
        return None
    big = max(gpu.engines, key=lambda e: (e.window_kv(), -e.index))
    assert big.kv is not None
    others = gpu.need - big.device_need(overhead)
    budget = gpu.room - others - big.device_weights(overhead) - len(gpu.engines) * gpu.size // 1000  # less rounding
    window = _shorter(big, budget)
    if not window:
        return None
    fp8 = big.kv.dtype_bytes > 1 and replace(big.kv, dtype_bytes=1).startup_bytes() <= budget
    alt = f", or {big.setting('engine_args.kv_cache_dtype', 'fp8', new_key=True)}" if fp8 else ""
    return Problem(
        f"{big.path}.max_model_len",
        f"{head}: set {big.setting('max_model_len', window)} (the longest window that fits){alt}, or run on more GPUs",
    )


# GPUs to name when a model's weights fit none of the inventory's: (plan.gpus spelling, GiB).
LARGER_GPUS = (("H100-80GB", 80), ("H200-141GB", 141), ("B200-192GB", 192))
# The most GPUs one node holds (one engine's tensor parallel stays inside a node).
NODE_GPUS = 8


def _what_would(e: EnginePlan, overhead: int, pc: Any) -> str:
    """The smallest 8-GPU node that holds the engine alone, in plan.gpus spelling; or the serving setup."""
    for name, size in LARGER_GPUS:
        room = int(pc.max_device_share * size * GIB) - size * GIB // 1000
        if _alone_at_tp(e, room, overhead) is not None:
            return f"run on {NODE_GPUS} x {name} (plan.gpus=[{NODE_GPUS}x{name}]), which holds them,"
    return f"run on GPUs larger than {LARGER_GPUS[-1][0]}"


def _fix_by_gpus(gpu: _Gpu, engines: list[EnginePlan], n: int, head: str, overhead: int, pc: Any) -> Problem | None:
    """An engine on GPUs of its own: how many GPUs that takes, and the tensor parallel (or window) the first
    engine that does not fit one GPU alone needs."""
    room = gpu.room - gpu.size // 1000  # less the rounding of shares
    alone = {e.index: _alone_at_tp(e, room, overhead) for e in engines}
    count = sum((alone[e.index] or e.tp) * e.dp for e in engines)
    misfit = next((e for e in gpu.engines if alone[e.index] != e.tp), None)
    if misfit is None:
        if count > n:
            return Problem(
                "plan.gpus",
                f"{head}: run on {count} GPUs (plan.gpus, or the job's allocation), "
                "an engine on each, or choose smaller models",
            )
        pinned = next((e for e in gpu.engines if not e.devices_planned), None)
        if pinned is None:
            return None
        return Problem(
            f"{pinned.path}.devices",
            f"{head}: set {pinned.setting('devices', '[]')} so the plan places it, or pin it to other GPUs",
        )
    tp = alone[misfit.index]
    window = _shorter(misfit, room - misfit.device_weights(overhead)) if misfit.tp == 1 else None
    smaller = f"choose a smaller {misfit.roles[0]} model"
    if tp is None:
        if window:
            return Problem(
                f"{misfit.path}.max_model_len",
                f"{head}: set {misfit.setting('max_model_len', window)} and give it a GPU of its own, or {smaller}",
            )
        if misfit.weights_at(NODE_GPUS) + overhead > room:
            # Not even the weights: say it plainly, and what would hold them.
            return Problem(
                misfit.roles[0],
                f"{misfit.label}: its weights ({_gib(misfit.weights_bytes)}, "
                f"{_gib(misfit.weights_at(NODE_GPUS))} a GPU at tensor parallel {NODE_GPUS}, plus "
                f"plan.overhead_gib={pc.overhead_gib:g}) do not fit GPUs of {_gib(gpu.size)} "
                f"({_gib(room)} usable at plan.max_device_share={pc.max_device_share}): "
                f"{_what_would(misfit, overhead, pc)} or across two nodes through a multi-node vLLM "
                f"server (engine=openai); or {smaller}",
            )
        return Problem(
            misfit.roles[0],
            f"{head}: {misfit.label} does not fit GPUs of {_gib(gpu.size)} even alone "
            f"with tensor parallel up to 8: {smaller} (or larger GPUs)",
        )
    where = (
        f"on {tp} GPUs (plan.gpus or the job's allocation)"
        if len(engines) == 1
        else f"on {tp} GPUs of its own ({count} GPUs in all, an engine on each: plan.gpus or the job's allocation)"
    )
    shorter = f"; or {misfit.setting('max_model_len', window)} on a GPU of its own" if window else ""
    return Problem(
        f"{misfit.path}.tensor_parallel_size",
        f"{head}: set {misfit.setting('tensor_parallel_size', tp)} {where}{shorter}; or {smaller}",
    )


def plan_gpu(engines: list[EnginePlan], inv: Inventory, pc: Any, problems: list[Problem]) -> list[str]:
    """Devices and shares on GPUs; returns one summary line per GPU."""
    n = len(inv.gpus)
    overhead = int(pc.overhead_gib * GIB)
    cap = float(pc.max_device_share)
    known = [e for e in engines if e.facts is not None]
    for e in known:
        if e.gpus > n:
            problems.append(_tp_problem(e, known, inv, pc, overhead))
    check_heads(known, problems)
    check_expert_split(known, problems)
    _place(known, n, overhead, problems)
    size = [g.total_bytes for g in inv.gpus]
    gpus = _gpus(known, inv, size, overhead, cap)
    crowded = [g for g in gpus if g.least_shares > cap + 1e-9]
    for g in crowded:  # several GPUs crowded the same way say it once
        p = _crowded_problem(g, known, n, overhead, pc)
        if all(p.message != q.message for q in problems):
            problems.append(p)
    said = {e.index for g in crowded for e in g.engines}  # engines a fatal line already names
    # Shares the user set are taken as they are.
    given = {
        e.index: float(e.model.gpu_memory_utilization)
        for e in known
        if not share_is_planned(e.model.gpu_memory_utilization)
    }
    shares = _fill(known, given, size, overhead, cap)
    for e in known:
        e.share = shares.get(e.index)
        e.share_planned = e.index not in given
    lines = _share_lines(gpus, pc, problems, inv, {g.index for g in crowded})
    said |= _over_problem(gpus, known, given, size, overhead, cap, said, problems)
    said |= _squeezed_problem(gpus, given, size, overhead, cap, said, problems)
    for e in known:
        smallest = _smallest(e, size)
        explicit = e.engine_arg("kv_cache_memory_bytes")
        # An explicit KV size replaces what the share leaves (vLLM: kv_cache_memory_bytes ignores the share).
        e.kv_bytes = int(explicit) if explicit else int((e.share or 0.0) * smallest) - e.device_weights(overhead)
        if e.kv_bytes < e.window_kv() and e.index not in said:
            problems.append(_window_problem(e, gpus, given, smallest, overhead, pc))
        e.kv_bytes = max(e.kv_bytes, 0)
    return lines


def _share_lines(gpus: list[_Gpu], pc: Any, problems: list[Problem], inv: Inventory, crowded: set[int]) -> list[str]:
    lines = []
    for gpu in gpus:
        g = inv.gpus[gpu.index]
        total = sum(e.share or 0.0 for e in gpu.engines)
        parts = " + ".join(f"{e.name} {e.share or 0.0:.3f}" for e in gpu.engines)
        spare = pc.max_device_share - total
        lines.append(
            f"GPU {gpu.index} ({g.name}, {_gib(g.total_bytes)}): shares {total:.3f}"
            + (f" = {parts}" if gpu.engines else " (unused)")
            + (
                f"; {_gib(spare * g.total_bytes)} left unplanned (the engines' shares are set on other GPUs)"
                if gpu.engines and spare > 0.05
                else ""
            )
            + (
                "; the least each engine starts with: the engines do not fit (the verdict says what to change)"
                if gpu.index in crowded
                else ""
            )
        )
        # Shares rounded up to start their engine may pass the cap by 0.001 each.
        if pc.max_device_share + 0.001 * len(gpu.engines) + 1e-9 < total <= 1.0:
            problems.append(
                Problem(
                    "plan.max_device_share",
                    f"GPU {gpu.index}: shares add up to {total:.2f}, above "
                    f"plan.max_device_share={pc.max_device_share} (each engine's CUDA context lives "
                    "outside its share)",
                    fatal=False,
                )
            )
        if g.used_bytes > GIB:
            problems.append(
                Problem(
                    "plan",
                    f"GPU {gpu.index} has {_gib(g.used_bytes)} in use by other processes; "
                    "vLLM needs its share free when it starts",
                    fatal=False,
                )
            )
    return lines


def _over_problem(
    gpus: list[_Gpu],
    known: list[EnginePlan],
    given: dict[int, float],
    size: list[int],
    overhead: int,
    cap: float,
    on_crowded: set[int],
    problems: list[Problem],
) -> set[int]:
    """Shares set by the user that add up to more than a GPU, with the split the plan would use;
    returns the engines it named."""
    over = []
    released: list[EnginePlan] = []
    for gpu in gpus:
        total = sum(e.share or 0.0 for e in gpu.engines)
        if total <= 1.0 or any(e.index in on_crowded for e in gpu.engines):
            continue  # a crowded GPU is said once, with what to change
        parts = " + ".join(f"{e.name} {e.share or 0.0:.3f}" for e in gpu.engines)
        over.append(f"GPU {gpu.index} {total:.2f} ({parts})")
        released.extend(e for e in gpu.engines if e.index in given and e not in released)
    if not over or not released:
        return set()  # planned shares alone fit wherever the GPU is not crowded
    keep = {i: v for i, v in given.items() if all(e.index != i for e in released)}
    alt = _fill(known, keep, size, overhead, cap)
    split = " ".join(e.setting("gpu_memory_utilization", f"{alt[e.index]:.3f}") for e in released if e.index in alt)
    problems.append(
        Problem(
            f"{released[0].path}.gpu_memory_utilization",
            f"memory shares add up to more than a whole GPU: {'; '.join(over)}: set them to null "
            f"so the plan shares the GPUs, or to its split: {split}",
        )
    )
    return {e.index for gpu in gpus for e in gpu.engines if any(x in released for x in gpu.engines)}


def _squeezed_problem(
    gpus: list[_Gpu],
    given: dict[int, float],
    size: list[int],
    overhead: int,
    cap: float,
    said: set[int],
    problems: list[Problem],
) -> set[int]:
    """Shares set by the user that leave the planned engines beside them less than they need to start
    within plan.max_device_share; returns the engines it named."""
    named: set[int] = set()
    for gpu in gpus:
        fixed = [e for e in gpu.engines if e.index in given]
        free = [e for e in gpu.engines if e.index not in given]
        if not fixed or not free or any(e.index in said | named for e in gpu.engines):
            continue
        least = sum(_least_share(e, size, overhead) for e in free)
        taken = sum(given[e.index] for e in fixed)
        if taken + least <= cap + 1e-9:
            continue
        x = max(fixed, key=lambda e: (given[e.index], -e.index))
        most = math.floor(1000 * (cap - least - (taken - given[x.index]))) / 1000
        lower = f", or lower it to {most:.3f}" if most >= _least_share(x, size, overhead) else ""
        problems.append(
            Problem(
                f"{x.path}.gpu_memory_utilization",
                f"GPU {gpu.index}: the share set for {x.label} ({given[x.index]:.3f}) leaves "
                f"{' and '.join(e.label for e in free)} less than the {least:.3f} "
                f"{'they need' if len(free) > 1 else 'it needs'} to start within "
                f"plan.max_device_share={cap}: set {x.setting('gpu_memory_utilization', 'null')} so "
                f"the plan shares the GPU{lower}",
            )
        )
        named |= {e.index for e in gpu.engines}
    return named


def _window_problem(
    e: EnginePlan, gpus: list[_Gpu], given: dict[int, float], smallest: int, overhead: int, pc: Any
) -> Problem:
    """An engine whose share leaves less KV cache than one max_model_len request (vLLM would not start)."""
    head = (
        f"{e.label}: a share of {e.share or 0.0:.3f} x {_gib(smallest)} leaves {_gib(max(e.kv_bytes, 0))} of KV "
        f"cache per GPU after {_gib(e.weights_at(e.tp))} of weights and {pc.overhead_gib:g} GiB overhead, less "
        f"than one {e.window}-token request ({_gib(e.window_kv())}; vLLM refuses to start)"
    )
    if e.engine_arg("kv_cache_memory_bytes"):
        return Problem(
            f"{e.path}.kv_cache_memory_bytes",
            f"{e.label}: kv_cache_memory_bytes={e.engine_arg('kv_cache_memory_bytes')} is less than one "
            f"{e.window}-token request ({_gib(e.window_kv())}; vLLM refuses to start): raise it to at least "
            f"{e.window_kv()} or lower {e.path}.max_model_len",
        )
    if e.index in given:
        needed = e.device_need(overhead) / smallest
        return Problem(
            f"{e.path}.gpu_memory_utilization",
            f"{head}: set {e.setting('gpu_memory_utilization', f'{math.ceil(100 * needed) / 100:.2f}')} "
            f"or more, use engine_args.kv_cache_dtype=fp8, or lower {e.path}.max_model_len",
        )
    # A planned share squeezed by shares the user set for the other engines on its GPUs.
    squeezers = [x for g in gpus if e in g.engines for x in g.engines if x.index in given]
    if squeezers:
        x = squeezers[0]
        return Problem(
            f"{x.path}.gpu_memory_utilization",
            f"{head}: the share set for {x.label} ({given[x.index]:.3f}) leaves too little: set "
            f"{x.setting('gpu_memory_utilization', 'null')} so the plan shares the GPU, or lower it",
        )
    return Problem(f"{e.path}.max_model_len", f"{head}: lower {e.path}.max_model_len or run on more GPUs")


def _fill(
    engines: list[EnginePlan], given: dict[int, float], size: list[int], overhead: int, cap: float
) -> dict[int, float]:
    """Shares for every engine not in `given` (engine index -> share), by water-filling.

    The most crowded GPU fixes the shares of the engines on it: each gets its
    weights plus the same number of `max_model_len` requests of KV cache (so KV
    goes where the need is), then the next most crowded GPU, and so on. An
    engine with an explicit `kv_cache_memory_bytes` takes that and no more.
    Shares are rounded down to 0.001, never below the least that starts the
    engine (rounded up): a GPU where those do not fit is refused before.
    """
    shares = dict(given)
    for e in engines:
        if e.index not in shares and e.devices and e.engine_arg("kv_cache_memory_bytes"):
            shares[e.index] = min(1.0, _least_share(e, size, overhead))
    todo = [e for e in engines if e.index not in shares and e.devices]
    while todo:
        best: tuple[float, int] | None = None
        for d in range(len(size)):
            on = [e for e in todo if d in e.devices]
            if not on:
                continue
            used = sum(shares[e.index] * size[d] for e in engines if e.index in shares and d in e.devices)
            weights = sum(e.device_weights(overhead) * size[d] / _smallest(e, size) for e in on)
            kv = sum(e.window_kv() * size[d] / _smallest(e, size) for e in on) or 1
            x = (cap * size[d] - used - weights) / kv
            if best is None or x < best[0]:
                best = (x, d)
        assert best is not None
        x, d = best
        for e in [e for e in todo if d in e.devices]:
            exact = (e.device_weights(overhead) + max(x, 0.0) * e.window_kv()) / _smallest(e, size)
            share = max(math.floor(1000 * exact) / 1000, _least_share(e, size, overhead))
            shares[e.index] = max(0.001, min(share, 1.0))
            todo.remove(e)
    return shares


def apply(cfg: Any, engines: list[EnginePlan]) -> Any:
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
