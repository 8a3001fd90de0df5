"""The rows of the analysis tables (`table_schema.py`) for finished runs, as plain dicts.

Everything is read from the run directory: results (turn records), the call log, and the specs the
run played (for genres, counts and the ledger: each turn's state is rebuilt through `replay`, the same
pure transitions the episode used). An episode whose spec was not found still gets its rows; the
columns that need the spec are null and it has no fact events (the run's notes say so).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..protocol import turns as turn_ids
from ..protocol.ledger import FactEntry, active_facts, first_pending_node
from ..protocol.metrics import ENDING_CENSORED, episode_metrics
from ..protocol.records import EpisodeResult, StatusRecord, TurnRecord
from ..protocol.replay import LedgerDiff, Replay, TurnView, replay, target_text
from ..protocol.spec import Spec
from ..protocol.trials import episode_name
from ..rundir.call_log import CallLine, read_calls
from ..rundir.layout import CALLS, parts
from .cost import SUMS, Usage
from .runs import Run
from .table_schema import TABLES

Row = dict[str, Any]


@dataclass(frozen=True)
class Source:
    """A run as the tables name it: the run, and its sweep point when it is one."""

    run: Run
    point: str | None = None


def _keys(src: Source, spec_id: str, trial: int) -> Row:
    return {
        "run": src.run.key,
        "label": src.run.label,
        "point": src.point,
        "episode": episode_name(spec_id, trial),  # the name its files and pages use
        "spec_id": spec_id,
        "trial": trial,
    }


def _turn(turn: int) -> Row:
    return {"turn": turn, "turn_number": turn_ids.shown(turn)}


def _sums(u: Usage | None) -> Row:
    """The call log's sums for an episode or a turn (the report's cost table sums the same way)."""
    u = u or Usage()
    return {name: getattr(u, name) for name in SUMS}


def call_lines(src: Source) -> Iterator[tuple[str, int, CallLine]]:
    """Every line of the run's call logs (the run directory's, then each shard's), in order: (the part's
    name, the line's number in its log, the line)."""
    root = src.run.path
    for part in parts(root):
        if (part / CALLS).is_file():
            name = "" if part == root else part.name
            for i, c in enumerate(read_calls(part / CALLS)):
                yield name, i, c


def call_row(src: Source, name: str, i: int, c: CallLine) -> Row:
    """One line of a call log as a row of the `calls` table."""
    return {
        **_keys(src, c.spec_id, c.trial),
        "part": name,
        "line": i,
        **_turn(c.turn),
        "stage": c.stage,
        "role": c.role,
        "model": c.model,
        "attempt": c.attempt,
        "key": c.key,
        "seed": c.seed,
        "prompt_tokens": c.prompt_tokens or 0,
        "cached_tokens": c.cached_tokens or 0,
        "generated_tokens": c.generated_tokens or 0,
        "max_tokens_sent": c.max_tokens_sent,
        "latency_s": c.latency_s or 0.0,
        "done_at": c.done_at,
        "overhead_s": c.overhead_s,
        "finish_reason": c.finish_reason,
        "accepted": c.error is None,
        "error": c.error,
        "output": c.output,
        "speculative": c.speculative,
        "grammar_new": c.grammar_new,
        "bound_hits": list(c.bound_hits),
        "transport_errors": len(c.transport_errors),
        "thought_tokens": c.thought_tokens,
    }


def negations(diff: LedgerDiff) -> tuple[FactEntry, ...]:
    """The facts an update negated: those active before, and those it added and negated at once (additions
    come first, so an update may negate a fact it adds: PROTOCOL section 2)."""
    return diff.negated + tuple(f for f in diff.added if not f.active)


def _satisfied(status_check: tuple[StatusRecord, ...] | None) -> int:
    return sum(1 for e in status_check or () if e.status == "SATISFIED")


def _episode_rows(
    src: Source, result: EpisodeResult, usage: dict[tuple[str, int, int | None], Usage]
) -> dict[str, list[Row]]:
    spec: Spec | None = src.run.specs.get(result.spec_id)
    trial = result.trial
    keys = _keys(src, result.spec_id, trial)
    m = episode_metrics(result)
    rp: Replay | None = replay(spec, result) if spec is not None else None
    final = result.final_state
    out: dict[str, list[Row]] = {name: [] for name in TABLES}
    out["episodes"].append(
        {
            **keys,
            "title": spec.meta.title if spec else None,
            "genres": list(spec.meta.genres) if spec else [],
            "initial_facts": len(spec.initial_facts) if spec else None,
            "commitments": len(spec.commitments) if spec else len(final.statuses),
            "achievements": sum(c.type == "achievement" for c in spec.commitments) if spec else None,
            "nodes": len(spec.trajectory) if spec else len(final.node_occurred),
            "termination": result.termination,
            "reason": result.reason,
            "ending": m.ending,
            "censored": m.termination in ENDING_CENSORED,
            "scored": result.termination != "invalid",
            "turns": m.turns,
            "max_turns": result.max_turns,
            "trajectory_progress": m.trajectory_progress,
            "satisfied": m.satisfied,
            "nodes_completed": sum(final.node_occurred),
            "commitments_satisfied": sum(s == "satisfied" for _, s in final.statuses),
            "facts_final": len(final.facts),
            "facts_active_final": len(active_facts(final.facts)),
            "fact": m.fact,
            "commitment": m.commitment,
            "player_input": m.player_input,
            "bound_hits": m.bound_hits,
            "thought_tokens": result.opening_thought_tokens + sum(t.thought_tokens for t in result.turns),
            **_sums(usage.get((result.spec_id, trial, None))),
        }
    )
    views = rp.turns if rp is not None else ()
    nodes_done = 0
    satisfied = 0
    seq = 0
    if rp is not None:
        src.run.notes += [f"{result.spec_id}: {p}" for p in rp.problems]
    for i, rec in enumerate(result.turns):
        view = views[i] if i < len(views) else None
        committed = not rec.conflicts
        if committed:
            nodes_done += rec.node_completed is not None
            if rec.status_check is not None:
                satisfied = _satisfied(rec.status_check)
        pending_node = first_pending_node(view.before.node_occurred) if view is not None else None
        state_after = (view.after.facts if view.after is not None else view.before.facts) if view else None
        review = rec.double_check
        out["turns"].append(
            {
                **keys,
                **_turn(rec.turn),
                "committed": committed,
                "conflict": not committed,
                "conflict_types": [c.type for c in rec.conflicts],
                "first_check_conflicts": len(rec.conflict_check.conflicts),
                "double_checked": review is not None,
                "confirmed": None if review is None else review.confirmed,
                "node": spec.trajectory[pending_node].id if spec is not None and pending_node is not None else None,
                "node_completed": rec.node_completed,
                "nodes_completed": nodes_done,
                "commitments_satisfied": satisfied,
                "newly_satisfied": list(rec.newly_satisfied),
                "back_to_pending": list(rec.back_to_pending),
                "facts_added": len(view.update.added) if view else None,
                "facts_negated": len(negations(view.update)) if view else None,
                "facts_active": len(active_facts(state_after)) if state_after is not None else None,
                "facts_total": len(state_after) if state_after is not None else None,
                "player_input": rec.player_input,
                "response": rec.response,
                "bound_hits": list(rec.bound_hits),
                "thought_tokens": rec.thought_tokens,
                **_sums(usage.get((result.spec_id, trial, rec.turn))),
            }
        )
        if committed:  # a turn that did not commit changed nothing: no events
            for kind, source, target, text, ctype in _events(rec, view, spec):
                out["ledger_events"].append(
                    {
                        **keys,
                        **_turn(rec.turn),
                        "seq": seq,
                        "event": kind,
                        "source": source,
                        "target": target,
                        "text": text,
                        "commitment_type": ctype,
                    }
                )
                seq += 1
        out["conflicts"] += _conflict_rows(keys, result, rec, view, spec, i == len(result.turns) - 1)
    return out


Event = tuple[str, str, str, str | None, str | None]  # (event, source, target, text, commitment type)


def _events(rec: TurnRecord, view: TurnView | None, spec: Spec | None) -> list[Event]:
    """A committed turn's changes in the order `commit_turn` applies them: the opening's pending updates
    (turn 0), the turn's own fact update, the node, then the statuses. Fact events need the replay."""
    events: list[Event] = []
    if view is not None:
        for source, diff in (("opening", view.pending), ("turn", view.update)):
            events += [("fact_added", source, f.id, f.text, None) for f in diff.added]
            events += [("fact_negated", source, f.id, f.text, None) for f in negations(diff)]
    if rec.node_completed is not None:
        nodes = {n.id: n.description for n in spec.trajectory} if spec else {}
        events.append(("node_reached", "turn", rec.node_completed, nodes.get(rec.node_completed), None))
    commitments = {c.id: c for c in spec.commitments} if spec else {}
    for kind, ids in (("commitment_satisfied", rec.newly_satisfied), ("commitment_pending", rec.back_to_pending)):
        for cid in ids:
            c = commitments.get(cid)
            events.append((kind, "turn", cid, c.description if c else None, c.type if c else None))
    return events


def _conflict_rows(
    keys: Row, result: EpisodeResult, rec: TurnRecord, view: TurnView | None, spec: Spec | None, last: bool
) -> list[Row]:
    """Each conflict the turn's audits raised: the first check's, then any only the double-check named."""
    first = rec.conflict_check.conflicts
    review = rec.double_check
    reviewed = {c.key: c for c in review.conflicts} if review else {}
    standing = {c.key for c in rec.conflicts}
    # audit.failure_modes: one mode per standing conflict, in `conflicts`' order.
    modes = {c.key: m.mode for c, m in zip(rec.conflicts, rec.failure_modes or (), strict=False)}
    raised = [(c, "first_check") for c in first]
    seen = {c.key for c in first}
    raised += [(c, "double_check") for k, c in reviewed.items() if k not in seen]
    rows = []
    for c, by in raised:
        key = c.key
        again = reviewed.get(key)
        rows.append(
            {
                **keys,
                **_turn(rec.turn),
                "type": key[0],
                "id": key[1],
                "internal": c.internal,
                "target_text": target_text(spec, view, rec, c),
                "raised_by": by,
                "reason": c.reason if by == "first_check" else None,
                "double_checked": review is not None,
                "confirmed": None if review is None else review.confirmed,
                "review_reason": None if review is None else review.review_reason,
                "reason_reviewed": None if again is None else again.reason,
                "standing": key in standing,
                "ended_episode": key in standing and last and result.termination == "conflict",
                "failure_mode": modes.get(key),
            }
        )
    return rows


def run_rows(src: Source) -> dict[str, list[Row]]:
    """Every table's rows for one run."""
    out: dict[str, list[Row]] = {name: [] for name in TABLES}
    # Per episode and per (episode, turn): the call log's sums (speculative calls of turns never played
    # count in their episode only).
    usage: dict[tuple[str, int, int | None], Usage] = {}
    for name, i, c in call_lines(src):
        out["calls"].append(call_row(src, name, i, c))
        for turn in (None, c.turn):
            usage.setdefault((c.spec_id, c.trial, turn), Usage()).add(c)
    for result in src.run.results.values():
        for name, rows in _episode_rows(src, result, usage).items():
            out[name] += rows
    return out


def point_of(run_dir: Path, points: dict[Path, str]) -> str | None:
    return points.get(run_dir.expanduser().resolve())
