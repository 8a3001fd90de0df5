"""The memory, KV and window plan: will this config fit its GPUs and its context windows, before
anything loads? (vLLM's own sizing rules; `mode=plan` prints it, modes/plan.py.)

For the resolved config the plan shows each engine (model, the roles that
share it, devices, tensor parallel, memory share), its weights and KV cache
per token, the KV capacity in tokens and in episodes at once, the prompt
length each stage reaches by turn, the first turn a call no longer fits its
window, and a verdict. Every job's pre-flight (execution/preflight.py) makes
the same memory and window checks first (`planned`, no prompt play, fast)
and starts the engines with the planned shares and devices.

Verdicts: 0 go; 1 it would start, but some call outgrows its window before
`max_turns` (those episodes end `context_limit`); 2 it cannot start as
configured (the one line says what to change). May import config, protocol
and engines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError, role_kind
from ..protocol import ROLES
from ..protocol.turns import at as said_at
from ..protocol.turns import id_of as turn_id_of
from ..protocol.turns import label as turn_label
from .facts import ModelFacts, model_facts
from .growth import Growth, Line, StageGrowth, fit_line
from .hardware import GIB, Gpu, Inventory, inventory, parse_gpu
from .kv import describe
from .memory import (
    CPU_RUNTIME_BYTES,
    EnginePlan,
    Problem,
    apply,
    check_windows,
    engines_of,
    plan_cpu,
    plan_gpu,
    read_facts,
    share_is_planned,
)

__all__ = [
    "Line",
    "fit_line",
    "Plan",
    "footprint_at",
    "planned",
    "check",
    "render",
    "verdict",
    "project",
    "inventory",
    "parse_gpu",
    "Gpu",
    "ModelFacts",
    "model_facts",
    "share_is_planned",
]

# Verdicts (`mode=plan` exits with EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT for them: modes/plan.py).
GO, OVERFLOW, CANNOT = "go", "overflow", "cannot"
# Below this many episodes in flight at max_turns the plan notes that the run is KV-bound.
KV_BOUND_EPISODES = 8


@dataclass(frozen=True)
class StageRow:
    stage: str
    role: str
    engine: EnginePlan | None
    growth: StageGrowth
    need: int  # output room the call must keep: its answer, within max_tokens
    max_tokens: int
    first_over: int | None  # the first turn (0 = opening) whose prompt + need exceeds the window

    @property
    def window(self) -> int:
        return self.engine.window if self.engine else 0


@dataclass
class Plan:
    cfg: Any
    inventory: Inventory
    engines: list[EnginePlan]
    problems: list[Problem]
    device_lines: list[str] = field(default_factory=list)
    growth: Growth | None = None
    rows: list[StageRow] = field(default_factory=list)
    # Roles on an endpoint: not in this process, so not planned here (the run's health check asks the
    # server what it serves and whether its window holds the first turn).
    remote: tuple[str, ...] = ()

    @property
    def fatal(self) -> list[Problem]:
        return [p for p in self.problems if p.fatal]

    def engine_for(self, role: str) -> EnginePlan | None:
        return next((e for e in self.engines if role in e.roles), None)

    @property
    def overflow(self) -> StageRow | None:
        hits = [r for r in self.rows if r.first_over is not None]
        return min(hits, key=lambda r: (r.first_over, r.stage)) if hits else None


def check(cfg: Any, roles: tuple[str, ...] = ROLES, on_disk_only: bool = False) -> Plan:
    """Engines, devices, shares and window checks: the part `mode=run` needs, no prompt play.

    `on_disk_only`: plan only the models whose files are here (mode=run: the others fail its path check)."""
    pc = cfg.plan
    inv = inventory(pc.gpus)
    problems: list[Problem] = []
    remote = tuple(r for r in roles if role_kind(cfg, r).served)
    local = tuple(r for r in roles if role_kind(cfg, r).in_process)  # in this process: planned
    if not local:
        return Plan(cfg, inv, [], problems, remote=remote)
    engines = engines_of(cfg, local)
    read_facts(engines, problems, on_disk_only, on_gpu=inv.kind == "gpu")
    check_windows(cfg, engines, problems)
    if inv.kind == "gpu":
        lines = plan_gpu(engines, inv, pc, problems)
    else:
        lines = []
        plan_cpu(engines, inv, pc, problems)
    return Plan(cfg, inv, engines, problems, lines, remote=remote)


def planned(cfg: Any, roles: tuple[str, ...] = ROLES) -> Any:
    """The pre-flight's first step: refuse a plan that cannot work (one line, exit 2), else the config as planned."""
    plan = check(cfg, roles, on_disk_only=True)
    if plan.fatal:
        p = plan.fatal[0]
        raise ConfigError(p.field, f"plan: {p.message} (details: python run.py mode=plan ...same overrides)")
    return apply(cfg, plan.engines)


# ---- the full plan ------------------------------------------------------------------


def project(plan: Plan, growth: Growth) -> None:
    cfg = plan.cfg
    T = int(cfg.max_turns)
    plan.growth = growth
    for stage, g in sorted(growth.stages.items()):
        role = g.role if g.role in ROLES else ""
        e = plan.engine_for(role) if role else None
        max_tokens = int(getattr(cfg, role).max_tokens) if role else 0
        need = (min(g.need, max_tokens) if max_tokens else g.need) + thinking_reserve(cfg, role)
        first = None
        if e is not None:
            limit = e.window - need
            if g.opening is not None and g.opening > limit:
                first = 0
            elif not g.opening_only:
                first = g.line.first_over(limit, 1, T)
        plan.rows.append(StageRow(stage, role, e, g, need, max_tokens, first))
        if max_tokens and g.need > max_tokens:
            plan.problems.append(
                Problem(
                    f"{role}.max_tokens",
                    f"{stage}: its answer took {g.need} tokens, above "
                    f"{role}.max_tokens={max_tokens}: answers would be cut",
                    fatal=False,
                )
            )


def thinking_reserve(cfg: Any, role: str) -> int:
    """Output tokens a role's calls reserve for thinking: its model's thinking_budget when it thinks.

    A thought is generated in its own call and never shown in a later prompt (the prompt lines
    hold none), so it counts in the window of the turn it is generated only, as the engine
    reserves it (engines/vllm.output_budget)."""
    model = getattr(cfg, role).model if role else None
    return int(model.thinking_budget) if model is not None and getattr(model, "thinking", False) else 0


def _tokens_needed(plan: Plan, row: StageRow) -> int:
    T = int(plan.cfg.max_turns)
    return int(math.ceil(row.growth.prompt_at(T) + row.need))


def _overflow_fix(plan: Plan, row: StageRow) -> str:
    e = row.engine
    assert e is not None
    needed = _tokens_needed(plan, row)
    field_ = f"{row.role}.model.max_model_len"
    T = int(plan.cfg.max_turns)
    last_ok = (row.first_over or 1) - 1
    if e.facts is not None:
        longest = e.facts.extended_window(e.engine_arg("hf_overrides"))
        if longest >= needed:
            return f"set {field_}={_round_up(needed, longest)} (the model holds {longest})"
    fewer = f", or max_turns={last_ok}" if last_ok >= 1 else ""
    return (
        f"a model with a window of {needed}+ tokens, rope scaling (YaRN) through "
        f"{row.role}.model.engine_args.hf_overrides with a larger {field_}{fewer} (turn {T} needs {needed})"
    )


def _round_up(needed: int, cap: int) -> int:
    return min(cap, int(math.ceil(needed / 1024) * 1024))


def verdict(plan: Plan) -> tuple[str, str]:
    if plan.fatal:
        return CANNOT, f"verdict: no-go: {plan.fatal[0].message}"
    row = plan.overflow
    if row is not None and row.engine is not None and row.first_over is not None:  # an overflow has a first turn
        return OVERFLOW, (
            f"verdict: no-go for {plan.cfg.max_turns} turns: {row.stage} ({row.role}, "
            f"{row.engine.name}) outgrows its {row.window}-token window {_at(row.first_over)}, "
            f"so episodes still running then end context_limit: {_overflow_fix(plan, row)}"
        )
    if not plan.engines and not plan.remote:
        return GO, "verdict: go: engine=scripted loads no model; nothing to fit"
    if not plan.engines:
        return GO, (
            f"verdict: go: no engine in this process ({', '.join(plan.remote)} on an endpoint: checked "
            "against the server when the run starts)"
        )
    remote = (
        f"; {', '.join(plan.remote)} on an endpoint (checked against the server when the run starts)"
        if plan.remote
        else ""
    )
    return GO, (
        f"verdict: go: {len(plan.engines)} engine(s) on {plan.inventory.describe()}; every call fits its "
        f"window through turn {plan.cfg.max_turns}{remote}"
    )


def _turn_name(t: int) -> str:
    """The plan counts turns as people do (opening 0, then 1, 2, ...): protocol/turns.py."""
    return turn_label(turn_id_of(t))


def _at(t: int) -> str:
    return said_at(turn_id_of(t))


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


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
        out.append(f"  weights {_gib(e.weights_bytes)}{_size(e, f)} ({f.source})")
        out.append(_kv_line(e, f))
        if e.kv is None:
            continue
        per = "per GPU" if plan.inventory.kind == "gpu" else "in RAM"
        out.append(f"  {describe(e.kv, per)}")
        out.append(_assumed(plan, e))
        line = (
            f"  KV capacity {_gib(e.kv_bytes)} {per} = {e.capacity_tokens():,} tokens = {e.windows():.1f} full windows"
            if e.window_kv()
            else "  KV capacity unknown"
        )
        seq = _sequence_at(plan, e, T)
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
            + " | ".join(_turn_name(t) for t in turns)
            + " | first turn over |"
        )
        out.append("|---|---|---|---:|---:|---|" + "---:|" * len(turns) + "---|")
        for r in plan.rows:
            cells = " | ".join(f"{r.growth.prompt_at(t) + r.need:,.0f}" if r.growth.runs_at(t) else "-" for t in turns)
            over = "-" if r.first_over is None else _turn_name(r.first_over)
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


def footprint_at(plan: Plan, e: EnginePlan, turn: int) -> int:
    """An episode's resident prefix on engine `e` at `turn`: every stage's prompt + answer there. An
    upper bound of what the admission counts (execution/admission.py subtracts the prefixes stages
    share, which it measures on the prompts a run sends; the projection has no prompt texts)."""
    return int(
        sum(
            min(e.window, r.growth.prompt_at(turn) + r.need)
            for r in plan.rows
            if r.engine is e and r.growth.runs_at(turn)
        )
    )


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
        parts.append(f"{_gib(e.weights_at(e.tp))} per GPU")
    return f": {'; '.join(parts)}" if parts else ""


def _assumed(plan: Plan, e: EnginePlan) -> str:
    """What the memory plan takes on trust, and the setting that changes it."""
    assert e.kv is not None
    if plan.inventory.kind != "gpu":
        return (
            f"  assumed: {_gib(CPU_RUNTIME_BYTES)} of worker runtime beside the weights (measured on vLLM 0.32's "
            "CPU worker)"
        )
    overhead = float(plan.cfg.plan.overhead_gib)
    return (
        f"  assumed: {overhead:g} GiB per GPU beyond weights and KV cache (plan.overhead_gib) for the activation "
        f"peak of a {e.kv.step_tokens}-token step ({e.path}.engine_args.max_num_batched_tokens), CUDA graphs "
        "(inside the share in vLLM 0.33) and NCCL and attention buffers; not measured on a GPU: the engine's "
        "'Available KV cache memory' log line gives the real figure"
    )


def _sequence_at(plan: Plan, e: EnginePlan, turn: int) -> int:
    rows = [r for r in plan.rows if r.engine is e]
    if not rows:
        return 0
    return int(min(e.window, max(r.growth.prompt_at(turn) + r.need for r in rows if r.growth.runs_at(turn))))
