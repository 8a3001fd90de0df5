"""A self-contained HTML report: an index of episodes and one page per episode.

No network: CSS, the small sorting/filtering script and the survival SVG are
inline. Every piece of model or spec text goes through `esc`; nothing from a
run is ever placed in markup unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..rundir.atomic import atomic_write
from .compare import Comparisons
from .cost import CostTable
from .endings import RunEndings
from .failure_modes import RunModes
from .html_episode import episode_page
from .html_index import index_page
from .html_parts import run_key
from .precision import AuditorError
from .runs import Run
from .tables import Row
from .trials import RunTrials


def write_html(
    runs: Sequence[Run],
    rows: Sequence[Row],
    out: Path,
    svg: str,
    level: float,
    costs: Sequence[CostTable] = (),
    endings: tuple[Sequence[RunEndings], str] | None = None,
    auditor: AuditorError | None = None,
    modes: Sequence[RunModes] = (),
    trials: tuple[Sequence[RunTrials], str] | None = None,
    comparisons: Comparisons | None = None,
) -> Path:
    for i, run in enumerate(runs):
        key = run_key(i, run)
        for sid, result in run.results.items():
            atomic_write(out / "episodes" / key / f"{sid}.html", episode_page(run, result, "../../index.html"))
    index = out / "index.html"
    atomic_write(index, index_page(runs, rows, svg, level, costs, endings, auditor, modes, trials, comparisons))
    return index
