"""Runs compared on the stories they share: every figure's difference from the baseline, with its test.

The paper's tables are comparisons (six narrators, three auditors, HiAgent against its baseline,
adversarial against natural input), and two overlapping intervals are not a test. Each run after the
first (the baseline) is compared with it by report/paired.py's statistics (paired and unpaired
intervals, a sign-flip test by story, the MDD; Holm over the runs); the sentences and tables are
report/compare_doc.py's.

Stories pair by their spec id, and only when both runs played the same text of it (the manifests'
spec file hashes, when both have them). Runs with different turn caps are compared on what the cap
does not change: the curves' figures up to the smaller cap; the main table's averages and rates
depend on the cap and are left out, in one line. Runs with no story in common are not compared
(mode=compare refuses with exit 2; mode=report leaves the section out).

The as-played figures (avg turns and the rates) count a play the window stopped as if it had ended
there: where the two runs' windows stopped different shares of their plays they get no verdict, and
the figures that hold under censoring (turns kept, S(t), each ending by t) lead
(docs/measurements/2026-12-07-corrected-and-censored.md). The curves are compared no further than
both runs were followed. A run given twice, or a copy of it, is refused; a result file that failed its
check is named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.metrics import OVERRULED, EpisodeMetrics
from .labels import short_names
from .paired import ALPHA, MEANS, Difference, Pool, holm, paired_differences, shares
from .ran import ran_lines
from .runs import REAUDIT_KIND, Run
from .tables import known_to
from .trials import columns_at


@dataclass(frozen=True)
class Comparison:
    baseline: str
    other: str
    stories: int  # shared stories the differences rest on
    plays: tuple[int, int]  # scored plays of those stories, baseline then other
    horizon: int
    turns: tuple[int, ...]  # where S(t) is compared
    notes: tuple[str, ...]  # what was left out, and why (one line each)
    rows: tuple[Difference, ...]
    window: tuple[float, float] = (0.0, 0.0)  # share of plays the window stopped, baseline then other
    censoring: str = ""  # how the two runs' censoring differs, withholding the as-played figures' verdicts


@dataclass(frozen=True)
class Comparisons:
    level: float
    resamples: int
    compared: list[Comparison]
    refused: list[str] = field(default_factory=list)  # pairs with nothing comparable, one line each
    legend: list[str] = field(default_factory=list)  # each short name, once: its folder and full label


def story_hashes(run: Run) -> dict[str, str]:
    """spec id -> the hash of its file, as the run's manifest recorded it ({} when it recorded none)."""
    files = (run.manifest.get("dataset") or {}).get("files") or {}
    return {Path(k).stem: str(v) for k, v in files.items() if Path(k).parent.name == "specs"}


def scored_stories(run: Run) -> dict[str, list[EpisodeMetrics]]:
    """Scored plays by story, in the run's order (a story with every play invalid has none)."""
    out: dict[str, list[EpisodeMetrics]] = {}
    for m in run.metrics():
        if m.termination != "invalid":
            out.setdefault(m.spec_id, []).append(m)
    return out


def shared_stories(base: Run, other: Run) -> list[str]:
    """Stories both runs played with scored plays, the same text when both manifests hash it."""
    a, b = scored_stories(base), scored_stories(other)
    ha, hb = story_hashes(base), story_hashes(other)
    return [s for s in a if s in b and (s not in ha or s not in hb or ha[s] == hb[s])]


BENT = frozenset(k for k, _ in MEANS)
HOLDING = "turns kept, S(t) and each ending's % by t"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def compare_pair(
    base: Run,
    other: Run,
    stories: list[str],
    horizon: int | None,
    resamples: int,
    seed: int,
    level: float,
    names: tuple[str, str] | None = None,
) -> Comparison:
    """One run against the baseline on their shared `stories` (module docstring); `names`: what to call the
    two (their labels when None)."""
    a_name, b_name = names or (base.label, other.label)
    cap_a, cap_b = base.max_turns, other.max_turns
    h = min(cap_a, cap_b) if horizon is None else min(horizon, cap_a, cap_b)
    means = cap_a == cap_b
    notes = []
    known = min(known_to(base), known_to(other))
    if known < h:  # nobody followed that far in one run: the curves stop where its data do
        notes.append(f"the curves are compared to t={known} only: no story was followed further in both runs")
        h = known
    if not means:
        notes.append(
            f"turn caps differ ({cap_a} vs {cap_b}): only the curves' figures to turn {h} are compared "
            "(avg turns and the rates depend on the cap)"
        )
    a, b = scored_stories(base), scored_stories(other)
    # A result file that failed its check is named, as mode=report names it, not passed off as a story one
    # run never played.
    notes += [
        f"{name}: {f}: {why}: not counted" for run, name in ((base, a_name), (other, b_name)) for f, why in run.damaged
    ]
    left = len(set(a) - set(stories)) + len(set(b) - set(stories))
    if left:
        notes.append(f"{left} stories played by only one of the two runs (or in another text) are left out")
    if other.manifest.get("kind") == REAUDIT_KIND:
        src = (other.manifest.get("source") or {}).get("path")
        if src and Path(src).resolve() == base.path.resolve():
            notes.append("a re-audit of the baseline's transcripts: the differences are the auditors' alone")
    if 2.0 / 2 ** len(stories) > ALPHA:
        notes.append(
            f"with {len(stories)} stories no p-value can fall below {2.0 / 2 ** len(stories):.2f} (the test "
            "needs 6 or more to reach 5%); the bootstrap intervals are too narrow at this size"
        )
    turns_at = tuple(columns_at(h))
    pool = Pool([[a[s] for s in stories], [b[s] for s in stories]])
    rows = paired_differences(pool, h, turns_at, means, resamples, seed, level)
    window, overruled = shares(pool), shares(pool, OVERRULED)
    # The as-played figures count a censored play as if it had ended there; where the two runs censor
    # different shares they differ by that alone (docs/measurements/2026-12-07-corrected-and-censored.md:
    # same narrator, 30% stopped against none, avg turns "differs" in every pair). Their consistent
    # counterparts (turns kept, S(t), each ending by t) keep their verdicts. Two causes, named apart: the
    # window's stops, and a re-auditor's overruled endings.
    why = []
    if window[0] != window[1]:
        why.append(f"the window stopped {_pct(window[1])} of {b_name}'s plays and {_pct(window[0])} of {a_name}'s")
    if overruled[0] != overruled[1]:
        why.append(
            f"the re-auditor overruled the conflict that ended {_pct(overruled[1])} of {b_name}'s plays "
            f"({_pct(overruled[0])} of {a_name}'s), each censored where it stood"
        )
    censoring = " and ".join(why)
    if censoring:
        withheld = f"no verdict: {censoring}, which bends this figure; {HOLDING} hold under it"
        rows = tuple(Difference(**{**d.__dict__, "withheld": withheld}) if d.figure.key in BENT else d for d in rows)
    rows = tuple(sorted(rows, key=lambda d: d.figure.key in BENT))  # the figures censoring cannot bend lead
    return Comparison(
        a_name,
        b_name,
        len(stories),
        (sum(len(a[s]) for s in stories), sum(len(b[s]) for s in stories)),
        h,
        turns_at,
        tuple(notes),
        rows,
        window,
        censoring,
    )


def same_run(a: Run, b: Run) -> bool:
    """One directory given twice, or a copy of it (manifests alike to the moment each run was created)."""
    made = a.manifest.get("created")
    return a.path.resolve() == b.path.resolve() or (made is not None and a.manifest == b.manifest)


def dataset_of(run: Run) -> str:
    d = run.manifest.get("dataset") or {}
    return str(d.get("sha256") or d.get("path") or "?")


def compare_runs(
    runs: Sequence[Run], horizon: int | None = None, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> Comparisons:
    """Every run after the first against the first; Holm over them per figure when more than one."""
    names = short_names(runs)
    # What ran, per run, from its manifest, its full label once, and the scripted lines where no model ran.
    per_run, scripted = ran_lines(runs, names)
    base = runs[0]
    compared: list[Comparison] = []
    refused: list[str] = []
    for other, name in zip(runs[1:], names[1:], strict=True):
        shared = shared_stories(base, other)
        if same_run(base, other):
            refused.append(f"{name} is not compared with the baseline: it is the same run ({other.path})")
            continue
        if not shared:
            why = (
                "they ran on different datasets"
                if dataset_of(base) != dataset_of(other)
                else "they share no story with scored plays"
            )
            refused.append(f"{name} is not compared with the baseline: {why}, so no story pairs")
            continue
        compared.append(compare_pair(base, other, shared, horizon, resamples, seed, level, (names[0], name)))
    if len(compared) > 1:
        compared = _with_holm(compared)
    return Comparisons(level, resamples, compared, refused, per_run + scripted)


def _with_holm(compared: list[Comparison]) -> list[Comparison]:
    keys = {d.figure.key for c in compared for d in c.rows}
    adjusted: dict[tuple[int, str], float] = {}
    for key in keys:
        where = [(i, d) for i, c in enumerate(compared) for d in c.rows if d.figure.key == key]
        for (i, _), q in zip(where, holm([math.nan if d.withheld else d.p for _, d in where]), strict=True):
            adjusted[i, key] = q
    out = []
    for i, c in enumerate(compared):
        rows = tuple(Difference(**{**d.__dict__, "p_holm": adjusted.get((i, d.figure.key), math.nan)}) for d in c.rows)
        out.append(Comparison(**{**c.__dict__, "rows": rows}))
    return out
