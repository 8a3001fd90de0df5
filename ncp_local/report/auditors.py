"""Auditor sensitivity in one table (the paper's Table 2): several auditors on the same episodes.

An auditor here is the auditor of a run (the source of a re-audit, or an
independent run of the same narrator, player, specs and seeds) or the
re-auditor of a re-audit directory. For each, per episode: turns to the
first standing conflict and the conflict types it found; for re-audits, as
`reaudit.episode_pairs` counts them (censored at the recorded length).

Rows: each auditor's conflict rates (fact, commitment, player input, any)
and turns, with bootstrap intervals over stories (`protocol/resample.py`: a story's plays drawn
together; over episodes when each story was played once). Pairs: Cohen's kappa on
conflict yes/no per turn (only where both judged the same narration: a run
and its re-audits, or re-audits of one run; two independent runs narrate
differently after their first turn), and Pearson and Spearman of the
per-episode turns, each with a bootstrap interval (stories resampled as
above, a turn-level kappa taking all turns of the drawn episodes). Only episodes
every auditor judged are compared.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..protocol.reaudit import ReauditResult
from ..protocol.records import ConflictRecord
from ..protocol.stages import CONFLICT_TYPES
from ..protocol.turns import played
from ..rundir.layout import MANIFEST, RESULTS, read_manifest
from ..rundir.places import check_destination
from ..rundir.seals import check_result
from .labels import by_difference
from .runs import REAUDIT_KIND, Run, load_run, role_label
from .stats import bootstrap, bootstrap_stat, cohen_kappa, pearson, spearman
from .tables import csv_text, markdown_table, write

RATES = (*CONFLICT_TYPES, "conflict")


@dataclass(frozen=True)
class Judged:
    """One episode as one auditor judged it."""

    turns: int
    types: frozenset[str]
    per_turn: tuple[tuple[int, bool], ...]  # (turn, a conflict stood) for every judged turn
    story: str = ""  # the episode's story (its spec id; a story's trials share it)


@dataclass
class Auditor:
    label: str
    path: Path
    narration: str  # what it judged: the identity of the run whose turns these are
    episodes: dict[str, Judged] = field(default_factory=dict)


def _types(conflicts: Sequence[ConflictRecord]) -> frozenset[str]:
    return frozenset(c.type for c in conflicts)


def of_run(run: Run) -> Auditor:
    """A run's own auditor: its episodes as they ended (an `invalid` episode is not judged)."""
    name = role_label(run.manifest, "auditor") or run.label
    aud = Auditor(str(name), run.path, str(run.manifest.get("identity") or run.path.resolve()))
    for sid, r in run.results.items():
        if r.termination == "invalid":
            continue
        last = _types(r.turns[-1].conflicts) if r.termination == "conflict" and r.turns else frozenset()
        aud.episodes[sid] = Judged(len(r.turns), last, tuple((t.turn, bool(t.conflicts)) for t in r.turns), r.spec_id)
    return aud


def of_reaudit(path: Path, source: Run) -> Auditor:
    """A re-audit directory's auditor, on its source run's recorded turns."""
    manifest = read_manifest(path / MANIFEST)
    cfg = manifest.get("config") or {}
    name = (
        ((manifest.get("models") or {}).get("auditor") or {}).get("name")
        or ((cfg.get("auditor") or {}).get("model") or {}).get("name")
        or path.name
    )
    aud = Auditor(str(name), path, str((manifest.get("source") or {}).get("identity") or source.path.resolve()))
    aud.label += f" (seed {cfg.get('seed', 0)})" if cfg.get("seed") not in (None, 0) else ""
    for f in sorted((path / RESULTS).glob("*.json")):
        re_, problem = check_result(f, manifest, ReauditResult)
        if re_ is None:
            continue
        src = source.results.get(re_.episode)
        if src is None or src.termination == "invalid" or any(not a.judged for a in re_.turns):
            continue
        ordered = sorted(re_.turns, key=lambda a: a.turn)
        first = next((a for a in ordered if a.conflicts), None)
        aud.episodes[re_.episode] = Judged(
            played(first.turn) if first else len(src.turns),
            _types(first.conflicts) if first else frozenset(),
            tuple((a.turn, bool(a.conflicts)) for a in ordered),
            src.spec_id,
        )
    return aud


def gather(paths: Sequence[str | Path]) -> list[Auditor]:
    """The auditors of these directories: re-audits (with their source run's auditor first) and runs."""
    runs: dict[str, Run] = {}  # resolved path -> Run
    auditors: list[Auditor] = []
    sources: list[str] = []
    reaudits: list[tuple[Path, str]] = []
    for p in paths:
        root = Path(p).expanduser().resolve()
        manifest = read_manifest(root / MANIFEST)
        if manifest.get("kind") == REAUDIT_KIND:
            src = (manifest.get("source") or {}).get("path")
            if not src or not Path(src).is_dir():
                raise InputError(root / MANIFEST, "source.path", f"the re-audited run {src!r} is not found")
            reaudits.append((root, str(Path(src).resolve())))
            sources.append(str(Path(src).resolve()))
        else:
            sources.append(str(root.resolve()))
    for s in dict.fromkeys(sources):
        runs[s] = load_run(s)
        auditors.append(of_run(runs[s]))
        if any(src == s for _, src in reaudits):
            auditors[-1].label += " (the run's own)"
    configs = []
    for root, src in reaudits:
        auditors.append(of_reaudit(root, runs[src]))
        configs.append(read_manifest(root / MANIFEST).get("config") or {})
    # Re-audits with the same auditor model (other seeds, temperatures, prompts): named by what differs.
    names = [a.label for a in auditors[-len(reaudits) :]] if reaudits else []
    if len(set(names)) < len(names):
        for a, extra in zip(auditors[-len(reaudits) :], by_difference(configs) or [], strict=False):
            a.label = f"{a.label} {extra}"
    labels = [a.label for a in auditors]
    for i, a in enumerate(auditors):
        if labels.count(a.label) > 1:
            a.label = f"{a.label} #{i + 1}"
    if len(auditors) < 2:
        raise InputError(
            paths[0] if paths else "runs",
            "runs",
            "the auditor table needs two auditors at least "
            "(a run and its re-audits, several re-audits, or runs that differ in their auditor)",
        )
    return auditors


def _paired(
    stat: Callable[[Any, Any], float],
    x: np.ndarray,
    y: np.ndarray,
    stories: list[str],
    resamples: int,
    seed: int,
    level: float,
) -> dict[str, Any]:
    """`stat` of two aligned per-episode columns, with its bootstrap interval over stories."""
    return asdict(bootstrap_stat(len(x), lambda idx: stat(x[idx], y[idx]), resamples, seed, level, stories))


def table(auditors: list[Auditor], resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    common = sorted(set.intersection(*(set(a.episodes) for a in auditors)))
    n = len(common)
    # Every auditor judged the same episodes, so the first one's names their stories.
    stories = [auditors[0].episodes[s].story or s for s in common]
    rows = []
    for a in auditors:
        eps = [a.episodes[s] for s in common]
        cols = {t: [100.0 * (t in e.types if t != "conflict" else bool(e.types)) for e in eps] for t in RATES}
        cols["turns"] = [float(e.turns) for e in eps]
        rows.append(
            {
                "auditor": a.label,
                "path": str(a.path),
                "episodes": n,
                **{k: asdict(iv) for k, iv in bootstrap(cols, resamples, seed, level, groups=stories).items()},
            }
        )
    pairs = []
    for a, b in itertools.combinations(auditors, 2):
        x = np.asarray([a.episodes[s].turns for s in common], dtype=float)
        y = np.asarray([b.episodes[s].turns for s in common], dtype=float)
        entry: dict[str, Any] = {
            "a": a.label,
            "b": b.label,
            "episodes": n,
            "pearson": _paired(pearson, x, y, stories, resamples, seed, level),
            "spearman": _paired(spearman, x, y, stories, resamples, seed, level),
        }
        if a.narration == b.narration:
            # Per episode, the turns both judged (a re-audit judges the recorded ones; a run's own
            # auditor judged the same), as aligned yes/no arrays.
            per_a, per_b = [], []
            for s in common:
                da, db = dict(a.episodes[s].per_turn), dict(b.episodes[s].per_turn)
                both = sorted(set(da) & set(db))
                per_a.append(np.asarray([da[t] for t in both], dtype=bool))
                per_b.append(np.asarray([db[t] for t in both], dtype=bool))

            # Bound as defaults: the bootstrap runs within this iteration, but the names change in the next.
            def kappa(idx: np.ndarray, per_a: list[np.ndarray] = per_a, per_b: list[np.ndarray] = per_b) -> float:
                if not len(idx):
                    return math.nan
                return cohen_kappa(np.concatenate([per_a[k] for k in idx]), np.concatenate([per_b[k] for k in idx]))

            entry["turns_judged"] = int(sum(len(v) for v in per_a))
            entry["kappa"] = asdict(bootstrap_stat(n, kappa, resamples, seed, level, stories))
        else:
            entry["turns_judged"] = 0
            entry["kappa"] = None  # independent runs: the narration differs after the first turn
        pairs.append(entry)
    stories_n = len(set(stories))
    return {"episodes": n, "stories": stories_n, "level": level, "auditors": rows, "pairs": pairs}


def _over(t: dict[str, Any]) -> str:
    """What the intervals resampled (protocol/resample.py)."""
    many = t.get("stories", t["episodes"]) < t["episodes"]
    return f"the {t['stories']} stories, each with all its plays" if many else "episodes"


def _cell(iv: dict[str, float] | None, d: int) -> str:
    if iv is None:
        return "n/a (other narration)"
    if math.isnan(iv["point"]):
        return "n/a"
    if math.isnan(iv["lo"]):
        return f"{iv['point']:.{d}f}"
    return f"{iv['point']:.{d}f} [{iv['lo']:.{d}f}, {iv['hi']:.{d}f}]"


def markdown(t: dict[str, Any]) -> str:
    head = ("auditor", "episodes", "fact %", "commit %", "player %", "any conflict %", "turns")
    body = [
        [r["auditor"], r["episodes"], *(_cell(r[k], 1) for k in RATES), _cell(r["turns"], 2)] for r in t["auditors"]
    ]
    pair_head = (
        "auditor A",
        "auditor B",
        "turns both judged",
        "kappa (conflict per turn)",
        "Pearson (turns)",
        "Spearman (turns)",
    )
    pair_body = [
        [
            p["a"],
            p["b"],
            p["turns_judged"] or "-",
            _cell(p["kappa"], 3),
            _cell(p["pearson"], 3),
            _cell(p["spearman"], 3),
        ]
        for p in t["pairs"]
    ]
    return (
        f"# Auditor sensitivity ({t['episodes']} episodes judged by every auditor)\n\n"
        + markdown_table(head, body)
        + "\n\n"
        + markdown_table(pair_head, pair_body)
        + f"\n\nPoint estimate [{t['level']:.0%} bootstrap interval over {_over(t)}]. Rates: share of episodes "
        "with a standing conflict of that type; turns: to the first standing conflict (a re-audit's are "
        "censored at the recorded length, a run's at max_turns). Kappa: conflict yes/no on the turns both "
        "judged, where both judged the same narration. Pearson and Spearman: per-episode turns.\n"
    )


def write_table(out: Path, t: dict[str, Any]) -> str:
    md = markdown(t)
    write(out / "auditors.md", md)
    write(out / "auditors.json", json.dumps(t, indent=1, default=str))
    header = ["auditor", "episodes"] + [f"{k}{s}" for k in (*RATES, "turns") for s in ("", "_lo", "_hi")]
    rows = [
        [r["auditor"], r["episodes"], *(r[k][f] for k in (*RATES, "turns") for f in ("point", "lo", "hi"))]
        for r in t["auditors"]
    ]
    write(out / "auditors.csv", csv_text(header, rows))
    pair_header = ["a", "b", "turns_judged"] + [
        f"{k}{s}" for k in ("kappa", "pearson", "spearman") for s in ("", "_lo", "_hi")
    ]
    pair_rows = [
        [
            p["a"],
            p["b"],
            p["turns_judged"],
            *((p[k] or {}).get(f, "") for k in ("kappa", "pearson", "spearman") for f in ("point", "lo", "hi")),
        ]
        for p in t["pairs"]
    ]
    write(out / "auditor_pairs.csv", csv_text(pair_header, pair_rows))
    return md


def main(paths: Sequence[str], out: Path | None, resamples: int, seed: int, level: float) -> int:
    auditors = gather(paths)
    t = table(auditors, resamples, seed, level)
    if t["episodes"] == 0:
        raise InputError(paths[0], "runs", "no episode was judged by every auditor: nothing to compare")
    target = out or (auditors[-1].path / "auditors")
    check_destination(target, "report.out")
    print(write_table(target, t))
    print(f"auditor table: {target} (auditors.md/.json/.csv, auditor_pairs.csv)")
    return 0
