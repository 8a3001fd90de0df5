"""mode=plant's plot: each auditor's recall per type and false-alarm rate, with their intervals (PNG and SVG).
Imported only once matplotlib can write its config folder (report/mpl_home.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .plants import AuditorFigures
from .plots import _save

SHOWN = ("recall:", "false_alarm")  # the figures plotted: recall per type, and the false alarm of any type


def plants_figure(figs: Sequence[AuditorFigures]) -> Figure:
    keys = [s.figure for s in figs[0].shares if s.figure.key.startswith(SHOWN[0]) or s.figure.key == SHOWN[1]]
    fig = Figure(figsize=(7.0, 3.6), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(keys))
    width = 0.8 / max(1, len(figs))
    for i, f in enumerate(figs):
        by_key = {s.figure.key: s for s in f.shares}
        vals = np.asarray([100 * by_key[k.key].value if k.key in by_key else np.nan for k in keys])
        lo = np.asarray([100 * by_key[k.key].lo if k.key in by_key else np.nan for k in keys])
        hi = np.asarray([100 * by_key[k.key].hi if k.key in by_key else np.nan for k in keys])
        ax.bar(
            x + (i - (len(figs) - 1) / 2) * width, vals, width, yerr=[vals - lo, hi - vals], capsize=3, label=f.label
        )
    ax.set_xticks(x, [k.label for k in keys], fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of items")
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    return fig


def write_plants_plot(figs: Sequence[AuditorFigures], out: Path) -> tuple[Path, Path]:
    return _save(plants_figure(figs), out, "plants")
