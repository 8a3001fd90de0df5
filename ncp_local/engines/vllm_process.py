"""The process side of an in-process vLLM engine: the environment it starts in, and its processes.

vLLM reads its settings from the environment of the process that starts an engine, writes into it
while it builds the engine's config, and its engine processes inherit it. The rig sets what every
engine needs once, at import (before vLLM itself is imported); it gives each engine its own
variables (`engine_env`) only while that engine starts, one start at a time, and puts back whatever
changed (`engine_environ`), so no engine's settings reach the next. `engine_processes` finds an
engine's processes for its watchdog (engines/watchdog.py) and for leak checks.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import psutil

from .cpu_binding import THREADS_BIND, threads_bind
from .settings import ModelSettings

# Must be in the environment before vllm (and huggingface_hub) are imported,
# and are inherited by the engine process.
os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# Engine processes talk over loopback / shared memory; without this vLLM
# probes a public address to pick the host's interface IP.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


def engine_env(cfg: ModelSettings, on_cpu: bool) -> dict[str, str]:
    """Environment the engine process must start with (it reads it when spawned)."""
    env: dict[str, str] = {}
    if cfg.cpu_reserved_cores is not None and on_cpu:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.cpu_reserved_cores)
    if cfg.deterministic and not on_cpu:
        # Batch-invariant kernels: a request's tokens no longer depend on what
        # else is in the batch. On the CPU build fp32 is invariant already
        # (measured), and vLLM's invariant kernels are GPU ones.
        env["VLLM_BATCH_INVARIANT"] = "1"
    # vLLM gives a grammar 5 s to compile (a guard against hostile regexes). The
    # rig's grammars are its own, and a loaded machine can take longer (xgrammar's
    # player regex, outlines' bounded narration: engines/grammar.py): a timeout there
    # is an engine error, a retry with another seed, and a run that no longer
    # reproduces. So the rig's engines wait for their own grammars.
    env["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = str(GRAMMAR_COMPILE_TIMEOUT_S)
    workers = cfg.tensor_parallel_size * int(cfg.engine_args.get("pipeline_parallel_size") or 1)
    if on_cpu and workers > 1 and THREADS_BIND not in os.environ:
        # Several CPU workers in one engine: vLLM's automatic binding gives each a NUMA node, and a
        # machine with one has too few for two workers; each gets its share of this process's cores.
        env[THREADS_BIND] = threads_bind(workers, sorted(os.sched_getaffinity(0)))
    return env


GRAMMAR_COMPILE_TIMEOUT_S = 600


# Engines are started one at a time: per-engine environment (VLLM_BATCH_INVARIANT,
# VLLM_CPU_NUM_OF_RESERVED_CPU, and what vLLM writes itself) is process-wide and
# read by the engine processes when they are spawned or forked.
START_LOCK = threading.Lock()


@contextlib.contextmanager
def engine_environ(env: Mapping[str, str]) -> Iterator[list[str]]:
    """os.environ with `env` added for one engine start, then exactly as before.

    vLLM writes into the parent's environment while it builds an engine's config
    (VLLM_USE_BREAKABLE_CUDAGRAPH=1 under batch invariance, the CPU build's
    VLLM_WORKER_MULTIPROC_METHOD and thread counts, ...). The engine's processes
    inherit it when they start, which is inside this block; left in place it
    would reach every later engine of the process (a deterministic engine would
    take full CUDA graphs from the ones after it). So everything that changed,
    ours or vLLM's, is put back. The names restored are yielded (filled on exit).
    Only one start at a time may use this (`START_LOCK`).
    """
    before = dict(os.environ)
    restored: list[str] = []
    os.environ.update(env)
    try:
        yield restored
    finally:
        restored.extend(_restore_environ(before))


def _restore_environ(before: Mapping[str, str]) -> list[str]:
    """Put os.environ back to `before`; the names that had changed, sorted."""
    now = dict(os.environ)
    changed = sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    return changed


def engine_core_processes(engine: Any) -> list[Any]:
    """The engine core processes (multiprocessing.Process objects) vLLM started."""
    try:
        return list(engine.engine_core.resources.engine_manager.processes)
    except AttributeError:  # another vLLM layout, or an external engine
        return []


def engine_processes(engine: Any) -> list[Any]:
    """The engine's processes (psutil): engine core(s) and their workers."""

    procs = []
    for core in engine_core_processes(engine):
        if core.pid is None:
            continue
        try:
            p = psutil.Process(core.pid)
            procs.append(p)
            procs.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    return procs
