"""Agreement between a run's auditor and a re-auditor on the same recorded turns: Cohen's kappa
per turn (conflict yes/no and per type), the type confusion, and Pearson / Spearman of the
per-episode metrics; written as agreement.{md,json} and per-turn / per-episode CSVs."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..protocol.reaudit import ReauditResult
from ..protocol.records import ConflictRecord, EpisodeResult
from ..protocol.stages import CONFLICT_TYPES
from ..protocol.turns import played
from ..protocol.turns import shown as shown_turn
from .stats import cohen_kappa, confusion, pearson, spearman
from .tables import csv_text, markdown_table, write


def _types(conflicts: Sequence[ConflictRecord]) -> set[str]:
    return {c.type for c in conflicts}


def turn_pairs(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> list[dict[str, Any]]:
    rows = []
    for src, re_ in pairs:
        audits = {a.turn: a for a in re_.turns}
        for rec in src.turns:
            a = audits.get(rec.turn)
            if a is None or not a.judged:
                continue
            rows.append(
                {
                    "spec_id": src.spec_id,
                    "turn": shown_turn(rec.turn),
                    "original": _types(rec.conflicts),
                    "reaudit": _types(a.conflicts),
                    "original_first": bool(rec.conflict_check.conflicts),
                    "reaudit_first": bool(a.conflict_check and a.conflict_check.conflicts),
                }
            )
    return rows


def episode_pairs(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> list[dict[str, Any]]:
    """Per-episode metrics under each auditor.

    Under the re-auditor the episode would have ended at its first standing
    conflict; past the recorded turns nothing is known, so turns are
    censored at the recorded length (as the original's are at max_turns).
    Episodes that ended `invalid`, or with a turn the re-auditor failed to
    judge, are left out.
    """
    rows = []
    for src, re_ in pairs:
        if src.termination == "invalid" or any(not a.judged for a in re_.turns):
            continue
        orig = _types(src.turns[-1].conflicts) if src.termination == "conflict" else set()
        first = next((a for a in sorted(re_.turns, key=lambda a: a.turn) if a.conflicts), None)
        re_types = _types(first.conflicts) if first else set()
        row: dict[str, Any] = {
            "spec_id": src.spec_id,
            "turns_original": len(src.turns),
            "turns_reaudit": played(first.turn) if first else len(src.turns),
        }
        for t in (*CONFLICT_TYPES, "conflict"):
            row[f"{t}_original"] = int(bool(orig) if t == "conflict" else t in orig)
            row[f"{t}_reaudit"] = int(bool(re_types) if t == "conflict" else t in re_types)
        row["conflict_turns_reaudit"] = sum(bool(a.conflicts) for a in re_.turns)
        rows.append(row)
    return rows


EPISODE_METRICS = (
    ("turns", "turns to first conflict (censored)"),
    ("fact", "fact conflict"),
    ("commitment", "commitment conflict"),
    ("player_input", "player-input conflict"),
    ("conflict", "any conflict"),
)


def agreement(pairs: Sequence[tuple[EpisodeResult, ReauditResult]]) -> dict[str, Any]:
    turns = turn_pairs(pairs)
    failed = sum(not a.judged for _, r in pairs for a in r.turns)
    per_turn = {}
    labels = [("conflict", lambda s: bool(s)), *((t, (lambda s, t=t: t in s)) for t in CONFLICT_TYPES)]
    for name, f in labels:
        a = [f(r["original"]) for r in turns]
        b = [f(r["reaudit"]) for r in turns]
        per_turn[name] = {"kappa": cohen_kappa(a, b), "agree": _share(a, b), **confusion(a, b)}
    a = [r["original_first"] for r in turns]
    b = [r["reaudit_first"] for r in turns]
    per_turn["conflict_first_check"] = {"kappa": cohen_kappa(a, b), "agree": _share(a, b), **confusion(a, b)}
    cross: dict[str, dict[str, int]] = {a: {b: 0 for b in CROSS_LABELS} for a in CROSS_LABELS}
    for r in turns:
        cross[_cross_label(r["original"])][_cross_label(r["reaudit"])] += 1
    eps = episode_pairs(pairs)
    per_episode = {}
    for key, _ in EPISODE_METRICS:
        x = [r[f"{key}_original"] for r in eps]
        y = [r[f"{key}_reaudit"] for r in eps]
        per_episode[key] = {
            "original": _mean(x),
            "reaudit": _mean(y),
            "pearson": pearson(x, y),
            "spearman": spearman(x, y),
        }
    return {
        "turns": len(turns),
        "failed_turns": failed,
        "episodes": len(eps),
        "per_turn": per_turn,
        "types": cross,
        "per_episode": per_episode,
        "turn_rows": turns,
        "episode_rows": eps,
    }


CROSS_LABELS = ("none", *CONFLICT_TYPES, "several")


def _cross_label(types: set[str]) -> str:
    return "none" if not types else next(iter(types)) if len(types) == 1 else "several"


def _share(a: Sequence[bool], b: Sequence[bool]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a) if a else math.nan


def _mean(x: Sequence[float]) -> float:
    return sum(x) / len(x) if x else math.nan


def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def agreement_markdown(agr: dict[str, Any], source: str, reauditor: str) -> str:
    head = ("item", "kappa", "agree %", "both yes", "original only", "re-audit only", "both no")
    names = {
        "conflict": "conflict (after double-check)",
        "conflict_first_check": "conflict (first check)",
        "fact": "fact",
        "commitment": "commitment",
        "player_input": "player_input",
    }
    turn_rows = []
    for key in ("conflict", "conflict_first_check", *CONFLICT_TYPES):
        r = agr["per_turn"][key]
        turn_rows.append(
            [
                names[key],
                _f(r["kappa"]),
                _f(100 * r["agree"], 1) if r["agree"] == r["agree"] else "n/a",
                r["yes_yes"],
                r["yes_no"],
                r["no_yes"],
                r["no_no"],
            ]
        )
    ep_rows = []
    for key, label in EPISODE_METRICS:
        r = agr["per_episode"][key]
        scale, d = (1, 2) if key == "turns" else (100, 1)
        ep_rows.append(
            [
                label + ("" if key == "turns" else " %"),
                _f(scale * r["original"], d),
                _f(scale * r["reaudit"], d),
                _f(r["pearson"]),
                _f(r["spearman"]),
            ]
        )
    return (
        f"# Re-audit agreement\n\noriginal: {source}\n\nre-auditor: {reauditor}\n\n"
        f"## Per turn ({agr['turns']} turns judged by both"
        + (f"; {agr['failed_turns']} the re-auditor failed to judge" if agr["failed_turns"] else "")
        + ")\n\n"
        + markdown_table(head, turn_rows)
        + "\n\nConflict type per turn (rows: original, columns: re-audit):\n\n"
        + markdown_table(
            ("original \\ re-audit", *CROSS_LABELS),
            [[a, *(agr["types"][a][b] for b in CROSS_LABELS)] for a in CROSS_LABELS],
        )
        + f"\n\n## Per episode ({agr['episodes']} episodes)\n\n"
        + markdown_table(("metric", "original", "re-audit", "Pearson", "Spearman"), ep_rows)
        + "\n\nRe-audit turns are censored at the recorded length: after the original's last turn "
        "nothing was narrated.\n"
    )


def write_agreement(out: Path, agr: dict[str, Any], source: str, reauditor: str) -> str:
    md = agreement_markdown(agr, source, reauditor)
    write(out / "agreement.md", md)
    summary = {k: v for k, v in agr.items() if k not in ("turn_rows", "episode_rows")}
    write(out / "agreement.json", json.dumps(summary, indent=1, default=_json_nan))
    write(
        out / "agreement_turns.csv",
        csv_text(
            ("spec_id", "turn", "original", "reaudit", "original_first_check", "reaudit_first_check"),
            [
                [
                    r["spec_id"],
                    r["turn"],
                    " ".join(sorted(r["original"])),
                    " ".join(sorted(r["reaudit"])),
                    int(r["original_first"]),
                    int(r["reaudit_first"]),
                ]
                for r in agr["turn_rows"]
            ],
        ),
    )
    eps = agr["episode_rows"]
    cols = list(eps[0]) if eps else ["spec_id"]
    write(out / "agreement_episodes.csv", csv_text(cols, [[r[c] for c in cols] for r in eps]))
    return md


def _json_nan(x: Any) -> Any:
    return str(x)
