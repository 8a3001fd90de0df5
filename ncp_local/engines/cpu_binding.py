"""The CPU build's thread binding (`VLLM_CPU_OMP_THREADS_BIND`): which cores each of an engine's
worker processes binds its threads to, read by each worker vLLM starts, on the machine it starts on.

Its own module, free of import-time effects: the entry of a served model's node (engines/vllm_serve.py)
makes the binding there and must not take the in-process engine's environment (engines/vllm_process.py
sets VLLM_HOST_IP to loopback when imported, which would break a multi-node server).
"""

from __future__ import annotations

THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def threads_bind(workers: int, cores: list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `workers` workers over `cores`: contiguous shares, `|` between
    workers (a worker shares a core with the next when there are fewer cores than workers)."""
    if len(cores) < workers:
        return "|".join(str(cores[i % len(cores)]) for i in range(workers))
    share, extra = divmod(len(cores), workers)
    parts, at = [], 0
    for i in range(workers):
        n = share + (i < extra)
        parts.append(",".join(str(c) for c in cores[at : at + n]))
        at += n
    return "|".join(parts)
