"""An auditor measured against planted contradictions (mode=plant): recall per conflict type, the type named
right and the id named right (a standing conflict of the planted type citing the planted fact, commitment or
`input`), the false-alarm rate on clean turns, each with its interval clustered by story; and, for auditors
judged on the same items, their paired differences.

A figure is a share of items: `hits / items` over the items it counts (the planted items of one type, or
the clean ones). The items of one story share its ledger and its narrator, so they are correlated; every
interval draws *stories* with replacement, a drawn story bringing all its items (protocol/resample.py's
rule). A share's band is Jeffreys' interval at the effective number of items that bootstrap implies
(p(1 - p) / its variance, at most the items counted; protocol/resample.jeffreys_band), widened for few
stories (resample.few_stories_factor), with the exact one-sided limit at 0 or all hits (the modified
Jeffreys interval of Brown, Cai and DasGupta 2001): a percentile band of a share near 0 or 1 from 30-50
stories falls short of its level. A difference between two auditors is paired by item: its interval is
the difference plus and minus z times the standard error of a bootstrap of stories (both auditors' items
of a drawn story together), widened for few stories the same way; its p-value is the paired sign-flip
permutation test by story that mode=compare uses (report/compare.py). scripts/plant_sim.py measures the
coverage (docs/measurements/2026-12-07-planted.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..protocol.plant import CLEAN, ItemAudit, PlantResult
from ..protocol.resample import clusters, few_stories_factor, jeffreys_band
from ..protocol.stages import CONFLICT_TYPES
from .paired import ALPHA, holm, sign_flips


@dataclass(frozen=True)
class FigureDef:
    key: str  # recall:fact, type_right:fact, id_right:fact, false_alarm, false_alarm:fact
    label: str
    kind: str  # the items it counts: a conflict type, or `clean`

    def hit(self, a: ItemAudit) -> bool:
        head, _, ctype = self.key.partition(":")
        if head == "recall":
            return a.flagged
        if head == "type_right":
            return a.typed
        if head == "id_right":
            return a.aimed
        return a.flagged if not ctype else ctype in a.types


def figure_defs(kinds: Sequence[str]) -> list[FigureDef]:
    out = [FigureDef(f"recall:{t}", f"recall, {t}", t) for t in kinds]
    out += [FigureDef(f"type_right:{t}", f"type named right, {t}", t) for t in kinds]
    out += [FigureDef(f"id_right:{t}", f"id named right, {t}", t) for t in kinds]
    out.append(FigureDef("false_alarm", "false alarm (any type)", CLEAN))
    out += [FigureDef(f"false_alarm:{t}", f"false alarm as {t}", CLEAN) for t in CONFLICT_TYPES]
    return out


@dataclass(frozen=True)
class Share:
    figure: FigureDef
    hits: int
    items: int
    stories: int
    value: float  # hits / items
    lo: float
    hi: float
    n_eff: float = math.nan  # the effective number of items its band rests on (effective_items)


@dataclass(frozen=True)
class AuditorFigures:
    label: str
    path: str
    plants: str  # the items' digest: auditors are paired only on the same plants
    judged: int
    failed: int  # items whose audit stayed invalid (left out of every figure)
    shares: tuple[Share, ...]
    notes: tuple[str, ...] = ()
    rewritten: int = 0  # planted items the planting model rewrote (plant.model)
    refused: int = 0  # its rewrites that failed their check: those items are the fixed edit


def judged_items(results: Sequence[PlantResult]) -> list[tuple[str, ItemAudit]]:
    """(story, item audit) for every judged item, in the results' order."""
    return [(r.spec_id, a) for r in results for a in r.items if a.judged]


def _story_sums(stories: Sequence[str], values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Per story (first-seen order), the column sums of `values` (items x columns)."""
    c = clusters(stories)
    names = list(dict.fromkeys(stories))
    return names, np.stack([values[idx].sum(axis=0) for idx in c.plays]) if c.plays else np.zeros((0, values.shape[1]))


def _story_draws(g: int, resamples: int, seed: int) -> np.ndarray:
    """How often each story is drawn, per resample (resamples x stories): stories with replacement."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, g, size=(resamples, g))
    return np.stack([np.bincount(row, minlength=g) for row in picks]) if g else np.zeros((resamples, 0))


def effective_items(
    hits: np.ndarray, counted: np.ndarray, stories: Sequence[str], resamples: int, seed: int, level: float
) -> tuple[float, float]:
    """(sum(hits) / sum(counted), the effective number of items): as many independent items as would give
    the variance a bootstrap of stories finds, widened for few stories, at most the items counted
    (module docstring). (nan, 0) when nothing is counted."""
    n = float(counted.sum())
    if n == 0:
        return math.nan, 0.0
    p = float(hits.sum()) / n
    keep = counted.astype(bool)
    kept = [s for s, k in zip(stories, keep, strict=True) if k]
    _, sums = _story_sums(kept, np.stack([hits[keep], counted[keep]], axis=1).astype(float))
    g = len(sums)
    w = _story_draws(g, resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (w @ sums[:, 0]) / (w @ sums[:, 1])
    var = float(np.nanvar(boot)) * few_stories_factor(g, level) ** 2
    return p, (min(n, p * (1 - p) / var) if var > 0 else n)


def share_band(
    hits: np.ndarray, counted: np.ndarray, stories: Sequence[str], resamples: int, seed: int, level: float
) -> tuple[float, float, float]:
    """(value, lo, hi) of sum(hits) / sum(counted) over items, clustered by story (module docstring)."""
    p, n_eff = effective_items(hits, counted, stories, resamples, seed, level)
    if n_eff == 0:
        return math.nan, math.nan, math.nan
    lo, hi = jeffreys_band(np.asarray([p]), np.asarray([n_eff]), np.asarray([n_eff]), level)
    # None of n (or all): Jeffreys' limit falls short (0 of 55 reaches only 4.4%); Brown, Cai and DasGupta's
    # modified interval takes the exact one-sided limit there, 1 - (alpha/2)^(1/n).
    edge = ((1 - level) / 2) ** (1 / n_eff)
    if p == 0:
        return p, 0.0, max(float(hi[0]), 1 - edge)
    if p == 1:
        return p, min(float(lo[0]), edge), 1.0
    return p, float(lo[0]), float(hi[0])


def measure(
    label: str, path: str, plants: str, results: Sequence[PlantResult], resamples: int, seed: int, level: float
) -> AuditorFigures:
    """One auditor's figures over its judged items."""
    items = judged_items(results)
    failed = sum(not a.judged for r in results for a in r.items)
    kinds = [t for t in CONFLICT_TYPES if any(a.item.kind == t for _, a in items)]
    stories = [s for s, _ in items]
    shares = []
    for f in figure_defs(kinds):
        counted = np.asarray([a.item.kind == f.kind for _, a in items], dtype=float)
        hits = np.asarray([a.item.kind == f.kind and f.hit(a) for _, a in items], dtype=float)
        value, lo, hi = share_band(hits, counted, stories, resamples, seed, level)
        n_eff = effective_items(hits, counted, stories, resamples, seed, level)[1]
        n_stories = len({s for s, c in zip(stories, counted, strict=True) if c})
        shares.append(Share(f, int(hits.sum()), int(counted.sum()), n_stories, value, lo, hi, n_eff))
    notes = [f"{failed} item(s) whose audit stayed invalid after its retries: left out"] if failed else []
    planted = [a.item for r in results for a in r.items if a.item.planted]
    rewritten = sum(i.by == "model" for i in planted)
    refused = Counter(i.refused.split(" (")[0] for i in planted if i.refused)
    if rewritten or refused:
        why = "; ".join(f"{n} x {reason}" for reason, n in refused.most_common(3))
        notes.append(
            f"planting model: {rewritten} of {len(planted)} planted items rewritten by it; {refused.total()} "
            f"rewrite(s) refused, those items planted by the fixed edit instead" + (f" ({why})" if why else "")
        )
    return AuditorFigures(
        label, path, plants, len(items), failed, tuple(shares), tuple(notes), rewritten, refused.total()
    )


# ---- paired differences -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedDifference:
    figure: FigureDef
    base: float
    other: float
    diff: float  # other - base, on the items both judged
    lo: float
    hi: float
    p: float
    items: int
    stories: int
    p_holm: float = math.nan


@dataclass(frozen=True)
class PairedComparison:
    baseline: str
    other: str
    rows: tuple[PairedDifference, ...]
    notes: tuple[str, ...] = ()


def paired(
    base: Sequence[PlantResult],
    other: Sequence[PlantResult],
    labels: tuple[str, str],
    resamples: int,
    seed: int,
    level: float,
) -> PairedComparison:
    """Every figure's difference other - base on the items both auditors judged, paired by item."""
    a = {it.item.item: (s, it) for s, it in judged_items(base)}
    b = {it.item.item: it for _, it in judged_items(other)}
    shared = [k for k in a if k in b]
    stories = [a[k][0] for k in shared]
    kinds = [t for t in CONFLICT_TYPES if any(a[k][1].item.kind == t for k in shared)]
    rows = []
    for f in figure_defs(kinds):
        counted = np.asarray([a[k][1].item.kind == f.kind for k in shared], dtype=float)
        ha = np.asarray([c and f.hit(a[k][1]) for k, c in zip(shared, counted, strict=True)], dtype=float)
        hb = np.asarray([c and f.hit(b[k]) for k, c in zip(shared, counted, strict=True)], dtype=float)
        rows.append(_difference(f, ha, hb, counted, stories, resamples, seed, level))
    left = len(a) + len(b) - 2 * len(shared)
    notes = (f"{left} item(s) judged by only one of the two: left out of the differences",) if left else ()
    return PairedComparison(labels[0], labels[1], tuple(rows), notes)


def _difference(
    f: FigureDef,
    ha: np.ndarray,
    hb: np.ndarray,
    counted: np.ndarray,
    stories: Sequence[str],
    resamples: int,
    seed: int,
    level: float,
) -> PairedDifference:
    n = float(counted.sum())
    if n == 0:
        return PairedDifference(f, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0, 0)
    keep = counted.astype(bool)
    kept = [s for s, k in zip(stories, keep, strict=True) if k]
    _, sums = _story_sums(kept, np.stack([ha[keep], hb[keep], counted[keep]], axis=1))
    g = len(sums)
    pa, pb = float(ha.sum()) / n, float(hb.sum()) / n
    w = _story_draws(g, resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (w @ (sums[:, 1] - sums[:, 0])) / (w @ sums[:, 2])
    # The bootstrap's standard error, widened for few stories as the shares' bands are, about the difference:
    # a difference of two shares of the same items is near normal, and the percentile band of its lumpy
    # bootstrap (steps of 1/items) fell short at a true 0 (92.6% in scripts/plant_sim.py, 500 runs).
    observed = pb - pa
    half = float(stats.norm.ppf(1 - (1 - level) / 2)) * few_stories_factor(g, level) * float(np.nanstd(boot, ddof=1))
    lo, hi = observed - half, observed + half
    # Sign flips by story: a story's items keep their two verdicts and swap which auditor gave them.
    by_story = sums[:, 1] - sums[:, 0]
    flips = sign_flips(g, resamples, np.random.default_rng(seed + 1))
    null = np.where(flips, -by_story, by_story).sum(axis=1) / n
    far = np.abs(null) >= abs(observed) - 1e-12
    p = float(far.mean()) if len(flips) == 2**g else float((1 + far.sum()) / (1 + len(flips)))
    return PairedDifference(f, pa, pb, observed, float(lo), float(hi), p, int(n), g)


def compare_auditors(
    named: Sequence[tuple[str, Sequence[PlantResult]]], resamples: int, seed: int, level: float
) -> list[PairedComparison]:
    """Each auditor after the first against the first; Holm over them per figure when more than one."""
    if len(named) < 2:
        return []
    base_label, base = named[0]
    out = [paired(base, res, (base_label, label), resamples, seed, level) for label, res in named[1:]]
    if len(out) > 1:
        keys = [d.figure.key for d in out[0].rows]
        for key in keys:
            where = [(i, j) for i, c in enumerate(out) for j, d in enumerate(c.rows) if d.figure.key == key]
            adjusted = holm([out[i].rows[j].p for i, j in where])
            for (i, j), q in zip(where, adjusted, strict=True):
                rows = list(out[i].rows)
                rows[j] = PairedDifference(**{**rows[j].__dict__, "p_holm": q})
                out[i] = PairedComparison(out[i].baseline, out[i].other, tuple(rows), out[i].notes)
    return out


def significant(d: PairedDifference) -> bool:
    p = d.p if math.isnan(d.p_holm) else d.p_holm
    return p < ALPHA
