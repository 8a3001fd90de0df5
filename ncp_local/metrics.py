"""Per-episode and aggregate metrics (PROTOCOL section 5).

Everything is computed from an episode's final committed state and its turn
records. `invalid` episodes are counted but kept out of the averages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from .episode import EpisodeResult
from .stages import CONFLICT_TYPES


@dataclass(frozen=True)
class EpisodeMetrics:
    spec_id: str
    termination: str
    turns: int
    trajectory_progress: float
    satisfied: float
    fact: bool
    commitment: bool
    player_input: bool


def episode_metrics(result: EpisodeResult) -> EpisodeMetrics:
    state = result.final_state
    nodes = state.node_occurred
    statuses = [s for _, s in state.statuses]
    flags = {t: False for t in CONFLICT_TYPES}
    if result.termination == "conflict":
        for c in result.turns[-1].conflicts:
            flags[c["type"]] = True
    return EpisodeMetrics(
        spec_id=result.spec_id,
        termination=result.termination,
        turns=len(result.turns),
        trajectory_progress=sum(nodes) / len(nodes) if nodes else 0.0,
        satisfied=statuses.count("satisfied") / len(statuses) if statuses else 0.0,
        fact=flags["fact"], commitment=flags["commitment"], player_input=flags["player_input"],
    )


@dataclass(frozen=True)
class Aggregate:
    episodes: int  # all, invalid included
    scored: int  # the ones the averages are over
    avg_turns: float
    trajectory_pct: float
    satisfied_pct: float
    fact_pct: float
    commitment_pct: float
    player_input_pct: float
    conflict_free: int
    terminations: dict[str, int]
    survival: tuple[float, ...]  # S(t) for t = 0..max_turns

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def survival(turns: Iterable[int], max_turns: int) -> tuple[float, ...]:
    turns = list(turns)
    if not turns:
        return tuple(0.0 for _ in range(max_turns + 1))
    return tuple(sum(n >= t for n in turns) / len(turns) for t in range(max_turns + 1))


def aggregate(metrics: list[EpisodeMetrics], max_turns: int) -> Aggregate:
    scored = [m for m in metrics if m.termination != "invalid"]
    terms = {k: sum(m.termination == k for m in metrics) for k in ("conflict", "max_turns", "all_resolved", "invalid")}
    return Aggregate(
        episodes=len(metrics), scored=len(scored),
        avg_turns=_mean([m.turns for m in scored]),
        trajectory_pct=100 * _mean([m.trajectory_progress for m in scored]),
        satisfied_pct=100 * _mean([m.satisfied for m in scored]),
        fact_pct=100 * _mean([float(m.fact) for m in scored]),
        commitment_pct=100 * _mean([float(m.commitment) for m in scored]),
        player_input_pct=100 * _mean([float(m.player_input) for m in scored]),
        conflict_free=sum(m.termination != "conflict" for m in scored),
        terminations=terms,
        survival=survival((m.turns for m in scored), max_turns),
    )


TABLE_HEADER = ("| run | episodes | avg turns | traj % | sat % | fact % | commit % | player % "
                "| conflict-free | conflict | max_turns | all_resolved | invalid |")


def table_row(name: str, a: Aggregate) -> str:
    t = a.terminations
    return (f"| {name} | {a.episodes} | {a.avg_turns:.2f} | {a.trajectory_pct:.2f} | {a.satisfied_pct:.2f} "
            f"| {a.fact_pct:.0f} | {a.commitment_pct:.0f} | {a.player_input_pct:.0f} | {a.conflict_free} "
            f"| {t['conflict']} | {t['max_turns']} | {t['all_resolved']} | {t['invalid']} |")


def results_table(rows: list[tuple[str, Aggregate]]) -> str:
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(TABLE_HEADER.count("|") - 1)) + "|"
    return "\n".join([TABLE_HEADER, sep, *(table_row(n, a) for n, a in rows)])
