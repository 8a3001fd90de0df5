"""How full the plan's GPUs are: what the engines on each need at least, and the memory shares that
fill them (water-filling, the most crowded GPU first)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import Inventory
from .memory import EnginePlan


@dataclass(frozen=True)
class GpuLoad:
    """One GPU as the plan fills it: its size and what the engines on it need at least."""

    index: int
    name: str
    size: int
    room: int  # plan.max_device_share of it
    engines: tuple[EnginePlan, ...]
    need: int  # weights, overhead and one max_model_len request of each engine on it (scaled to this GPU)
    weights: int  # weights and overhead alone
    least_shares: float  # the engines' smallest workable shares, each rounded up as the plan rounds them


def smallest_gpu(e: EnginePlan, size: list[int]) -> int:
    # An engine's share is one number for all its GPUs, set by the smallest: on a larger one it takes more.
    return min(size[d] for d in e.devices) if e.devices else size[0]


def least_share(e: EnginePlan, size: list[int], overhead: int) -> float:
    """The smallest share (to 0.001, rounded up) that starts the engine: weights, overhead, one request."""
    return math.ceil(1000 * e.device_need(overhead) / smallest_gpu(e, size)) / 1000


def gpu_loads(engines: list[EnginePlan], inv: Inventory, size: list[int], overhead: int, cap: float) -> list[GpuLoad]:
    out = []
    for d, g in enumerate(inv.gpus):
        on = tuple(e for e in engines if d in e.devices)
        need = sum(e.device_need(overhead) * size[d] / smallest_gpu(e, size) for e in on)
        weights = sum(e.device_weights(overhead) * size[d] / smallest_gpu(e, size) for e in on)
        least = sum(least_share(e, size, overhead) for e in on)
        out.append(GpuLoad(d, g.name, size[d], int(cap * size[d]), on, int(need), int(weights), least))
    return out


def fill_shares(
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
            shares[e.index] = min(1.0, least_share(e, size, overhead))
    todo = [e for e in engines if e.index not in shares and e.devices]
    while todo:
        best: tuple[float, int] | None = None
        for d in range(len(size)):
            on = [e for e in todo if d in e.devices]
            if not on:
                continue
            used = sum(shares[e.index] * size[d] for e in engines if e.index in shares and d in e.devices)
            weights = sum(e.device_weights(overhead) * size[d] / smallest_gpu(e, size) for e in on)
            kv = sum(e.window_kv() * size[d] / smallest_gpu(e, size) for e in on) or 1
            x = (cap * size[d] - used - weights) / kv
            if best is None or x < best[0]:
                best = (x, d)
        assert best is not None
        x, d = best
        for e in [e for e in todo if d in e.devices]:
            exact = (e.device_weights(overhead) + max(x, 0.0) * e.window_kv()) / smallest_gpu(e, size)
            share = max(math.floor(1000 * exact) / 1000, least_share(e, size, overhead))
            shares[e.index] = max(0.001, min(share, 1.0))
            todo.remove(e)
    return shares
