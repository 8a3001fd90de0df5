"""Engines on devices: which GPUs each engine gets, its memory share, its KV cache.

vLLM's `gpu_memory_utilization` is the fraction of each of its GPUs an
engine may take (weights, activations and KV cache together), and an engine
refuses to start when less than that is free, or when its KV cache cannot
hold one sequence of `max_model_len` tokens. Engines that share a GPU must
therefore get shares that add up to less than the whole: the plan gives each
its weights plus the same number of full-window sequences of KV cache (the
number the most crowded GPU allows), unless the user set the share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..engines.settings import share_engines
from .facts import DTYPE_BYTES, ModelFacts, dtype_bytes, model_facts
from .hardware import GIB, Inventory


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
    devices: tuple[int, ...] = ()
    devices_planned: bool = False
    share: float | None = None
    share_planned: bool = False
    weights_bytes: int = 0  # in memory, the whole model
    compute_bytes: int = 2
    kv_dtype_bytes: int = 2
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

    def device_weights(self, overhead: int) -> int:
        return self.weights_bytes // self.tp + overhead

    def window_kv(self) -> int:
        """KV bytes per device of one sequence that fills the window."""
        if self.facts is None:
            return 0
        return self.facts.sequence_kv_bytes(self.window, self.kv_dtype_bytes, self.tp)

    def sequences_at(self, tokens: int) -> float:
        """How many sequences of `tokens` the KV cache holds at once."""
        if self.facts is None or tokens <= 0:
            return 0.0
        return self.kv_bytes / self.facts.sequence_kv_bytes(min(tokens, self.window), self.kv_dtype_bytes, self.tp)

    def capacity_tokens(self) -> int:
        if self.facts is None:
            return 0
        return self.kv_bytes // self.facts.kv_bytes_per_token(self.kv_dtype_bytes, self.tp)


def share_is_planned(value: Any) -> bool:
    """`null` or `auto` in a model file: the plan sets the share; a number is the user's."""
    return value is None or (isinstance(value, str) and value.strip().lower() == "auto")


def engines_of(cfg: Any, roles: tuple[str, ...]) -> list[EnginePlan]:
    """One engine per distinct model, as the engine pool groups roles (engines/settings.share_engines)."""
    groups = share_engines({role: getattr(cfg, role).model for role in roles})
    return [EnginePlan(index=i, roles=users, model=model, facts=None,
                       tp=int(getattr(model, "tensor_parallel_size", 1) or 1))
            for i, (model, users) in enumerate(groups.values())]


def read_facts(engines: list[EnginePlan], problems: list[Problem], on_disk_only: bool = False) -> None:
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
            problems.append(Problem(f"{e.path}.path", f"{e.label}: no config.json at {e.model.path} and no built-in "
                                    "facts for this model: its memory is not planned", fatal=False))
            continue
        e.compute_bytes = dtype_bytes(str(getattr(e.model, "dtype", "auto")), e.facts)
        params = e.facts.weights_bytes / e.facts.stored_dtype_bytes
        if e.engine_arg("quantization"):
            # Quantized on load: the checkpoint's size is the honest upper bound we know.
            e.weights_bytes = e.facts.weights_bytes
            e.notes.append(f"quantization={e.engine_arg('quantization')}: weights counted at checkpoint size")
        else:
            e.weights_bytes = int(params * e.compute_bytes)
        kv = str(e.engine_arg("kv_cache_dtype", "auto") or "auto").lower()
        e.kv_dtype_bytes = e.compute_bytes if kv == "auto" else DTYPE_BYTES.get(kv, 1 if kv.startswith("fp8") else 2)


def check_windows(cfg: Any, engines: list[EnginePlan], problems: list[Problem]) -> None:
    """The window each engine is asked to run against what the model supports and what each role reserves."""
    for e in engines:
        if e.facts is not None and e.facts.native_window:
            longest = e.facts.extended_window(e.engine_arg("hf_overrides"))
            if e.window > longest:
                hint = ("or turn on rope scaling (YaRN) in engine_args.hf_overrides"
                        if longest == e.facts.native_window else "")
                problems.append(Problem(f"{e.path}.max_model_len", f"{e.label}: max_model_len {e.window} is over the "
                                        f"model's {longest}-token window (vLLM refuses it): set "
                                        f"{e.path}.max_model_len={longest} {hint}".strip()))
        longest = e.facts.extended_window(e.engine_arg("hf_overrides")) if e.facts is not None else 0
        for role in e.roles:
            reserved = int(getattr(cfg, role).max_tokens)
            if reserved >= e.window:
                raise_it = (f", or raise {role}.model.max_model_len (the model holds {longest})"
                            if longest > e.window else "")
                problems.append(Problem(f"{role}.max_tokens", f"{role}: max_tokens {reserved} leaves no room for a "
                                        f"prompt in {e.name}'s {e.window}-token window: lower {role}.max_tokens"
                                        f"{raise_it}"))


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# vLLM 0.32's CPU worker holds this much beside its weights before the KV cache
# (measured here: 1.64 GiB resident with 0.5 GiB of weights).
CPU_RUNTIME_BYTES = int(1.2 * GIB)


def plan_cpu(engines: list[EnginePlan], inv: Inventory, pc: Any, problems: list[Problem]) -> None:
    """On a CPU the share is of the NUMA node's RAM: the worker's weights and runtime, then the KV cache."""
    ram = inv.ram_bytes
    known = [e for e in engines if e.facts is not None]
    planned = [e for e in known if share_is_planned(e.model.gpu_memory_utilization)
               and not e.engine_arg("kv_cache_memory_bytes")]
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
    if not ram:
        return
    total = sum(e.weights_bytes + CPU_RUNTIME_BYTES + e.kv_bytes for e in known)
    if total > ram:
        problems.append(Problem(f"{known[0].path}.gpu_memory_utilization",
                                f"weights, runtime and KV caches need {_gib(total)}, NUMA node 0 has {_gib(ram)} of "
                                "RAM: lower the models' gpu_memory_utilization (their share of RAM on a CPU)"))
    for e in known:
        if e.kv_bytes < e.window_kv():
            problems.append(Problem(f"{e.path}.gpu_memory_utilization", f"{e.label}: a KV cache of "
                                    f"{_gib(e.kv_bytes)} cannot hold one {e.window}-token sequence "
                                    f"({_gib(e.window_kv())}; vLLM refuses to start): raise its share of RAM or "
                                    f"lower {e.path}.max_model_len"))


def _place(engines: list[EnginePlan], n: int, overhead: int, problems: list[Problem]) -> None:
    """Devices for each engine: as set, else the least loaded ones (tensor parallel k takes k)."""
    load = [0] * n
    for e in engines:
        given = tuple(int(d) for d in (getattr(e.model, "devices", None) or ()))
        if not given:
            continue
        bad = [d for d in given if d >= n]
        if bad:
            problems.append(Problem(f"{e.path}.devices", f"{e.label}: devices {list(given)} name GPU(s) {bad}, but "
                                    f"{n} GPU(s) are visible (indices 0-{n - 1}): fix {e.path}.devices"))
            given = tuple(d for d in given if d < n)
        if len(given) != e.tp:
            problems.append(Problem(f"{e.path}.devices", f"{e.label}: {len(given)} device(s) for "
                                    f"tensor_parallel_size={e.tp}: give {e.tp} or none"))
        e.devices = given
        for d in given:
            load[d] += e.device_weights(overhead) + e.window_kv()
    order = sorted((e for e in engines if not e.devices), key=lambda e: (-e.tp, -e.weights_bytes, e.index))
    for e in order:
        k = min(e.tp, n)
        chosen = sorted(sorted(range(n), key=lambda d: (load[d], d))[:k])
        e.devices, e.devices_planned = tuple(chosen), True
        for d in chosen:
            load[d] += e.device_weights(overhead) + e.window_kv()


def _tp_problem(e: EnginePlan, engines: list[EnginePlan], inv: Inventory, pc: Any, overhead: int) -> Problem:
    n = len(inv.gpus)
    cap = pc.max_device_share * sum(g.total_bytes for g in inv.gpus)
    need = sum(x.weights_bytes + overhead * min(x.tp, n) + x.window_kv() * min(x.tp, n) for x in engines)
    others = [x for x in engines if x is not e]
    what = f"{e.label} has tensor_parallel_size={e.tp} but {n} GPU(s) are visible"
    if need > cap:
        held = " + ".join(f"{x.name} {_gib(x.weights_bytes)}" for x in [e, *others])
        return Problem(f"{e.path}.tensor_parallel_size",
                       f"{what}, and the weights alone ({held}) plus one window of KV cache each need {_gib(need)}, "
                       f"more than {n} x {_gib(inv.gpus[0].total_bytes)} x {pc.max_device_share} = {_gib(cap)}: "
                       f"run on {e.tp} GPUs (plan.gpus or the allocation), or choose a smaller {e.roles[0]} model")
    return Problem(f"{e.path}.tensor_parallel_size",
                   f"{what}: set {e.path}.tensor_parallel_size={n}, or run on {e.tp} GPUs")


def plan_gpu(engines: list[EnginePlan], inv: Inventory, pc: Any, problems: list[Problem]) -> list[str]:
    """Devices and shares on GPUs; returns one summary line per GPU."""
    n = len(inv.gpus)
    overhead = int(pc.overhead_gib * GIB)
    known = [e for e in engines if e.facts is not None]
    for e in known:
        if e.tp > n:
            problems.append(_tp_problem(e, known, inv, pc, overhead))
    _place(known, n, overhead, problems)
    size = [g.total_bytes for g in inv.gpus]

    def smallest(e: EnginePlan) -> int:
        return min(size[d] for d in e.devices) if e.devices else size[0]

    # Shares the user set are taken as they are.
    given = {e.index: float(e.model.gpu_memory_utilization) for e in known
             if not share_is_planned(e.model.gpu_memory_utilization)}
    shares = _fill(known, given, size, overhead, pc.max_device_share)
    for e in known:
        e.share = shares.get(e.index)
        e.share_planned = e.index not in given
    lines = []
    over: list[str] = []
    released: list[EnginePlan] = []
    for d, g in enumerate(inv.gpus):
        on = [e for e in known if d in e.devices]
        total = sum(e.share or 0.0 for e in on)
        parts = " + ".join(f"{e.name} {e.share:.3f}" for e in on)
        spare = pc.max_device_share - total
        lines.append(f"GPU {d} ({g.name}, {_gib(g.total_bytes)}): shares {total:.3f}"
                     + (f" = {parts}" if on else " (unused)")
                     + (f"; {_gib(spare * g.total_bytes)} left unplanned (the engines' shares are set on other GPUs)"
                        if on and spare > 0.05 else ""))
        if total > 1.0:
            over.append(f"GPU {d} {total:.2f} ({parts})")
            released.extend(e for e in on if e.index in given and e not in released)
        elif total > pc.max_device_share + 1e-9:
            problems.append(Problem("plan.max_device_share", f"GPU {d}: shares add up to {total:.2f}, above "
                                    f"plan.max_device_share={pc.max_device_share} (CUDA contexts and graphs live "
                                    "outside the shares)", fatal=False))
        if g.used_bytes > GIB:
            problems.append(Problem("plan", f"GPU {d} has {_gib(g.used_bytes)} in use by other processes; vLLM needs "
                                    "its share free when it starts", fatal=False))
    if over:
        # What the plan would give the engines involved, as numbers the user can set.
        keep = {i: v for i, v in given.items() if all(e.index != i for e in released)}
        alt = _fill(known, keep, size, overhead, pc.max_device_share)
        split = " ".join(f"{e.path}.gpu_memory_utilization={alt[e.index]:.3f}" for e in released)
        problems.append(Problem(f"{released[0].path}.gpu_memory_utilization",
                                f"memory shares add up to more than a whole GPU: {'; '.join(over)}: set them to null "
                                f"so the plan shares the GPUs, or to its split: {split}"))
    for e in known:
        e.kv_bytes = int((e.share or 0.0) * smallest(e)) - e.device_weights(overhead)
        if e.kv_bytes < e.window_kv():
            needed = (e.device_weights(overhead) + e.window_kv()) / smallest(e)
            fix = (f"raise {e.path}.gpu_memory_utilization to at least {math.ceil(100 * needed) / 100:.2f}"
                   if not e.share_planned else "give it a GPU of its own")
            weights = _gib(e.weights_bytes / e.tp)
            problems.append(Problem(f"{e.path}.gpu_memory_utilization",
                                    f"{e.label}: a share of {e.share:.3f} x {_gib(smallest(e))} leaves "
                                    f"{_gib(max(e.kv_bytes, 0))} of KV cache per GPU after {weights}"
                                    f" of weights and {pc.overhead_gib:g} GiB overhead, less than one {e.window}-token "
                                    f"sequence ({_gib(e.window_kv())}; vLLM refuses to start): {fix}, use "
                                    f"engine_args.kv_cache_dtype=fp8, or lower {e.path}.max_model_len"))
            e.kv_bytes = max(e.kv_bytes, 0)
    return lines


def _fill(engines: list[EnginePlan], given: dict[int, float], size: list[int], overhead: int,
          cap: float) -> dict[int, float]:
    """Shares for every engine not in `given` (engine index -> share), by water-filling.

    The most crowded GPU fixes the shares of the engines on it: each gets its
    weights plus the same number of full-window sequences of KV cache (so KV
    goes where the need is), then the next most crowded GPU, and so on.
    """
    shares = dict(given)
    todo = [e for e in engines if e.index not in given and e.devices]

    def smallest(e: EnginePlan) -> int:
        return min(size[d] for d in e.devices)

    while todo:
        best: tuple[float, int] | None = None
        for d in range(len(size)):
            on = [e for e in todo if d in e.devices]
            if not on:
                continue
            used = sum(shares[e.index] * size[d] for e in engines if e.index in shares and d in e.devices)
            weights = sum(e.device_weights(overhead) * size[d] / smallest(e) for e in on)
            kv = sum(e.window_kv() * size[d] / smallest(e) for e in on) or 1
            x = (cap * size[d] - used - weights) / kv
            if best is None or x < best[0]:
                best = (x, d)
        assert best is not None
        x, d = best
        for e in [e for e in todo if d in e.devices]:
            share = (e.device_weights(overhead) + max(x, 0.0) * e.window_kv()) / smallest(e)
            shares[e.index] = max(0.001, math.floor(1000 * min(share, 1.0)) / 1000)
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
