"""What `mode=compare` prints and writes, and the comparisons section of `mode=report`: the runs' paired
differences from the first (compare.py) in sentences, tables and CSV, and the paper's figures beside each
run (paper.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .compare import Comparison, Comparisons, compare_runs
from .paired import ALPHA, Z_POWER, Z_TEST, Difference
from .paper import BesidePaper, beside_paper, paper_markdown, rows_for
from .runs import Run
from .tables import csv_text, markdown_table


@dataclass(frozen=True)
class CompareDoc:
    comparisons: Comparisons | None  # None for one run
    paper: list[BesidePaper]
    text: str  # the Markdown of both parts (no top heading)

    @property
    def csv(self) -> str | None:
        return comparisons_csv(self.comparisons) if self.comparisons and self.comparisons.compared else None


def compare_document(
    runs: Sequence[Run],
    paper_row: str | None,
    horizon: int | None,
    resamples: int,
    seed: int,
    level: float,
    heading: str = "##",
    listed: bool = False,
) -> CompareDoc:
    """Both parts' Markdown; `listed`: the runs are already listed above it (a report's first lines), so
    the comparisons do not list them again."""
    cs = compare_runs(runs, horizon, resamples, seed, level) if len(runs) > 1 else None
    beside = [
        beside_paper(run, row, how, level, resamples, seed) for run in runs for row, how in rows_for(run, paper_row)
    ]
    parts = []
    if cs is not None and (cs.compared or cs.refused):
        parts.append(f"{heading} Comparisons\n\n" + comparisons_markdown(cs, listed))
    if beside:
        parts.append(f"{heading} Beside the paper\n\n" + paper_markdown(beside, level))
    return CompareDoc(cs, beside, "\n\n".join(parts))


# ---- text ---------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _f(x: float, d: int = 2) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{round(x, d) + 0.0:.{d}f}"


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _change(d: Difference) -> str:
    """A difference in words, one wording for one value: `2.06 turns lower`, or, where the table shows
    0.00, `equal to two decimals`."""
    if not round(d.diff, 2):
        return "equal to two decimals"
    return f"{abs(d.diff):.2f} {d.figure.unit} {'higher' if d.diff > 0 else 'lower'}"


def _signed(x: float) -> str:
    """A difference as the tables show it: `+2.00`, `-0.35`, and `0.00` for what rounds to zero."""
    return ("+" if round(x, 2) > 0 else "") + _f(x)


def sentence(c: Comparison, d: Difference, level: float) -> str:
    """One plain sentence: what the difference is, how sure, and what this design could have found."""
    f = d.figure
    if math.isnan(d.diff):
        return f"{f.label}: not estimable on these plays."
    head = (
        f"{f.label}: {c.other} is {_change(d)} than {c.baseline}"
        if round(d.diff, 2)
        else f"{f.label}: {c.other} and {c.baseline} are {_change(d)}"
    )
    if d.withheld:
        return f"{head}: {d.withheld}."
    p, which = _tested(d)
    iv = f"{level:.0%} paired interval {_f(d.lo)} to {_f(d.hi)}, {which} = {_p(p)}"
    if p < ALPHA:
        return f"{head} ({iv}): a difference at the 5% level."
    if math.isinf(d.mdd):
        return f"{head} ({iv}): no difference shown; {c.stories} stories are too few for any to show at 5%."
    if d.mdd == 0:
        return f"{head} ({iv}): no difference shown; the resampled stories never move this figure."
    return (
        f"{head} ({iv}): no difference shown; on {c.stories} stories this design finds one of "
        f"{_f(d.mdd)} {f.unit} 80% of the time."
    )


def _tested(d: Difference) -> tuple[float, str]:
    """The p-value a verdict rests on: Holm's where there are several runs, and its name."""
    return (d.p, "p") if math.isnan(d.p_holm) else (d.p_holm, "Holm p")


SHOWN = 3  # differences a verdict line names; the rest are counted


def verdict(c: Comparison) -> str:
    """A comparison in one line: the figures that differ at the 5% level (the largest first), how many do
    not, and how many got no verdict and why (the sentences and tables hold the rest)."""
    judged = [d for d in c.rows if not d.withheld and not math.isnan(d.diff)]
    found = sorted((d for d in judged if _tested(d)[0] < ALPHA), key=lambda d: _tested(d)[0])
    head = f"{comparison_title(c)}, {c.stories} stories: "
    if found:
        named = [f"{d.figure.label} {_change(d)} ({_tested(d)[1]} = {_p(_tested(d)[0])})" for d in found[:SHOWN]]
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        said = f"a difference at the 5% level in {len(found)} of {len(judged)} figures: {', '.join(named)}{more}"
    else:
        said = f"no difference shown in any of {len(judged)} figures"
    withheld = [d for d in c.rows if d.withheld]
    if withheld:
        said += f"; no verdict on {len(withheld)} as-played figures: {c.censoring}"
    return head + said


HEADER = (
    "figure",
    "baseline",
    "run",
    "difference",
    "paired [lo, hi]",
    "unpaired [lo, hi]",
    "p",
    "Holm p",
    "MDD 80%",
)


def comparison_title(c: Comparison) -> str:
    return f"{c.other} vs the baseline" if c.baseline == "baseline" else f"{c.other} vs {c.baseline} (baseline)"


def comparison_rows(c: Comparison) -> list[list[str]]:
    """The table's cells (HEADER's columns), one row per figure, as Markdown and HTML show them."""
    return [
        [
            d.figure.label,
            _f(d.base),
            _f(d.other),
            _signed(d.diff),
            f"[{_f(d.lo)}, {_f(d.hi)}]",
            f"[{_f(d.unpaired_lo)}, {_f(d.unpaired_hi)}]",
            "no verdict" if d.withheld else _p(d.p),
            "no verdict" if d.withheld else _p(d.p_holm),
            _f(d.mdd),
        ]
        for d in c.rows
    ]


def window_line(c: Comparison) -> str:
    """Each run's share of plays its window stopped, said before any figure."""
    return f"stopped by the window: {c.baseline} {_pct(c.window[0])}, {c.other} {_pct(c.window[1])}"


def comparison_markdown(c: Comparison, level: float) -> str:
    title = (
        f"### {comparison_title(c)}\n\n{c.stories} shared stories, {c.plays[0]} and {c.plays[1]} "
        f"scored plays; restricted mean and incidence to t={c.horizon}; {window_line(c)}"
    )
    body = comparison_rows(c)
    notes = [f"- {n}" for n in c.notes]
    said = [f"- {sentence(c, d, level)}" for d in c.rows]
    return "\n\n".join(p for p in (title, "\n".join(notes), markdown_table(HEADER, body), "\n".join(said)) if p)


# How the MDD is made (report/paired.py's Z_TEST and Z_POWER), as the note and the reports guide say it.
MDD_RULE = f"{Z_TEST:.2f} permutation spreads + {Z_POWER:.2f} paired standard errors"


def comparisons_note(cs: Comparisons) -> str:
    return (
        f"Differences are run minus baseline over the stories both played. Paired: {cs.level:.0%} percentile "
        f"bootstrap ({cs.resamples} draws) of stories, a drawn story bringing its plays in both runs; unpaired: "
        "each run's stories drawn on their own. p: two-sided paired sign-flip permutation test by story "
        "(each story's two sets of plays swapped with chance 1/2); Holm p: adjusted over the runs compared "
        "with the baseline, per figure. MDD 80%: the difference this design finds 80% of the time with this "
        f"test at two-sided 5% ({MDD_RULE}). S(t) % and the "
        "endings' % are Kaplan-Meier and "
        "Aalen-Johansen estimates, in points."
    )


def comparisons_markdown(cs: Comparisons, listed: bool = False) -> str:
    parts = ["Runs:\n\n" + "\n".join(f"- {line}" for line in cs.legend)] if cs.legend and not listed else []
    parts += [comparisons_note(cs)]
    parts += [f"- {line}" for line in cs.refused]
    parts += [comparison_markdown(c, cs.level) for c in cs.compared]
    return "\n\n".join(parts)


CSV_HEADER = (
    "baseline",
    "run",
    "stories",
    "horizon",
    "figure",
    "baseline_value",
    "run_value",
    "difference",
    "paired_lo",
    "paired_hi",
    "unpaired_lo",
    "unpaired_hi",
    "p",
    "p_holm",
    "mdd_80",
    "no_verdict",
)


def _r(x: float) -> Any:
    return "" if math.isnan(x) else round(x, 6)


def comparisons_csv(cs: Comparisons) -> str:
    body = [
        [
            c.baseline,
            c.other,
            c.stories,
            c.horizon,
            d.figure.key,
            *map(_r, (d.base, d.other, d.diff, d.lo, d.hi, d.unpaired_lo, d.unpaired_hi, d.p, d.p_holm, d.mdd)),
            d.withheld,
        ]
        for c in cs.compared
        for d in c.rows
    ]
    return csv_text(CSV_HEADER, body)
