"""The one line the plan says when engines do not fit their GPUs: what to change (spread an engine, shorten
its window, set or unset a share, or name the GPUs it would need)."""

from __future__ import annotations

import math
from dataclasses import replace

from ..config import PlanCfg
from .gpu_shares import GpuLoad, fill_shares, least_share
from .hardware import GIB, Inventory
from .kv import kv_heads_per_device
from .memory import EnginePlan, Problem, gib, tp_fits_heads


def tp_problem(e: EnginePlan, engines: list[EnginePlan], inv: Inventory, pc: PlanCfg, overhead: int) -> Problem:
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
        held = " + ".join(f"{x.name} {gib(x.weights_bytes)}" for x in [e, *others])
        return Problem(
            f"{e.path}.tensor_parallel_size",
            f"{what}, and the weights alone ({held}) plus one max_model_len request of KV cache each need "
            f"{gib(need)}, "
            f"more than {n} x {gib(inv.gpus[0].total_bytes)} x {pc.max_device_share} = {gib(cap)}: "
            f"run on {e.gpus} GPUs (plan.gpus or the allocation), or choose a smaller {e.roles[0]} model",
        )
    return Problem(
        f"{e.path}.tensor_parallel_size", f"{what}: set {e.setting('tensor_parallel_size', n)}, or run on {e.tp} GPUs"
    )


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
        if tp < e.tp or (e.facts.heads and not tp_fits_heads(e.facts, tp)):
            continue
        kv = replace(e.kv, kv_heads=kv_heads_per_device(e.facts.kv_heads, tp))
        if e.weights_at(tp) + overhead + kv.startup_bytes() <= room:
            return tp
    return None


def _shorter(e: EnginePlan, kv_budget: int) -> int | None:
    """A max_model_len to suggest for `e` within `kv_budget` bytes of KV cache, if a useful one fits."""
    window = _largest_window(e, kv_budget)
    return window if window >= e.reserved + MIN_PROMPT_ROOM else None


def crowded_problem(gpu: GpuLoad, engines: list[EnginePlan], n: int, overhead: int, pc: PlanCfg) -> Problem:
    """One line for a GPU that cannot hold its engines with one request each, whatever the shares:
    a shorter window if the weights fit, else GPUs of their own (with the tensor parallel each needs)."""
    parts = " + ".join(f"{e.label} {gib(e.device_need(overhead))}" for e in gpu.engines)
    head = (
        f"GPU {gpu.index} ({gpu.name}, {gib(gpu.size)}) cannot hold {parts} (weights, plan.overhead_gib="
        f"{pc.overhead_gib:g} and one max_model_len request of KV cache each) = {gib(gpu.need)} within "
        f"plan.max_device_share={pc.max_device_share} x {gib(gpu.size)} = {gib(gpu.room)}"
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


def _fix_by_spreading(gpu: GpuLoad, engines: list[EnginePlan], n: int, head: str, overhead: int) -> Problem | None:
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
            if tp <= x.tp or tp > n or (x.facts.heads and not tp_fits_heads(x.facts, tp)):
                continue
            least = sorted(range(n), key=lambda d: (others[d], d))[:tp]
            if all(others[d] + _need_at_tp(x, tp, overhead) <= gpu.room for d in least):
                return Problem(
                    f"{x.path}.tensor_parallel_size",
                    f"{head}: set {x.setting('tensor_parallel_size', tp)} (its weights spread over {tp} "
                    f"GPUs beside the others), or run on more GPUs",
                )
    return None


def _fix_by_window(gpu: GpuLoad, head: str, overhead: int) -> Problem | None:
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


def _what_would(e: EnginePlan, overhead: int, pc: PlanCfg) -> str:
    """The smallest 8-GPU node that holds the engine alone, in plan.gpus spelling; or the serving setup."""
    for name, size in LARGER_GPUS:
        room = int(pc.max_device_share * size * GIB) - size * GIB // 1000
        if _alone_at_tp(e, room, overhead) is not None:
            return f"run on {NODE_GPUS} x {name} (plan.gpus=[{NODE_GPUS}x{name}]), which holds them,"
    return f"run on GPUs larger than {LARGER_GPUS[-1][0]}"


def _fix_by_gpus(
    gpu: GpuLoad, engines: list[EnginePlan], n: int, head: str, overhead: int, pc: PlanCfg
) -> Problem | None:
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
                f"{misfit.label}: its weights ({gib(misfit.weights_bytes)}, "
                f"{gib(misfit.weights_at(NODE_GPUS))} a GPU at tensor parallel {NODE_GPUS}, plus "
                f"plan.overhead_gib={pc.overhead_gib:g}) do not fit GPUs of {gib(gpu.size)} "
                f"({gib(room)} usable at plan.max_device_share={pc.max_device_share}): "
                f"{_what_would(misfit, overhead, pc)} or across two nodes through a multi-node vLLM "
                f"server (engine=openai); or {smaller}",
            )
        return Problem(
            misfit.roles[0],
            f"{head}: {misfit.label} does not fit GPUs of {gib(gpu.size)} even alone "
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


def over_problem(
    gpus: list[GpuLoad],
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
    alt = fill_shares(known, keep, size, overhead, cap)
    split = " ".join(e.setting("gpu_memory_utilization", f"{alt[e.index]:.3f}") for e in released if e.index in alt)
    problems.append(
        Problem(
            f"{released[0].path}.gpu_memory_utilization",
            f"memory shares add up to more than a whole GPU: {'; '.join(over)}: set them to null "
            f"so the plan shares the GPUs, or to its split: {split}",
        )
    )
    return {e.index for gpu in gpus for e in gpu.engines if any(x in released for x in gpu.engines)}


def squeezed_problem(
    gpus: list[GpuLoad],
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
        least = sum(least_share(e, size, overhead) for e in free)
        taken = sum(given[e.index] for e in fixed)
        if taken + least <= cap + 1e-9:
            continue
        x = max(fixed, key=lambda e: (given[e.index], -e.index))
        most = math.floor(1000 * (cap - least - (taken - given[x.index]))) / 1000
        lower = f", or lower it to {most:.3f}" if most >= least_share(x, size, overhead) else ""
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


def window_problem(
    e: EnginePlan, gpus: list[GpuLoad], given: dict[int, float], smallest: int, overhead: int, pc: PlanCfg
) -> Problem:
    """An engine whose share leaves less KV cache than one max_model_len request (vLLM would not start)."""
    head = (
        f"{e.label}: a share of {e.share or 0.0:.3f} x {gib(smallest)} leaves {gib(max(e.kv_bytes, 0))} of KV "
        f"cache per GPU after {gib(e.weights_at(e.tp))} of weights and {pc.overhead_gib:g} GiB overhead, less "
        f"than one {e.window}-token request ({gib(e.window_kv())}; vLLM refuses to start)"
    )
    if e.engine_arg("kv_cache_memory_bytes"):
        return Problem(
            f"{e.path}.kv_cache_memory_bytes",
            f"{e.label}: kv_cache_memory_bytes={e.engine_arg('kv_cache_memory_bytes')} is less than one "
            f"{e.window}-token request ({gib(e.window_kv())}; vLLM refuses to start): raise it to at least "
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
