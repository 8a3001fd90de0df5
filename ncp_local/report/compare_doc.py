"""What `mode=compare` prints and writes, and the comparisons section of `mode=report`: the runs' paired
differences from the first (compare.py) and the paper's figures beside each run (paper.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .compare import Comparisons, compare_runs, comparisons_csv, comparisons_markdown
from .paper import BesidePaper, beside_paper, paper_markdown, rows_for
from .runs import Run


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
) -> CompareDoc:
    cs = compare_runs(runs, horizon, resamples, seed, level) if len(runs) > 1 else None
    beside = [
        beside_paper(run, row, how, level, resamples, seed) for run in runs for row, how in rows_for(run, paper_row)
    ]
    parts = []
    if cs is not None and (cs.compared or cs.refused):
        parts.append(f"{heading} Comparisons\n\n" + comparisons_markdown(cs))
    if beside:
        parts.append(f"{heading} Beside the paper\n\n" + paper_markdown(beside, level))
    return CompareDoc(cs, beside, "\n\n".join(parts))
