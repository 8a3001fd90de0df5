"""GPU placement: which GPUs each engine gets and its memory share (`gpu_shares.py` fills them), and a
problem for each engine that does not fit (`gpu_fixes.py` says what to change).
"""

from __future__ import annotations

from ..config import PlanCfg
from .gpu_fixes import crowded_problem, over_problem, squeezed_problem, tp_problem, window_problem
from .gpu_shares import GpuLoad, fill_shares, gpu_loads, smallest_gpu
from .hardware import GIB, Inventory
from .memory import EnginePlan, Problem, check_expert_split, check_heads, gib, share_is_planned


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


def plan_gpu(engines: list[EnginePlan], inv: Inventory, pc: PlanCfg, problems: list[Problem]) -> list[str]:
    """Devices and shares on GPUs; returns one summary line per GPU."""
    n = len(inv.gpus)
    overhead = int(pc.overhead_gib * GIB)
    cap = float(pc.max_device_share)
    known = [e for e in engines if e.facts is not None]
    for e in known:
        if e.gpus > n:
            problems.append(tp_problem(e, known, inv, pc, overhead))
    check_heads(known, problems)
    check_expert_split(known, problems)
    _place(known, n, overhead, problems)
    size = [g.total_bytes for g in inv.gpus]
    gpus = gpu_loads(known, inv, size, overhead, cap)
    crowded = [g for g in gpus if g.least_shares > cap + 1e-9]
    for g in crowded:  # several GPUs crowded the same way say it once
        p = crowded_problem(g, known, n, overhead, pc)
        if all(p.message != q.message for q in problems):
            problems.append(p)
    said = {e.index for g in crowded for e in g.engines}  # engines a fatal line already names
    # Shares the user set are taken as they are.
    given = {
        e.index: float(e.model.gpu_memory_utilization)
        for e in known
        if not share_is_planned(e.model.gpu_memory_utilization)
    }
    shares = fill_shares(known, given, size, overhead, cap)
    for e in known:
        e.share = shares.get(e.index)
        e.share_planned = e.index not in given
    lines = _share_lines(gpus, pc, problems, inv, {g.index for g in crowded})
    said |= over_problem(gpus, known, given, size, overhead, cap, said, problems)
    said |= squeezed_problem(gpus, given, size, overhead, cap, said, problems)
    for e in known:
        smallest = smallest_gpu(e, size)
        explicit = e.engine_arg("kv_cache_memory_bytes")
        # An explicit KV size replaces what the share leaves (vLLM: kv_cache_memory_bytes ignores the share).
        e.kv_bytes = int(explicit) if explicit else int((e.share or 0.0) * smallest) - e.device_weights(overhead)
        if e.kv_bytes < e.window_kv() and e.index not in said:
            problems.append(window_problem(e, gpus, given, smallest, overhead, pc))
        e.kv_bytes = max(e.kv_bytes, 0)
    return lines


def _share_lines(
    gpus: list[GpuLoad], pc: PlanCfg, problems: list[Problem], inv: Inventory, crowded: set[int]
) -> list[str]:
    lines = []
    for gpu in gpus:
        g = inv.gpus[gpu.index]
        total = sum(e.share or 0.0 for e in gpu.engines)
        parts = " + ".join(f"{e.name} {e.share or 0.0:.3f}" for e in gpu.engines)
        spare = pc.max_device_share - total
        lines.append(
            f"GPU {gpu.index} ({g.name}, {gib(g.total_bytes)}): shares {total:.3f}"
            + (f" = {parts}" if gpu.engines else " (unused)")
            + (
                f"; {gib(spare * g.total_bytes)} left unplanned (the engines' shares are set on other GPUs)"
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
                    f"GPU {gpu.index} has {gib(g.used_bytes)} in use by other processes; "
                    "vLLM needs its share free when it starts",
                    fatal=False,
                )
            )
    return lines
