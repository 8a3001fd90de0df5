"""The survival curve S(t) of every compared run on one axis (PNG and SVG).

Built on matplotlib's object API with the Agg canvas: no pyplot, no global
backend switch, no display needed on a cluster node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .runs import Run


def survival_figure(runs: Sequence[Run]) -> Figure:
    fig = Figure(figsize=(8.0, 4.8), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    horizon = 0
    for run in runs:
        s = run.aggregate().survival
        horizon = max(horizon, len(s) - 1)
        ax.step(range(len(s)), [100 * v for v in s], where="post", linewidth=1.8,
                label=f"{run.label} (n={run.aggregate().scored})")
    ax.set_xlim(0, max(horizon, 1))
    ax.set_ylim(0, 102)
    ax.set_xlabel("turn t")
    ax.set_ylabel("episodes with turns ≥ t (%)")
    ax.set_title("Survival S(t)")
    ax.grid(True, alpha=0.3)
    if runs:
        # Below the axes: labels are long (models / condition / method) and
        # would hide the curves inside the plot.
        fig.legend(loc="outside lower center", fontsize=8, frameon=False)
    return fig


def write_survival(runs: Sequence[Run], out: Path) -> tuple[Path, Path]:
    fig = survival_figure(runs)
    png, svg = out / "survival.png", out / "survival.svg"
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")
    # No date and a fixed id salt: the same runs give the same SVG bytes.
    with rc_context({"svg.hashsalt": "ncp-local"}):
        fig.savefig(svg, format="svg", metadata={"Date": None})
    return png, svg


def inline_svg(svg_path: Path) -> str:
    """The SVG element alone, to embed in an HTML page."""
    text = svg_path.read_text(encoding="utf-8")
    start = text.find("<svg")
    if start < 0:
        return ""
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text[start:], count=1, flags=re.S)
