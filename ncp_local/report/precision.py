"""The auditor's error in the headline figures: conflict rates and S(t) corrected for its precision.

A filled human review sheet (`mode=review`, then `review.sheet=FILE` on `mode=report`) says, for a
sample of the conflicts the auditor confirmed, whether a human upholds each one. Per conflict type
k that gives the auditor's precision p_k (upheld / reviewed), with its exact (Clopper-Pearson)
binomial interval. The report then corrects what rests on the auditor's verdicts:

- an episode whose ending turn holds c conflicts, of precisions p_1..p_c, really ended in a
  conflict with probability w = 1 - (1 - p_1)...(1 - p_c) (its conflicts judged independently);
  of type k with 1 - (1 - p_k)^{c_k}. The corrected type-k rate is the mean of the latter over the
  scored episodes, and the corrected conflict-free count the scored episodes minus the sum of w;
- S(t): each conflict ending counts as an ending with weight w and, with weight 1 - w, as a story
  still going after its turn (censored there, as a `context_limit` one: it would have continued,
  for how long nobody knows). The weighted product-limit estimate is computed here with numpy;
  tests/test_precision.py checks it against lifelines' weighted Kaplan-Meier.

Intervals carry both errors: each of `resamples` bootstrap draws resamples the stories of the run
(each with all its plays: `protocol/resample.py`) and, apart, draws each type's precision from its
own uncertainty, the Jeffreys posterior Beta(upheld + 1/2, reviewed - upheld + 1/2), then
recomputes the corrected figure; the interval is the draws' percentiles. Drawing the precision
(rather than resampling the reviewed items) keeps its uncertainty when every reviewed item agrees:
5 of 5 upheld is a precision anywhere from about 60% to 100%, not exactly 1. Jeffreys' interval is
the one whose coverage stays near its level for small samples (Brown, Cai and DasGupta, 2001).
The corrected figure itself is unbiased: per type it estimates (1 - p_k)^c, the chance c conflicts
of type k are all wrong, by C(m - u, c) / C(m, c) from u upheld of m reviewed (the share of c-item
subsets of the sheet with none upheld; 1 - u / m for one conflict), the one unbiased estimate there is;
with more conflicts of a type in one ending than items reviewed none exists, and (1 - u / m)^c stands in.
The rates and the conflict-free count are sums of such products (each type's sheet its own), so they are
unbiased; S(t) takes the same weights. The interval is the draws' percentiles widened, where needed, to
take in the point: 0 of 3 upheld puts the point at a precision of 0 while every draw from Beta(1/2, 7/2)
lies above it. For the rates and the conflict-free share it is also widened to Jeffreys' interval at the
draws' effective sample size (report/endings.py's `effective_band`, the incidence's band): over 30
single-play stories the percentiles alone covered 90.8-92.9% where the sheet was 3-6 items and the
stories' share of the error large, Jeffreys' alone 69-86% where 2-3 items left the precision's draws
lopsided; the wider of the two covers 93-97%. The median of the draws, the point before, sat nearer 1/2
than upheld / reviewed and moved fact % corrected about -2 points at sheets of 2-6 items
(docs/measurements/2026-12-07-corrected-and-censored.md).
A type with no reviewed item is not corrected (p = 1), and the report says so.
Without a sheet nothing changes, and the report says its figures are uncorrected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ..errors import InputError
from ..protocol.metrics import product_limit
from ..protocol.records import conflict_key
from ..protocol.resample import clusters
from ..protocol.resample import draws as resample_draws
from ..protocol.stages import CONFLICT_TYPES
from .endings import effective_band
from .runs import Run
from .sheet import read_sheet
from .stats import Interval
from .tables import csv_text, markdown_table

# The sheet columns that tie a row to a conflict of a reported run.
KEY_COLUMNS = ("run_dir", "spec_id", "type", "target_id")


@dataclass(frozen=True)
class Verdict:
    """One reviewed conflict: which run and episode, its (type, target), and whether a human upholds it."""

    run_dir: str
    spec_id: str
    type: str
    target_id: str
    upheld: bool


def read_verdicts(path: str | Path, runs: Sequence[Run]) -> list[Verdict]:
    """The sheet's reviewed rows, each checked against the reported runs (InputError naming file and row):
    its run among them, its episode a conflict termination there, its (type, target) one of that
    ending's conflicts, and no conflict reviewed twice. Blank verdicts (not reviewed) are skipped."""
    path = Path(path).expanduser()
    rows = read_sheet(path)
    if rows and (missing := [c for c in KEY_COLUMNS if c not in rows[0]]):
        raise InputError(path, "header", f"missing column(s) {', '.join(missing)}")
    # Resolved once: a sheet may hold hundreds of rows, and the sheet's paths may be written relative.
    by_dir = {Path(r.path).expanduser().resolve(): r for r in runs}
    seen: dict[tuple[str, ...], int] = {}
    out: list[Verdict] = []
    for row_no, row in enumerate(rows, start=2):
        run = by_dir.get(Path(row["run_dir"]).expanduser().resolve())
        if run is None:
            raise InputError(
                path,
                f"row {row_no}: run_dir",
                f"{row['run_dir']!r} is not one of the reported runs (a sheet from another run?)",
            )
        result = run.results.get(row["spec_id"])
        if result is None or result.termination != "conflict":
            what = "has no such episode" if result is None else f"ended in {result.termination}, not a conflict"
            raise InputError(path, f"row {row_no}: spec_id", f"{row['spec_id']!r}: {run.path} {what}")
        # A player-input conflict's target may be written either way; conflict_key makes them one.
        standing = {c.key for c in result.turns[-1].conflicts}
        key = conflict_key(str(row["type"]), str(row["target_id"]))
        if key not in standing:
            raise InputError(
                path,
                f"row {row_no}: target_id",
                f"{row['type']} {row['target_id']!r} is not a "
                f"conflict of {row['spec_id']}'s ending in {run.path} (a sheet from another run?)",
            )
        ident = (str(run.path), row["spec_id"], *key)
        if ident in seen:
            raise InputError(path, f"row {row_no}", f"reviews the same conflict as row {seen[ident]}")
        seen[ident] = row_no
        if row["verdict"]:
            out.append(Verdict(str(run.path), row["spec_id"], key[0], key[1], row["verdict"] == "agree"))
    return out


@dataclass(frozen=True)
class Precision:
    type: str
    reviewed: int
    upheld: int
    lo: float  # exact binomial interval at the report's level
    hi: float

    @property
    def value(self) -> float | None:
        return self.upheld / self.reviewed if self.reviewed else None


def precisions(verdicts: Sequence[Verdict], level: float) -> dict[str, Precision]:
    out = {}
    for t in CONFLICT_TYPES:
        mine = [v for v in verdicts if v.type == t]
        n, k = len(mine), sum(v.upheld for v in mine)
        if n:
            ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
            out[t] = Precision(t, n, k, float(ci.low), float(ci.high))
        else:
            out[t] = Precision(t, 0, 0, math.nan, math.nan)
    return out


# ---- the corrected figures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Episodes:
    """A run's scored episodes as arrays: turns played, censored or not, and per conflict type the
    number of standing conflicts in the ending turn (0 unless it ended in a conflict)."""

    turns: np.ndarray  # int, per episode
    censored: np.ndarray  # bool: context_limit
    conflicts: dict[str, np.ndarray]  # type -> int count per episode
    stories: tuple[str, ...] = ()  # per episode, its story (a story's trials share it)


def episodes_of(run: Run) -> Episodes:
    scored = [r for r in run.results.values() if r.termination != "invalid"]
    counts = {t: np.zeros(len(scored), dtype=int) for t in CONFLICT_TYPES}
    for i, r in enumerate(scored):
        if r.termination == "conflict":
            for c in r.turns[-1].conflicts:
                counts[c.type][i] += 1
    return Episodes(
        np.array([len(r.turns) for r in scored], dtype=int),
        np.array([r.termination == "context_limit" for r in scored], dtype=bool),
        counts,
        tuple(r.spec_id for r in scored),
    )


def unbiased_miss(upheld: int, reviewed: int, most: int) -> np.ndarray:
    """[estimate of (1 - p)^c for c = 0..most] from `upheld` of `reviewed`: C(m - u, c) / C(m, c), unbiased for
    c <= m (module docstring); (1 - u / m)^c past it. No reviewed item: p = 1 (taken as judged)."""
    c = np.arange(most + 1)
    if not reviewed:
        return (c == 0).astype(float)
    m, u = reviewed, upheld
    return np.array([math.comb(m - u, j) / math.comb(m, j) if j <= m else (1 - u / m) ** j for j in c])


def _real(eps: Episodes, miss: dict[str, np.ndarray], idx: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per type, the chance each (resampled) episode really ended by that type; and by any conflict.
    miss[t][c]: the chance c conflicts of type t are all wrong."""
    by_type = {t: 1.0 - miss[t][eps.conflicts[t][idx]] for t in CONFLICT_TYPES}
    none = np.ones(len(idx))
    for t in CONFLICT_TYPES:
        none = none * miss[t][eps.conflicts[t][idx]]
    return by_type, 1.0 - none


@dataclass(frozen=True)
class Corrected:
    """One run's figures as judged and corrected, each with its interval."""

    label: str
    scored: int
    rates: dict[str, tuple[float, Interval]]  # "fact_pct"... -> (as judged, corrected with interval)
    conflict_free: tuple[float, Interval]
    survival: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]  # judged, corr, lo, hi
    uncorrected_types: tuple[str, ...]  # no reviewed item: taken as judged


RATE_KEYS = {"fact": "fact_pct", "commitment": "commitment_pct", "player_input": "player_input_pct"}


def _point(eps: Episodes, miss: dict[str, np.ndarray], idx: np.ndarray, max_turns: int) -> np.ndarray:
    """[rates of each type (%), conflict-free count, S(0..max_turns)] for one draw."""
    by_type, ended = _real(eps, miss, idx)
    # A context_limit episode never ended; only conflict endings carry a weight below 1.
    is_conflict = sum(eps.conflicts[t][idx] for t in CONFLICT_TYPES) > 0
    weight = np.where(is_conflict, ended, 1.0)
    weight = np.where(eps.censored[idx], 0.0, weight)
    rates = [100.0 * float(np.mean(by_type[t])) for t in CONFLICT_TYPES]
    free = float(len(idx) - np.sum(ended))
    return np.array([*rates, free, *product_limit(eps.turns[idx], weight, max_turns)])


def correct(
    run: Run, prec: dict[str, Precision], verdicts: Sequence[Verdict], resamples: int, seed: int, level: float
) -> Corrected:
    eps = episodes_of(run)
    n = len(eps.turns)
    max_turns = run.max_turns
    most = max([1, *(int(c.max(initial=0)) for c in eps.conflicts.values())])
    powers = np.arange(most + 1)
    judged = _point(eps, {t: (powers == 0).astype(float) for t in CONFLICT_TYPES}, np.arange(n), max_turns)
    point = _point(
        eps, {t: unbiased_miss(prec[t].upheld, prec[t].reviewed, most) for t in CONFLICT_TYPES}, np.arange(n), max_turns
    )
    # Two generators: the stories' draws follow the one rule (and its stream), the precisions their own.
    p_rng = np.random.default_rng([seed, 1])
    reviewed = {t: (prec[t].upheld, prec[t].reviewed) for t in CONFLICT_TYPES}
    draws = []
    for idx in resample_draws(clusters(eps.stories or [str(i) for i in range(n)]), resamples, seed):
        p = {t: (float(p_rng.beta(k + 0.5, m - k + 0.5)) if m else 1.0) for t, (k, m) in reviewed.items()}
        draws.append(_point(eps, {t: (1.0 - p[t]) ** powers for t in CONFLICT_TYPES}, idx, max_turns))
    alpha = (1 - level) / 2
    k = len(CONFLICT_TYPES)
    if draws:
        many = np.array(draws)
        lo, hi = np.quantile(many, [alpha, 1 - alpha], axis=0)
        # Widened to take in the point (module docstring); a min or max of two curves that never rise never rises.
        lo, hi = np.minimum(lo, point), np.maximum(hi, point)
        # The rates and the conflict-free share: also Jeffreys' interval at the draws' effective sample size, as
        # the endings' incidence, and the band is the wider of the two (module docstring). A leading column of
        # zeros stands for effective_band's t = 0.
        scale = np.array([100.0] * k + [float(max(n, 1))])
        shares = np.concatenate([[0.0], point[: k + 1] / scale])
        drawn = np.concatenate([np.zeros((len(many), 1)), many[:, : k + 1] / scale], axis=1)
        stories = len(set(eps.stories)) if eps.stories else n
        s_lo, s_hi = effective_band(shares, drawn, stories, n, level)
        lo[: k + 1] = np.minimum(lo[: k + 1], s_lo[1:] * scale)
        hi[: k + 1] = np.maximum(hi[: k + 1], s_hi[1:] * scale)
    else:
        lo = hi = np.full(len(point), math.nan)
    ivs = [Interval(float(a), float(b), float(c)) for a, b, c in zip(point, lo, hi, strict=True)]
    return Corrected(
        label=run.label,
        scored=n,
        rates={RATE_KEYS[t]: (float(judged[i]), ivs[i]) for i, t in enumerate(CONFLICT_TYPES)},
        conflict_free=(float(judged[k]), ivs[k]),
        survival=(
            tuple(float(x) for x in judged[k + 1 :]),
            tuple(iv.point for iv in ivs[k + 1 :]),
            tuple(iv.lo for iv in ivs[k + 1 :]),
            tuple(iv.hi for iv in ivs[k + 1 :]),
        ),
        uncorrected_types=tuple(t for t, pr in prec.items() if not pr.reviewed),
    )


# ---- what the report shows --------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditorError:
    sheet: str
    precision: dict[str, Precision]
    corrected: list[Corrected]  # the runs the sheet reviewed
    others: list[str]  # labels of reported runs the sheet has no item from: uncorrected


def auditor_error(sheet: str | Path, runs: Sequence[Run], resamples: int, seed: int, level: float) -> AuditorError:
    verdicts = read_verdicts(sheet, runs)
    prec = precisions(verdicts, level)
    reviewed = {v.run_dir for v in verdicts}
    mine = [r for r in runs if str(r.path) in reviewed]
    return AuditorError(
        str(sheet),
        prec,
        [correct(r, prec, verdicts, resamples, seed, level) for r in mine],
        [r.label for r in runs if str(r.path) not in reviewed],
    )


UNCORRECTED_NOTE = (
    "Conflict rates and S(t) are as the auditor judged them, uncorrected for its error: no review "
    "sheet was given (`mode=review` samples one; `review.sheet=FILE` on `mode=report` corrects them)."
)


def _iv(iv: Interval, d: int) -> str:
    if math.isnan(iv.lo):
        return f"{iv.point:.{d}f}"
    return f"{iv.point:.{d}f} [{iv.lo:.{d}f}, {iv.hi:.{d}f}]"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def survival_points(max_turns: int) -> list[int]:
    """The turns at which the table shows S(t): the turn bands' ends within the run, and its last turn."""
    return [t for t in (1, 5, 10, 20, 50) if t < max_turns] + [max_turns]


def intro(err: AuditorError, level: float) -> str:
    items = sum(p.reviewed for p in err.precision.values())
    return (
        f"From the review sheet `{err.sheet}` ({items} reviewed conflict(s)): the auditor's precision per "
        f"conflict type (the share of its conflicts a human upholds), with its exact {level:.0%} binomial "
        "interval, and the figures that rest on its verdicts corrected for it. Corrected intervals: "
        f"{level:.0%} bootstrap over the stories (each with all its plays), each draw taking every type's precision "
        "from its own uncertainty (Jeffreys: Beta(upheld + 1/2, disputed + 1/2)); for the rates, widened to "
        "Jeffreys' interval at the draws' effective sample size where that is wider. Corrected points: unbiased "
        "for the precision (upheld / reviewed, per conflict)."
    )


PRECISION_HEADER = ("type", "reviewed", "upheld", "precision %")
CORRECTED_HEADER = ("figure", "as judged", "corrected")


def precision_rows(err: AuditorError) -> list[list[Any]]:
    return [
        [
            p.type,
            p.reviewed,
            p.upheld,
            "n/a: not corrected" if p.value is None else f"{_pct(p.value)} [{_pct(p.lo)}, {_pct(p.hi)}]",
        ]
        for p in err.precision.values()
    ]


def corrected_rows(c: Corrected) -> list[list[Any]]:
    rows: list[list[Any]] = [
        [
            key.replace("_pct", " %").replace("commitment", "commit").replace("player_input", "player"),
            f"{judged:.1f}",
            _iv(iv, 1),
        ]
        for key, (judged, iv) in c.rates.items()
    ]
    rows.append(["conflict-free plays", f"{c.conflict_free[0]:.0f}", _iv(c.conflict_free[1], 1)])
    judged_s, corr_s, lo_s, hi_s = c.survival
    for t in survival_points(len(judged_s) - 1):
        rows.append(
            [f"S({t}) %", f"{100 * judged_s[t]:.1f}", _iv(Interval(100 * corr_s[t], 100 * lo_s[t], 100 * hi_s[t]), 1)]
        )
    return rows


def corrected_title(c: Corrected) -> str:
    return f"{c.label} ({c.scored} scored episodes)"


def notes(err: AuditorError, c: Corrected | None = None) -> str:
    if c is not None:
        return f"Not corrected (no reviewed item): {', '.join(c.uncorrected_types)}." if c.uncorrected_types else ""
    return f"Not corrected (the sheet has no item from them): {', '.join(err.others)}." if err.others else ""


def auditor_error_markdown(err: AuditorError | None, level: float) -> str:
    if err is None:
        return UNCORRECTED_NOTE
    parts = [intro(err, level), markdown_table(PRECISION_HEADER, precision_rows(err))]
    for c in err.corrected:
        parts.append(
            f"### {corrected_title(c)}\n\n"
            + markdown_table(CORRECTED_HEADER, corrected_rows(c))
            + (f"\n\n{n}" if (n := notes(err, c)) else "")
        )
    if n := notes(err):
        parts.append(n)
    return "\n\n".join(parts)


def corrected_survival_csv(err: AuditorError) -> str:
    header = ["label", "turns_played", "survival_as_judged", "survival_corrected", "lo", "hi"]
    body: list[list[Any]] = []
    for c in err.corrected:
        for t, row in enumerate(zip(*c.survival, strict=True)):
            body.append([c.label, t, *(round(x, 9) for x in row)])
    return csv_text(header, body)
