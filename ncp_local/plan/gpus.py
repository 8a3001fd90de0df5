"""GPU placement: which GPUs each engine gets and its memory share, and the one-line fix when an
engine does not fit (spread it, shorten its window, or name the GPUs it would need).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .hardware import GIB, Inventory
from .kv import (
    kv_heads_per_device,
)
from .memory import EnginePlan, Problem, _gib, _tp_fits_heads, check_expert_split, check_heads, share_is_planned


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
