"""Failure modes: why each story's standing conflict happened (audit.failure_modes).

A run that asked the failure-mode stage records, on its conflicting turn, one mode per standing
conflict (`TurnRecord.failure_modes`, in `conflicts`' order). Here they are counted per run (a run
is one narrator under one setting) and per conflict type. The unit is the conflict: a turn whose
conflicts stand on two facts counts twice. A run that did not ask says so instead of showing zeros.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..protocol.reaudit import ReauditResult
from ..protocol.records import ConflictRecord, ModeRecord
from ..protocol.stages import CONFLICT_TYPES, FAILURE_MODES
from .runs import Run
from .tables import csv_text, markdown_table, write

NOTE = (
    "Each standing conflict put into one failure mode by the auditor (audit.failure_modes): "
    "yielded_to_player, lost_continuity, broke_commitment, ignored_input or other "
    "(docs/guide/endings.md). Counted per conflict; a share is of the run's classified conflicts."
)
NOT_ASKED = "not asked (run with audit.failure_modes=true, or mode=reaudit audit.failure_modes=true over the run)"


@dataclass(frozen=True)
class RunModes:
    label: str
    path: str
    asked: bool  # any turn of the run carries failure modes
    counts: Counter[tuple[str, str]]  # (conflict type, mode) -> conflicts
    unclassified: int  # standing conflicts without a mode (the stage's call failed, or a re-audit skipped them)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_mode(self, mode: str, ctype: str | None = None) -> int:
        return sum(n for (t, m), n in self.counts.items() if m == mode and (ctype is None or t == ctype))


Judged = tuple[Sequence[ConflictRecord], Sequence[ModeRecord] | None]  # (conflicts, their modes)


def count_modes(label: str, path: str, asked: bool, judged: Iterable[Judged]) -> RunModes:
    """Count the modes of the standing conflicts of each judged turn."""
    counts: Counter[tuple[str, str]] = Counter()
    unclassified = 0
    for conflicts, modes in judged:
        if modes is None:
            unclassified += len(conflicts)
            continue
        asked = True
        for conflict, mode in zip(conflicts, modes, strict=True):
            counts[(conflict.type, mode.mode)] += 1
    return RunModes(label, path, asked, counts, unclassified)


def run_modes(run: Run) -> RunModes:
    """A run's modes: each conflict-ended episode's last turn."""
    asked = bool(((run.manifest.get("config") or {}).get("audit") or {}).get("failure_modes"))
    judged = [
        (r.turns[-1].conflicts, r.turns[-1].failure_modes)
        for r in run.results.values()
        if r.termination == "conflict" and r.turns
    ]
    return count_modes(run.label, str(run.path), asked, judged)


def reaudit_modes(label: str, path: str, results: Iterable[ReauditResult]) -> RunModes:
    """A re-audit's modes: every judged turn whose conflicts stand under the re-auditor."""
    judged = [(t.conflicts, t.failure_modes) for r in results for t in r.turns if t.judged and t.conflicts]
    return count_modes(label, path, True, judged)


def write_modes(out: Path, modes: Sequence[RunModes]) -> list[Path]:
    """failure_modes.md and failure_modes.csv (mode=reaudit; mode=report puts the table in results.md)."""
    return [
        write(out / "failure_modes.md", "# Failure modes\n\n" + modes_markdown(modes) + "\n"),
        write(out / "failure_modes.csv", modes_csv(modes)),
    ]


def _share(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f}%)" if total else "0"


HEADER = ["run", "conflicts", *FAILURE_MODES]


def mode_rows(modes: Sequence[RunModes]) -> list[list[Any]]:
    """Per run: its classified conflicts and each mode's count and share."""
    return [[m.label, m.total, *(_share(m.by_mode(k), m.total) for k in FAILURE_MODES)] for m in modes if m.asked]


def type_rows(m: RunModes) -> tuple[list[str], list[list[Any]]]:
    """One run's modes by conflict type (rows) and mode (columns)."""
    rows = []
    for ctype in CONFLICT_TYPES:
        n = sum(m.by_mode(k, ctype) for k in FAILURE_MODES)
        rows.append([ctype, n, *(_share(m.by_mode(k, ctype), n) for k in FAILURE_MODES)])
    return ["conflict type", "conflicts", *FAILURE_MODES], rows


def notes(modes: Sequence[RunModes]) -> list[str]:
    out = [f"{m.label}: {NOT_ASKED}." for m in modes if not m.asked]
    out += [
        f"{m.label}: {m.unclassified} standing conflict(s) have no mode (its call failed; see calls.jsonl)."
        for m in modes
        if m.asked and m.unclassified
    ]
    return out


def modes_markdown(modes: Sequence[RunModes]) -> str:
    parts = [NOTE]
    if any(m.asked for m in modes):
        parts.append(markdown_table(HEADER, mode_rows(modes)))
        for m in modes:
            if m.asked:
                parts.append(f"### {m.label}: failure modes by conflict type\n\n" + markdown_table(*type_rows(m)))
    parts += [f"- {line}" for line in notes(modes)]
    return "\n\n".join(parts)


def modes_csv(modes: Sequence[RunModes]) -> str:
    """Long form: one row per run, conflict type and mode, with the count (runs that asked)."""
    body = [
        [m.label, m.path, ctype, mode, m.counts.get((ctype, mode), 0)]
        for m in modes
        if m.asked
        for ctype in CONFLICT_TYPES
        for mode in FAILURE_MODES
    ]
    return csv_text(["label", "run_dir", "conflict_type", "mode", "conflicts"], body)
