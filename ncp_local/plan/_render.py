"""The plan as `mode=plan` prints it: one section per engine, the window table and the verdict."""

from __future__ import annotations

import math

from ._check import KV_BOUND_EPISODES, Plan, footprint_at, sequence_at, turn_name
from .facts import ModelFacts
from .hardware import GIB
from .kv import describe
from .memory import (
    CPU_RUNTIME_BYTES,
    EnginePlan,
    gib,
)


def _turns(plan: Plan) -> list[int]:
    T = int(plan.cfg.max_turns)
    return sorted({t for t in plan.cfg.plan.at_turns if 0 <= t < T} | {T})


def render(plan: Plan) -> list[str]:
    cfg = plan.cfg
    out = [
        f"plan: {cfg.engine.name} engine(s), max_turns={cfg.max_turns}, concurrency={cfg.concurrency}, "
        f"dataset {cfg.dataset.name}, method {cfg.method.get('name', 'baseline')}, "
        f"condition {cfg.condition.get('name', '')}"
    ]
    for role in plan.remote:
        out.append(
            f"remote: {role} on an OpenAI-compatible endpoint, not in this process: not planned here "
            "(the run's health check asks the server what it serves and whether its window holds the "
            "first turn)"
        )
    if plan.engines:
        if plan.inventory.kind == "cpu":
            out.append(
                f"hardware: {plan.inventory.describe()}: the plan is for the CPU (the share is of RAM, "
                "for the KV cache); GPU checks skipped"
            )
        else:
            out.append(f"hardware: {plan.inventory.describe()}")
    T = int(cfg.max_turns)
    for e in plan.engines:
        dev = (
            f"devices {list(e.devices)}{' (planned)' if e.devices_planned else ''}"
            if plan.inventory.kind == "gpu"
            else ""
        )
        share = "" if e.share is None else f"share {e.share:.3f}{' (planned)' if e.share_planned else ''}"
        out.append(
            f"engine {e.index + 1}: {e.name} for {', '.join(e.roles)}; {dev + ', ' if dev else ''}"
            f"tensor_parallel_size {e.tp}{', ' + share if share else ''}"
        )
        f = e.facts
        if f is None:
            out.append("  model facts unknown: memory not planned")
            continue
        out.append(f"  weights {gib(e.weights_bytes)}{_size(e, f)} ({f.source})")
        out.append(_kv_line(e, f))
        if e.kv is None:
            continue
        per = "per GPU" if plan.inventory.kind == "gpu" else "in RAM"
        out.append(f"  {describe(e.kv, per)}")
        out.append(_assumed(plan, e))
        line = (
            f"  KV capacity {gib(e.kv_bytes)} {per} = {e.capacity_tokens():,} tokens = {e.windows():.1f} full windows"
            if e.window_kv()
            else "  KV capacity unknown"
        )
        seq = sequence_at(plan, e, T)
        if seq:
            at_once = e.sequences_at(seq)
            line += (
                f"; episodes at once at turn {T}: {min(at_once, cfg.concurrency):.1f} "
                f"({seq:,}-token calls; concurrency={cfg.concurrency})"
            )
            if at_once < min(cfg.concurrency, KV_BOUND_EPISODES) and e.kv_bytes:
                e.notes.append(
                    f"the KV cache holds {at_once:.1f} of the {cfg.concurrency} episodes' calls at turn "
                    f"{T}: the rest wait in the engine's queue; more or larger GPUs, "
                    "engine_args.kv_cache_dtype=fp8 or a lower max_model_len raise it"
                )
        out.append(line)
        out.extend(_admission_lines(plan, e))
        out.extend(f"  note: {n}" for n in e.notes)
    out.extend(plan.device_lines)
    if plan.growth is not None:
        out.append(f"prompts: {plan.growth.source}")
        if plan.growth.tokenizers:
            out.append("tokens counted with: " + "; ".join(f"{r} {t}" for r, t in plan.growth.tokenizers.items()))
        turns = _turns(plan)
        out.append(
            "| stage | role | model | window | answer | tokens by turn | "
            + " | ".join(turn_name(t) for t in turns)
            + " | first turn over |"
        )
        out.append("|---|---|---|---:|---:|---|" + "---:|" * len(turns) + "---|")
        for r in plan.rows:
            cells = " | ".join(f"{r.growth.prompt_at(t) + r.need:,.0f}" if r.growth.runs_at(t) else "-" for t in turns)
            over = "-" if r.first_over is None else turn_name(r.first_over)
            out.append(
                f"| {r.stage} | {r.role} | {r.engine.name if r.engine else '-'} | {r.window or '-'} | "
                f"{r.need} | {r.growth.line.text()} | {cells} | {over} |"
            )
        out.append(
            "(cells: prompt + answer tokens; turn N is the N-th player turn, after the opening; "
            "'first turn over': the first turn "
            "whose call does not fit its window)"
        )
    for p in plan.problems:
        if not p.fatal:
            out.append(f"note: {p.message}")
    for p in plan.fatal[1:]:
        out.append(f"also: {p.message}")
    return out


def _admission_lines(plan: Plan, e: EnginePlan) -> list[str]:
    """Per listed turn: the episodes whose prefixes the cache holds, what admission runs at once, and
    what running `concurrency` anyway would recompute; the offload size that would hold the rest."""
    cfg, cap = plan.cfg, e.capacity_tokens()
    if not cap or not plan.rows:
        return []
    n = int(cfg.concurrency)
    cells, last = [], None
    for t in _turns(plan):
        fp = footprint_at(plan, e, t)
        if fp:
            fit = cap / fp
            cells.append(f"turn {t}: {fit:.1f} fit, {max(1, min(n, int(fit)))} admitted")
            last = (t, fp, fit)
    if last is None:
        return []
    out = [
        f"  admission by cache (every in-flight episode's prefixes resident): {'; '.join(cells)} "
        f"(concurrency={n} is the most)"
    ]
    t, fp, fit = last
    if fit < n:
        prompts = int(sum(r.growth.prompt_at(t) for r in plan.rows if r.engine is e and r.growth.runs_at(t)))
        per_token = e.kv.bytes_per_token() * e.tp if e.kv else 0
        kept = max(1, int(fit))
        rest = (n - kept) * fp * per_token
        out.append(
            f"  without offload: admission keeps {kept} of {n} episodes in flight at turn {t} and "
            f"recomputes nothing it can keep; all {n} at once would evict each other's prefixes and "
            f"recompute ~{prompts:,} prompt tokens per episode-turn (every call's whole prompt)"
        )
        if per_token:
            out.append(
                f"  offload: engine_args.kv_offloading_size={math.ceil(rest / GIB)} (GiB of host RAM, vLLM "
                f"0.33) would keep the other {n - kept} episodes' prefixes at turn {t} in host memory; "
                "the node needs that much RAM free beside the engines"
            )
    return out


def _kv_line(e: EnginePlan, f: ModelFacts) -> str:
    """The KV cache per token on one device, as vLLM lays it out, and the window."""
    kv = e.kv
    longest = f.extended_window(e.engine_arg("hf_overrides"))
    scaled = f", {longest} with its rope scaling" if longest != f.native_window else ""
    window = f"window {e.window} (model: {f.native_window}{scaled})"
    if f.latent_dim:
        return f"  KV cache {_per_token(e, f)}; {window}"
    heads = kv.kv_heads if kv else f.kv_heads
    split = (
        f" per GPU ({f.kv_heads} over tensor parallel {e.tp}{', replicated' if f.kv_heads < e.tp else ''})"
        if e.tp > 1
        else ""
    )
    slide = (
        f", {kv.sliding_layers} of them sliding-window layers of {kv.sliding_window} tokens"
        if kv and kv.sliding_layers
        else ""
    )
    per_token = kv.bytes_per_token() if kv else f.kv_bytes_per_token(e.kv_dtype_bytes, e.tp)
    return (
        f"  KV cache {per_token / 1024:.0f} KiB/token ({f.layers} layers x {heads} KV heads{split} x "
        f"{f.head_dim} head dim x K,V x {e.kv_dtype_bytes} bytes{slide}); {window}"
    )


def _per_token(e: EnginePlan, f: ModelFacts) -> str:
    """MLA's cache per token and GPU: one latent vector a layer, the same on every tensor-parallel rank."""
    kv = e.kv
    per_token = kv.bytes_per_token() if kv else f.kv_bytes_per_token(e.kv_dtype_bytes, e.tp)
    latent = (
        f"{e.kv_state_bytes}-byte packed latent (kv_cache_dtype {e.engine_arg('kv_cache_dtype')})"
        if e.kv_state_bytes
        else f"{f.latent_dim} latent elements x {e.kv_dtype_bytes} bytes"
    )
    indexer = f" + {f.indexer_bytes} bytes of indexer keys" if f.indexer_bytes else ""
    every = f", whole on each of the {e.tp} GPUs (MLA: tensor parallel does not split it)" if e.tp > 1 else ""
    return f"{per_token / 1024:.1f} KiB/token (MLA: {f.layers} layers x ({latent}{indexer}){every})"


def _size(e: EnginePlan, f: ModelFacts) -> str:
    """Parameters, active parameters and the checkpoint's quantization, where known."""
    parts = []
    if f.params:
        parts.append(f"{f.params / 1e9:.1f} B parameters")
    if f.experts:
        active = f", {f.active_params / 1e9:.1f} B active" if f.active_params else ""
        parts.append(f"MoE: {f.active_experts} of {f.experts} experts per token{active}")
    if f.quantization:
        parts.append(f"stored {f.quantization}, loaded as stored")
    if e.gpus > 1:
        parts.append(f"{gib(e.weights_at(e.tp))} per GPU")
    return f": {'; '.join(parts)}" if parts else ""


def _assumed(plan: Plan, e: EnginePlan) -> str:
    """What the memory plan takes on trust, and the setting that changes it."""
    assert e.kv is not None
    if plan.inventory.kind != "gpu":
        return (
            f"  assumed: {gib(CPU_RUNTIME_BYTES)} of worker runtime beside the weights (measured on vLLM 0.32's "
            "CPU worker)"
        )
    overhead = float(plan.cfg.plan.overhead_gib)
    return (
        f"  assumed: {overhead:g} GiB per GPU beyond weights and KV cache (plan.overhead_gib) for the activation "
        f"peak of a {e.kv.step_tokens}-token step ({e.path}.engine_args.max_num_batched_tokens), CUDA graphs "
        "(inside the share in vLLM 0.33) and NCCL and attention buffers; not measured on a GPU: the engine's "
        "'Available KV cache memory' log line gives the real figure"
    )
