"""The auditor's misses folded back: real contradictions per turn, corrected for the recall and the false
alarms mode=plant measured of the run's own auditor.

Each turn of an episode is judged once. Say a turn holds a real contradiction of type k with chance h_k;
the auditor flags it as type k with chance r_k (its recall with the type named right) and flags a turn
without one as type k with chance f_k (its false alarms of that type). The share of judged turns flagged
as type k is then g_k = h_k r_k + (1 - h_k) f_k, so

    h_k = (g_k - f_k) / (r_k - f_k),

clipped to [0, 1] (Rogan and Gladen's correction of a prevalence for a test's sensitivity and
specificity). g_k is read from the run: the episodes whose ending conflict holds type k, over the turn
records of the scored episodes (every turn record was judged; only the last of an episode can be flagged).
It assumes a turn's chance of a contradiction does not depend on a contradiction missed before it, and
that the planted items are as hard to find as the narrator's own contradictions (a fixed sentence is
easier: r_k is then high and h_k low).

The interval carries both uncertainties: each draw takes g_k, r_k and f_k from their Jeffreys posteriors
Beta(x + 1/2, n - x + 1/2), each at the effective number of turns or items its bootstrap of stories
implies (report/plants.py effective_items: the run's stories, with all their plays, for g_k; the plants'
stories for r_k and f_k); the interval is the draws' percentiles, widened where needed to take in the
point. A percentile bootstrap of g_k alone fell short where flags are few (92.0% at 8 expected).
scripts/misses_sim.py measures its coverage (docs/measurements/2026-12-07-planted.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..protocol.stages import CONFLICT_TYPES
from .plant_dirs import PlantDir
from .plants import AuditorFigures, Share, effective_items, measure
from .runs import Run
from .tables import markdown_table

RECALL = "type_right"  # a real type-k contradiction ends an episode as type k only when flagged as type k
FALSE_ALARM = "false_alarm"


@dataclass(frozen=True)
class Measured:
    """A share mode=plant measured, as the correction draws it: its value and effective number of items."""

    value: float
    n_eff: float

    @classmethod
    def of(cls, share: Share) -> Measured:
        return cls(share.value, share.n_eff)

    def draws(self, rng: np.random.Generator, size: int) -> np.ndarray:
        x, n = self.value * self.n_eff, self.n_eff
        return rng.beta(x + 0.5, n - x + 0.5, size=size)


@dataclass(frozen=True)
class CorrectedRate:
    type: str
    flagged: float  # g: the share of judged turns flagged as this type
    recall: float
    false_alarm: float
    value: float  # h: the share of turns holding a real contradiction of this type
    lo: float
    hi: float


def correct(g: np.ndarray | float, r: np.ndarray | float, f: np.ndarray | float) -> np.ndarray:
    """h = (g - f) / (r - f), clipped to [0, 1]; NaN where r <= f (the auditor tells nothing apart)."""
    g, r, f = np.asarray(g, dtype=float), np.asarray(r, dtype=float), np.asarray(f, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        h = np.clip((g - f) / (r - f), 0.0, 1.0)
    return np.where(r > f, h, np.nan)


def corrected_rates(
    stories: Sequence[str],
    turns: np.ndarray,
    ended_as: Mapping[str, np.ndarray],
    measured: Mapping[str, tuple[Measured, Measured]],
    resamples: int,
    seed: int,
    level: float,
) -> list[CorrectedRate]:
    """Per type of `measured` (type -> (recall, false alarm)): episodes' `turns` judged and whether each
    `ended_as` that type, their stories; the corrected share of turns with its interval (module docstring)."""
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    out = []
    for t, (rec, fa) in measured.items():
        flagged = Measured(*effective_items(ended_as[t].astype(float), turns, stories, resamples, seed, level))
        point = float(correct(flagged.value, rec.value, fa.value))
        h_star = correct(flagged.draws(rng, resamples), rec.draws(rng, resamples), fa.draws(rng, resamples))
        if math.isnan(point) or np.isnan(h_star).all():
            out.append(CorrectedRate(t, flagged.value, rec.value, fa.value, point, math.nan, math.nan))
            continue
        lo, hi = np.nanquantile(h_star, [alpha, 1 - alpha])
        row = CorrectedRate(t, flagged.value, rec.value, fa.value, point, min(float(lo), point), max(float(hi), point))
        out.append(row)
    return out


def auditor_of(manifest: Mapping[str, object]) -> tuple[str, str]:
    """(engine, model) of the auditor a run or plant directory's recorded config names."""
    raw = manifest.get("config")
    cfg = raw if isinstance(raw, dict) else {}
    auditor = cfg.get("auditor") or {}
    engine = auditor.get("engine") or (cfg.get("engine") or {}).get("name") or ""
    return str(engine), str((auditor.get("model") or {}).get("name") or "")


def run_misses(
    run: Run, plant: PlantDir, figs: AuditorFigures, resamples: int, seed: int, level: float
) -> list[CorrectedRate]:
    """A run's per-turn contradiction rates corrected for its auditor's measured misses and false alarms."""
    shares = {s.figure.key: s for s in figs.shares}
    measured = {
        t: (Measured.of(shares[f"{RECALL}:{t}"]), Measured.of(shares[f"{FALSE_ALARM}:{t}"]))
        for t in CONFLICT_TYPES
        if f"{RECALL}:{t}" in shares and shares[f"{RECALL}:{t}"].items
    }
    scored = [m for m in run.metrics() if m.termination != "invalid"]
    ended = {t: np.asarray([bool(getattr(m, t)) for m in scored]) for t in measured}
    turns = np.asarray([m.turns for m in scored], dtype=float)
    return corrected_rates([m.spec_id for m in scored], turns, ended, measured, resamples, seed, level)


def misses_markdown(rows: Sequence[tuple[str, str, list[CorrectedRate]]], level: float) -> str:
    """(run label, plant directory, its corrected rates) as one table."""

    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{100 * x:.2f}"

    head = ("run", "type", "flagged / 100 turns", "recall %", "false alarm %", "real / 100 turns", f"{level:.0%}")
    body = [
        (label, r.type, pct(r.flagged), f"{100 * r.recall:.1f}", f"{100 * r.false_alarm:.1f}", pct(r.value))
        + (f"[{pct(r.lo)}, {pct(r.hi)}]",)
        for label, _, rates in rows
        for r in rates
    ]
    dirs = ", ".join(dict.fromkeys(d for _, d, _ in rows))
    note = (
        f"Real contradictions per 100 turns judged, corrected for the auditor's recall (type named right) and "
        f"false alarms as mode=plant measured them ({dirs}): (flagged - false alarm) / (recall - false alarm). "
        "Planted contradictions easier to find than the narrator's own make the correction too small."
    )
    return markdown_table(head, body) + "\n\n" + note


def misses_section(
    runs: Sequence[Run], plants: Sequence[PlantDir], resamples: int, seed: int, level: float
) -> tuple[str, list[str]]:
    """The report's section (empty when no plant directory measured a run's auditor) and its notes: each run
    corrected by the first plant directory whose auditor (engine and model) is the run's."""
    figs = {d.path: measure(d.label, str(d.path), d.plants, d.results, resamples, seed, level) for d in plants}
    rows, notes = [], []
    for run in runs:
        match = next((d for d in plants if auditor_of(d.manifest) == auditor_of(run.manifest)), None)
        if match is None:
            continue
        rows.append((run.label, str(match.path), run_misses(run, match, figs[match.path], resamples, seed, level)))
    for d in plants:
        if not any(p == str(d.path) for _, p, _ in rows):
            engine, model = auditor_of(d.manifest)
            notes.append(f"{d.path}: its auditor ({model or '?'} on {engine or '?'}) audited none of these runs")
    return (misses_markdown(rows, level) if rows else ""), notes
