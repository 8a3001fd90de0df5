"""What a run cost, by role and stage, read from its call log (`calls.jsonl`, one line per attempt).

Tokens, calls and attempts are plain sums over the log. Engine time comes two ways:
`engine s` sums each attempt's time in the engine; under continuous batching calls
overlap, so that sum exceeds the time the engine was working. The cost figure
(`report.gpu_hour_cost`) therefore prices the engine's busy time instead: every
moment at least one call of a model was in flight, shared equally among the calls
in flight then, times the GPUs the model's engine holds (tensor_parallel_size).
Logs written before calls carried `done_at` have no busy time: their cost is shown
as unknown, never guessed.

`COST_COLUMNS` holds each column's header and its one-sentence definition (the
README's glossary and the HTML tooltips use the same text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..execution.layout import CALLS, parts
from ..execution.store import read_calls
from .runs import Run
from .tables import markdown_table

# (key, header, definition): the definitions are the glossary's and the HTML's tooltips.
COST_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("calls", "calls", "questions the stage asked a model; a question retried after an invalid answer counts once"),
    ("attempts", "attempts", "requests sent to the engine, retries included (one line of calls.jsonl each)"),
    ("prompt_tokens", "prompt tok", "prompt tokens of every attempt, the cached ones included"),
    ("cached_tokens", "cached tok", "prompt tokens the engine's prefix cache served instead of computing them"),
    ("generated_tokens", "generated tok", "tokens the model generated, over every attempt"),
    ("cache_hit_pct", "cache hit %", "cached tokens as a share of prompt tokens"),
    ("engine_s", "engine s", "seconds the attempts spent in the engine, summed; calls batched together each count "
                             "their own time, so this exceeds the time the engine was busy"),
    ("busy_s", "busy s", "the engine's busy wall-clock seconds charged to this stage: each moment a model's engine "
                         "worked is shared equally among the calls in flight then"),
    ("cost", "cost", "busy hours x the GPUs of the model's engine (tensor_parallel_size) x report.gpu_hour_cost"),
)
COST_DEFINITIONS: dict[str, str] = {h: d for _, h, d in COST_COLUMNS}
PER_TURN_NOTE = ("per episode-turn: the run's figures divided by its episode-turns (the turns recorded in its "
                 "finished episodes); the opening's calls and any unfinished episode's are in the run's figures")


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

    def add(self, call: dict[str, Any]) -> None:
        self.attempts += 1
        self.calls += int(call.get("attempt", 0) == 0)
        self.prompt_tokens += int(call.get("prompt_tokens") or 0)
        self.cached_tokens += int(call.get("cached_tokens") or 0)
        self.generated_tokens += int(call.get("generated_tokens") or 0)
        self.engine_s += float(call.get("latency_s") or 0.0)

    def merge(self, other: "Usage") -> None:
        for name in ("calls", "attempts", "prompt_tokens", "cached_tokens", "generated_tokens", "engine_s"):
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


def run_calls(run: Run) -> list[dict[str, Any]]:
    """Every attempt logged by the run and its shards."""
    out: list[dict[str, Any]] = []
    for part in parts(run.path):
        if (part / CALLS).is_file():
            out += read_calls(part / CALLS)
    return out


def busy_shares(calls: Sequence[dict[str, Any]], key: Any) -> dict[Any, float] | None:
    """Busy wall-clock seconds of one engine, charged to `key(call)`: while k calls are in flight, each
    is charged 1/k of the time. None when an attempt lacks its `done_at` (logs of an older rig)."""
    edges: list[tuple[float, int, Any]] = []
    for c in calls:
        end = c.get("done_at")
        if end is None:
            return None
        start = float(end) - float(c.get("latency_s") or 0.0)
        edges += [(start, 1, key(c)), (float(end), -1, key(c))]
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


def _gpus(manifest: dict[str, Any], role: str) -> int:
    model = ((manifest.get("config") or {}).get(role) or {}).get("model") or {}
    return max(1, int(model.get("tensor_parallel_size") or 1))


def cost_table(run: Run, gpu_hour_cost: float | None = None) -> CostTable:
    calls = run_calls(run)
    table = CostTable(run.label, gpu_hour_cost=gpu_hour_cost,
                      episode_turns=sum(len(r.turns) for r in run.results.values()))
    for c in calls:
        table.rows.setdefault((str(c.get("role", "")), str(c.get("stage", ""))), Usage()).add(c)
    # One engine per distinct model: its calls share its busy time.
    by_model: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        by_model.setdefault(str(c.get("model", "")), []).append(c)
    unknown = False
    for group in by_model.values():
        shares = busy_shares(group, lambda c: (str(c.get("role", "")), str(c.get("stage", ""))))
        if shares is None:
            unknown = True
            continue
        for k, s in shares.items():
            table.rows[k].busy_s = (table.rows[k].busy_s or 0.0) + s
    for (role, stage), u in table.rows.items():
        if unknown:
            u.busy_s = None
        u.gpus = _gpus(run.manifest, role)
        table.costs[(role, stage)] = None if gpu_hour_cost is None else (
            None if u.busy_s is None else u.busy_s / 3600 * u.gpus * gpu_hour_cost)
    table.rows = dict(sorted(table.rows.items()))
    return table


# ---- rendering ---------------------------------------------------------------------

def _num(x: float | None, d: int) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{d}f}"


def _values(u: Usage, cost: float | None, per: float) -> list[float | None]:
    """The row's figures divided by `per` (1 for the run's own figures: counts stay integers)."""
    def d(x: float) -> float:
        return x if per == 1 else x / per

    return [d(u.calls), d(u.attempts), d(u.prompt_tokens), d(u.cached_tokens), d(u.generated_tokens),
            u.cache_hit_pct, u.engine_s / per, None if u.busy_s is None else u.busy_s / per,
            None if cost is None else cost / per]


DECIMALS = {"run": (0, 0, 0, 0, 0, 1, 1, 1, 4), "episode-turn": (2, 2, 0, 0, 0, 1, 2, 2, 6)}


def rows_of(table: CostTable) -> Iterable[tuple[str, str, str, list[float | None]]]:
    """(per, role, stage, values) for the run's figures, then per episode-turn."""
    total = table.total
    for per, div in (("run", 1.0), ("episode-turn", float(table.episode_turns))):
        if not div:
            continue
        for (role, stage), u in table.rows.items():
            yield per, role, stage, _values(u, table.costs.get((role, stage)), div)
        yield per, "all", "all", _values(total, table.total_cost, div)


def headers(with_cost: bool) -> list[str]:
    return [h for k, h, _ in COST_COLUMNS if with_cost or k != "cost"]


def cells(per: str, values: list[float | None], with_cost: bool) -> list[str]:
    shown = [_num(v, d) for v, d in zip(values, DECIMALS[per])]
    return shown if with_cost else shown[:-1]


def cost_markdown(tables: Sequence[CostTable]) -> str:
    parts_: list[str] = []
    for t in tables:
        with_cost = t.gpu_hour_cost is not None
        body = [[per, role, stage, *cells(per, v, with_cost)] for per, role, stage, v in rows_of(t)]
        parts_.append(f"### {t.label}\n\n" + markdown_table(["per", "role", "stage", *headers(with_cost)], body, 3)
                      + f"\n\n{t.episode_turns} episode-turns"
                      + (f"; cost at {t.gpu_hour_cost:g} per GPU-hour" if with_cost else "")
                      + (("; busy time unknown (a call log without done_at)" if t.total.busy_s is None else "")))
    return "\n\n".join(parts_)


def cost_rows_csv(tables: Sequence[CostTable]) -> tuple[list[str], list[list[Any]]]:
    header = ["label", "per", "role", "stage", *(k for k, _, _ in COST_COLUMNS), "episode_turns", "gpu_hour_cost"]
    body: list[list[Any]] = []
    for t in tables:
        for per, role, stage, values in rows_of(t):
            body.append([t.label, per, role, stage,
                         *("" if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)
                           for v in values), t.episode_turns, "" if t.gpu_hour_cost is None else t.gpu_hour_cost])
    return header, body
