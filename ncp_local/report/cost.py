"""What a run cost, by role and stage, read from its call log (`calls.jsonl`, one line per attempt).

Tokens, calls and attempts are plain sums over the log. Engine time comes two ways:
`engine s` sums each attempt's time in the engine; under continuous batching calls
overlap, so that sum exceeds the time the engine was working. The cost figure
(`report.gpu_hour_cost`) therefore prices the engine's busy time instead: every
moment at least one call of a model was in flight, shared equally among the calls
in flight then, times the GPUs the model's engine holds (tensor_parallel_size).
Logs written before calls carried `done_at` have no busy time: their cost is shown
as unknown, never guessed. Each shard ran its own engines, so each is timed apart. The
points of a batched sweep shared their engines in one process, but each point's call log
holds its own calls only: a point's busy time counts the moments it shared with other
points as its own (the sum over the points exceeds the engines' busy time).

`COST_COLUMNS` holds each column's key and header; what each header means is defined once, in
`glossary.COST_GLOSSARY` (the docs' cost table and the HTML tooltips show that text).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bindings import ran_no_model
from ..config import RunConfig, validate
from ..errors import InputError
from ..plan.growth import Growth
from ..protocol.turns import shown as shown_turn
from ..rundir.call_log import CallLine, read_calls
from ..rundir.layout import CALLS, parts
from .runs import Run
from .tables import markdown_table

# (key in the figures and cost.csv, header in the tables); each header's definition is in glossary.py.
COST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("calls", "calls"),
    ("attempts", "attempts"),
    ("prompt_tokens", "prompt tok"),
    ("plan_prompt_tokens", "plan prompt tok"),
    ("cached_tokens", "cached tok"),
    ("generated_tokens", "generated tok"),
    ("cache_hit_pct", "cache hit %"),
    ("engine_s", "engine s"),
    ("busy_s", "busy s"),
    ("cost", "cost"),
)
PER_TURN_NOTE = (
    "per episode-turn: the run's figures divided by its episode-turns (the turns recorded in its "
    "finished episodes); the opening's calls and any unfinished episode's are in the run's figures"
)


# Usage's plain sums over attempts (the analysis tables and the trackers carry the same).
SUMS: tuple[str, ...] = ("calls", "attempts", "prompt_tokens", "cached_tokens", "generated_tokens", "engine_s")


@dataclass
class Usage:
    """One row: sums over the attempts of a role and stage (or of a whole run)."""

    calls: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    engine_s: float = 0.0
    busy_s: float | None = 0.0  # None: some attempt had no `done_at` (an older log)
    gpus: int = 1

    def add(self, call: CallLine) -> None:
        self.attempts += 1
        self.calls += int(call.attempt == 0)
        self.prompt_tokens += call.prompt_tokens or 0
        self.cached_tokens += call.cached_tokens or 0
        self.generated_tokens += call.generated_tokens or 0
        self.engine_s += call.latency_s or 0.0

    def merge(self, other: Usage) -> None:
        for name in SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.busy_s = None if self.busy_s is None or other.busy_s is None else self.busy_s + other.busy_s

    @property
    def cache_hit_pct(self) -> float:
        return 100 * self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan


@dataclass
class CostTable:
    """A run's cost: one row per (role, stage), their total, and its episode-turns."""

    label: str
    rows: dict[tuple[str, str], Usage] = field(default_factory=dict)
    episode_turns: int = 0
    gpu_hour_cost: float | None = None
    costs: dict[tuple[str, str], float | None] = field(default_factory=dict)
    projected: dict[tuple[str, str], float] | None = None  # the plan's prompt tokens for these calls
    projection_note: str = ""  # where the projection came from, or why there is none
    # A run of several trials: each trial's sums over every role and stage, and its cost; the stories
    # played (the per-story row divides the run's figures by them).
    trials: dict[int, Usage] = field(default_factory=dict)
    trial_costs: dict[int, float | None] = field(default_factory=dict)
    stories: int = 0

    @property
    def total(self) -> Usage:
        out = Usage()
        for u in self.rows.values():
            out.merge(u)
        return out

    @property
    def total_cost(self) -> float | None:
        got = list(self.costs.values())
        return None if not got or any(c is None for c in got) else sum(c for c in got if c is not None)


def part_calls(run: Run) -> list[list[CallLine]]:
    """The attempts logged by each part of the run (the run directory, then each shard's): a part ran
    in its own process, on engines of its own."""
    return [read_calls(part / CALLS) for part in parts(run.path) if (part / CALLS).is_file()]


def run_calls(run: Run) -> list[CallLine]:
    """Every attempt logged by the run and its shards."""
    return [c for calls in part_calls(run) for c in calls]


def busy_shares(calls: Sequence[CallLine], key: Callable[[CallLine], Any]) -> dict[Any, float] | None:
    """Busy wall-clock seconds of one engine, charged to `key(call)`: while k calls are in flight, each
    is charged 1/k of the time. None when an attempt lacks its `done_at` (logs of an older rig)."""
    edges: list[tuple[float, int, Any]] = []
    for c in calls:
        end = c.done_at
        if end is None:
            return None
        start = end - (c.latency_s or 0.0)
        edges += [(start, 1, key(c)), (end, -1, key(c))]
    # At one instant, ends before starts: a call that ends as another starts is not in flight with it.
    edges.sort(key=lambda e: (e[0], e[1]))
    in_flight: dict[Any, int] = {}
    shares: dict[Any, float] = {key(c): 0.0 for c in calls}
    last = None
    for t, step, k in edges:
        n = sum(in_flight.values())
        if last is not None and n:
            for group, m in in_flight.items():
                if m:
                    shares[group] += (t - last) * m / n
        in_flight[k] = in_flight.get(k, 0) + step
        last = t
    return shares


# The planning function (execution.preflight.plan_growth, handed down by mode=report): the report
# reads runs and never plans by itself.
Planner = Callable[[RunConfig], Growth]


def plan_projection(
    run: Run, planner: Planner, dataset: str | None = None
) -> tuple[dict[tuple[str, str], float] | None, str]:
    """mode=plan's prompt projection for the run's own calls: each call's stage and turn read off the plan's
    fitted growth, summed by role and stage; or None and why not. The plan is played on the config the
    manifest recorded, with the dataset and prompt pack the run used (`dataset` overrides the path)."""
    raw = copy.deepcopy(run.manifest.get("config") or {})
    if not raw:
        return None, "not projected: the manifest records no config"
    if ran_no_model(raw):
        return None, "not projected: a scripted run (no model, no window)"
    raw.setdefault("dataset", {})["path"] = dataset or (run.manifest.get("dataset") or {}).get("path")
    if (run.manifest.get("prompts") or {}).get("path"):
        raw.setdefault("prompts", {})["dir"] = run.manifest["prompts"]["path"]
    try:
        growth = planner(validate(raw))
    except InputError as exc:
        return None, f"not projected: {exc}"
    out: dict[tuple[str, str], float] = {}
    for c in run_calls(run):
        g = growth.stages.get(c.stage)
        if g is None:
            continue
        key = (c.role, c.stage)
        # The plan's growth counts turns as they are shown (the opening 0, the first player turn 1).
        out[key] = out.get(key, 0.0) + max(0.0, g.prompt_at(shown_turn(c.turn)))
    return out, growth.source


def _gpus(manifest: dict[str, Any], role: str) -> int:
    model = ((manifest.get("config") or {}).get(role) or {}).get("model") or {}
    return max(1, int(model.get("tensor_parallel_size") or 1))


def cost_table(
    run: Run, gpu_hour_cost: float | None = None, plan: Planner | None = None, dataset: str | None = None
) -> CostTable:
    """The run's cost by role and stage; with `plan`, mode=plan's projection of the same calls beside it."""
    by_part = part_calls(run)
    calls = [c for part in by_part for c in part]
    table = CostTable(
        run.label, gpu_hour_cost=gpu_hour_cost, episode_turns=sum(len(r.turns) for r in run.results.values())
    )
    if plan:
        table.projected, table.projection_note = plan_projection(run, plan, dataset)
    trial_of = {r.episode: r.trial for r in run.results.values()}
    several = len(set(trial_of.values())) > 1
    table.stories = len({r.spec_id for r in run.results.values()})
    for c in calls:
        table.rows.setdefault((c.role, c.stage), Usage()).add(c)
        if several:
            table.trials.setdefault(c.trial, Usage()).add(c)
    trial_busy: dict[tuple[str, int], float] = {}
    # One engine per distinct model and process (a shard is a process of its own): its calls share its
    # busy time.
    by_model: dict[tuple[int, str], list[CallLine]] = {}
    for i, part in enumerate(by_part):
        for c in part:
            by_model.setdefault((i, c.model), []).append(c)
    unknown = False
    for group in by_model.values():
        shares = busy_shares(group, lambda c: (c.role, c.stage, c.trial))
        if shares is None:
            unknown = True
            continue
        for (role, stage, trial), s in shares.items():
            table.rows[(role, stage)].busy_s = (table.rows[(role, stage)].busy_s or 0.0) + s
            trial_busy[(role, trial)] = trial_busy.get((role, trial), 0.0) + s
    for (role, stage), u in table.rows.items():
        if unknown:
            u.busy_s = None
        u.gpus = _gpus(run.manifest, role)
        table.costs[(role, stage)] = (
            None if gpu_hour_cost is None else (None if u.busy_s is None else u.busy_s / 3600 * u.gpus * gpu_hour_cost)
        )
    for trial, u in table.trials.items():
        u.busy_s = None if unknown else sum(s for (_, t), s in trial_busy.items() if t == trial)
        priced = [s / 3600 * _gpus(run.manifest, role) for (role, t), s in trial_busy.items() if t == trial]
        table.trial_costs[trial] = None if gpu_hour_cost is None or unknown else sum(priced) * gpu_hour_cost
    table.rows = dict(sorted(table.rows.items()))
    table.trials = dict(sorted(table.trials.items()))
    return table


# ---- rendering ---------------------------------------------------------------------

# Decimals of each column: (the run's figures, per episode-turn).
DECIMALS: dict[str, tuple[int, int]] = {
    "calls": (0, 2),
    "attempts": (0, 2),
    "prompt_tokens": (0, 0),
    "plan_prompt_tokens": (0, 0),
    "cached_tokens": (0, 0),
    "generated_tokens": (0, 0),
    "cache_hit_pct": (1, 1),
    "engine_s": (1, 2),
    "busy_s": (1, 2),
    "cost": (4, 6),
}


def columns(table: CostTable) -> list[str]:
    """The keys shown: `cost` only with a price, the plan's projection only when there is one."""
    return [
        k
        for k, _ in COST_COLUMNS
        if (k != "cost" or table.gpu_hour_cost is not None) and (k != "plan_prompt_tokens" or table.projected)
    ]


def _values(u: Usage, cost: float | None, projected: float | None, per: float) -> dict[str, float | None]:
    """The row's figures divided by `per` (1 for the run's own figures: counts stay integers)."""

    def d(x: float | None) -> float | None:
        return None if x is None else x if per == 1 else x / per

    return {
        "calls": d(u.calls),
        "attempts": d(u.attempts),
        "prompt_tokens": d(u.prompt_tokens),
        "plan_prompt_tokens": d(None if projected is None else round(projected)),
        "cached_tokens": d(u.cached_tokens),
        "generated_tokens": d(u.generated_tokens),
        "cache_hit_pct": u.cache_hit_pct,
        "engine_s": u.engine_s / per,
        "busy_s": d(u.busy_s),
        "cost": d(cost),
    }


def rows_of(table: CostTable) -> Iterable[tuple[str, str, str, dict[str, float | None]]]:
    """(per, role, stage, values) for the run's figures, then per episode-turn; a run of several trials
    then has each trial's figures (`trial k`, every role and stage) and the average story's (`story`)."""
    total = table.total
    proj = table.projected or {}
    for per, div in (("run", 1.0), ("episode-turn", float(table.episode_turns))):
        if not div:
            continue
        for key, u in table.rows.items():
            yield per, key[0], key[1], _values(u, table.costs.get(key), proj.get(key), div)
        yield per, "all", "all", _values(total, table.total_cost, sum(proj.values()) if proj else None, div)
    if table.trials:
        for trial, u in table.trials.items():
            yield f"trial {trial}", "all", "all", _values(u, table.trial_costs.get(trial), None, 1.0)
        if table.stories:
            yield "story", "all", "all", _values(total, table.total_cost, None, float(table.stories))


def headers(table: CostTable) -> list[str]:
    names = dict(COST_COLUMNS)
    return [names[k] for k in columns(table)]


def _num(x: float | None, d: int) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{d}f}"


def cells(table: CostTable, per: str, values: dict[str, float | None]) -> list[str]:
    i = 0 if per == "run" or per.startswith("trial ") else 1  # sums as integers, averages with decimals
    return [_num(values[k], DECIMALS[k][i]) for k in columns(table)]


def table_note(t: CostTable) -> str:
    return (
        f"{t.episode_turns} episode-turns"
        + (f"; cost at {t.gpu_hour_cost:g} per GPU-hour" if t.gpu_hour_cost is not None else "")
        + ("; busy time unknown (a call log without done_at)" if t.total.busy_s is None else "")
        + (f"; plan: {t.projection_note}" if t.projection_note else "")
        + (
            f"; `trial k`: that trial's calls in all {t.stories} stories; `story`: the run's figures per story "
            "(all its trials)"
            if t.trials
            else ""
        )
    )


def cost_markdown(tables: Sequence[CostTable]) -> str:
    out: list[str] = []
    for t in tables:
        body = [[per, role, stage, *cells(t, per, v)] for per, role, stage, v in rows_of(t)]
        out.append(
            f"### {t.label}\n\n"
            + markdown_table(["per", "role", "stage", *headers(t)], body, 3)
            + f"\n\n{table_note(t)}"
        )
    return "\n\n".join(out)


def _csv_value(v: float | None) -> Any:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)


def cost_rows_csv(tables: Sequence[CostTable]) -> tuple[list[str], list[list[Any]]]:
    """Every column for every run (empty where a run has no figure), so runs share one header."""
    header = ["label", "per", "role", "stage", *(k for k, _ in COST_COLUMNS), "episode_turns", "gpu_hour_cost"]
    body: list[list[Any]] = []
    for t in tables:
        shown = set(columns(t))
        for per, role, stage, values in rows_of(t):
            body.append(
                [
                    t.label,
                    per,
                    role,
                    stage,
                    *(_csv_value(values[k]) if k in shown else "" for k, _ in COST_COLUMNS),
                    t.episode_turns,
                    "" if t.gpu_hour_cost is None else t.gpu_hour_cost,
                ]
            )
    return header, body
