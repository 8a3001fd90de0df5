"""The plan of a config: its engines, memory and window checks, the projected prompts, the verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..bindings import Bindings, bind
from ..config import ConfigError, RunConfig
from ..protocol import ROLES
from ..protocol.turns import at as said_at
from ..protocol.turns import id_of as turn_id_of
from ..protocol.turns import label as turn_label
from .gpus import plan_gpu
from .growth import Growth, StageGrowth
from .hardware import Inventory, inventory
from .memory import (
    EnginePlan,
    Problem,
    apply,
    check_windows,
    engines_of,
    plan_cpu,
    read_facts,
)

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
    cfg: RunConfig
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


def check(
    cfg: RunConfig, roles: tuple[str, ...] = ROLES, on_disk_only: bool = False, bindings: Bindings | None = None
) -> Plan:
    """Engines, devices, shares and window checks: the part `mode=run` needs, no prompt play.

    `on_disk_only`: plan only the models whose files are here (mode=run: the others fail its path check).
    `bindings`: the roles as resolved (default: from `cfg`; a batched sweep plans a group's engines as
    pseudo-roles under its first point's config)."""
    pc = cfg.plan
    inv = inventory(pc.gpus)
    problems: list[Problem] = []
    bindings = bind(cfg) if bindings is None else bindings
    remote = bindings.served(roles)
    local = bindings.in_process(roles)  # in this process: planned
    if not local:
        return Plan(cfg, inv, [], problems, remote=remote)
    engines = engines_of(bindings, local)
    read_facts(engines, problems, on_disk_only, on_gpu=inv.kind == "gpu")
    check_windows(bindings, engines, problems)
    if inv.kind == "gpu":
        lines = plan_gpu(engines, inv, pc, problems)
    else:
        lines = []
        plan_cpu(engines, inv, pc, problems)
    return Plan(cfg, inv, engines, problems, lines, remote=remote)


def planned(cfg: RunConfig, roles: tuple[str, ...] = ROLES) -> RunConfig:
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


def thinking_reserve(cfg: RunConfig, role: str) -> int:
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


def sequence_at(plan: Plan, e: EnginePlan, turn: int) -> int:
    rows = [r for r in plan.rows if r.engine is e]
    if not rows:
        return 0
    return int(min(e.window, max(r.growth.prompt_at(turn) + r.need for r in rows if r.growth.runs_at(turn))))


def turn_name(t: int) -> str:
    """The plan counts turns as people do (opening 0, then 1, 2, ...): protocol/turns.py."""
    return turn_label(turn_id_of(t))


def _at(t: int) -> str:
    return said_at(turn_id_of(t))
