"""The survival curve S(t) of every compared run on one axis (PNG and SVG):
the Kaplan-Meier estimate with its confidence band, censored episodes marked;
and beside it, per run, what ended the stories: each ending's cumulative
incidence stacked under S(t) (report/endings.py).

Built on matplotlib's object API with the Agg canvas: no pyplot, no global
backend switch, no display needed on a cluster node.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..protocol.metrics import ENDINGS
from .endings import Incidence
from .plants import AuditorFigures
from .runs import Run
from .tables import censored_at, known_to
from .trials import RunTrials

# Curves of a sweep often coincide (same seed, near temperatures): a line style and a marker per
# run keep each visible under the others, as well as its colour.
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def survival_figure(
    runs: Sequence[Run], level: float = 0.95, corrected: Mapping[str, Sequence[float]] | None = None
) -> Figure:
    """Kaplan-Meier S(t) per run, its band shaded, `+` where censored episodes leave the count; a thin
    dashed line of the same colour where a review sheet corrected a run's S(t) (report/precision.py)."""
    fig = Figure(figsize=(8.0, 4.8), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    horizon = 0
    any_censored = False
    any_in_flight = False
    drawn: dict[tuple[tuple[float, ...], ...], str] = {}  # a curve with its band -> the first run drawing it
    for i, run in enumerate(runs):
        agg = run.aggregate(level)
        # Past the data (tables.known_to) the curve is not drawn: nobody was followed that far.
        s = agg.survival[: known_to(run) + 1]
        # Identical curves lie exactly on each other: the legend says which one a hidden curve repeats.
        same = drawn.setdefault((tuple(s), tuple(agg.survival_lo), tuple(agg.survival_hi)), run.label)
        horizon = max(horizon, len(agg.survival) - 1)
        # The last level drawn for half a turn: a drop at the last turn is a visible step, not the frame.
        ts = [*range(len(s)), len(s) - 0.5] if len(s) else []

        def held(values: Sequence[float]) -> list[float]:
            return [100 * v for v in values] + ([100 * values[-1]] if len(values) else [])

        label = (
            f"{run.label} (n={agg.scored}"
            + (f", {agg.censored} context_limit" if agg.censored else "")
            + (f", +{agg.in_flight} in flight" if agg.in_flight else "")
            + ")"
        )
        if same != run.label:
            label += f": identical to {same}"
        (line,) = ax.step(
            ts,
            held(s),
            where="post",
            linewidth=1.8,
            label=label,
            linestyle=STYLES[i % len(STYLES)],
            marker=MARKERS[i % len(MARKERS)],
            markersize=4,
            markevery=list(range(0, len(s), max(1, len(s) // 12))),
            alpha=0.9,
        )
        ax.fill_between(
            ts,
            held(agg.survival_lo[: len(s)]),
            held(agg.survival_hi[: len(s)]),
            step="post",
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )
        if corrected and run.label in corrected:
            fixed = list(corrected[run.label])
            ax.step(
                [*range(len(fixed)), len(fixed) - 0.5],
                held(fixed),
                where="post",
                linewidth=1.0,
                linestyle=(0, (4, 2)),
                color=line.get_color(),
                label=f"{run.label}: corrected for the auditor",
            )
        # `+` where a censored episode leaves the count: by the window, or still in flight.
        marks = sorted(t for t in {*censored_at(run), *censored_at(run, in_flight=True)} if t < len(s))
        any_in_flight = any_in_flight or bool(agg.in_flight)
        if marks:
            any_censored = True
            ax.plot(
                marks,
                [100 * s[t] for t in marks],
                linestyle="none",
                marker="+",
                markersize=9,
                markeredgewidth=1.6,
                color=line.get_color(),
            )
    # Half a turn beyond the last one: a drop at the last turn would sit on the frame otherwise.
    ax.set_xlim(-0.25, max(horizon, 1) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # turns are whole numbers
    ax.set_ylim(0, 102)
    # t counts player turns as the paper does (protocol/turns.py): an episode ended by a conflict at
    # turn 3 played 3 turns, so it is in S(3) and leaves the curve after t = 3.
    ax.set_xlabel("t: player turns played")
    ax.set_ylabel("episodes that played t turns or more (%)")
    marked = " (+: context_limit or in flight)" if any_in_flight else " (+: context_limit)"
    ax.set_title(f"Survival S(t), Kaplan-Meier with {level:.0%} band" + (marked if any_censored else ""))
    ax.grid(True, alpha=0.3)
    if runs:
        # Below the axes: labels are long (models / condition / method) and
        # would hide the curves inside the plot.
        fig.legend(loc="outside lower center", fontsize=8, frameon=False)
    return fig


def _save(fig: Figure, out: Path, stem: str) -> tuple[Path, Path]:
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")
    # No date and a fixed id salt: the same runs give the same SVG bytes.
    with rc_context({"svg.hashsalt": "ncp-local"}):
        fig.savefig(svg, format="svg", metadata={"Date": None})
    return png, svg


def write_survival(
    runs: Sequence[Run], out: Path, level: float = 0.95, corrected: Mapping[str, Sequence[float]] | None = None
) -> tuple[Path, Path]:
    return _save(survival_figure(runs, level, corrected), out, "survival")


# One colour per ending, S(t) in grey on top: the same ending has the same colour in every panel.
ENDING_COLOURS = dict(zip(ENDINGS, ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#2ca02c"), strict=True))
SURVIVING_COLOUR = "#c7c7c7"
PANEL_COLUMNS = 3


# A panel's title wraps at this many characters (9 pt in a 4.2 inch panel): a run's label is often
# longer than its panel, and titles side by side would run into each other.
TITLE_CHARS = 52


def _panel_title(text: str) -> str:
    return textwrap.fill(text, TITLE_CHARS, break_long_words=False, break_on_hyphens=False)


def _panel_grid(n: int, extra_height: float) -> tuple[Figure, Any]:
    """A figure of `n` panels, up to PANEL_COLUMNS a row, sharing their y axis (the unused ones hidden)."""
    cols = max(1, min(PANEL_COLUMNS, n))
    rows = max(1, math.ceil(n / cols))
    # At least the survival plot's width: titles and legends need it.
    fig = Figure(figsize=(max(8.0, 4.2 * cols), 3.6 * rows + extra_height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def endings_figure(panels: Sequence[tuple[str, Incidence, Sequence[float]]]) -> Figure:
    """Per run (label, incidence, S(t)): the endings' F_k(t) stacked from the bottom, S(t) filling the rest,
    one step past the last turn (where the last turn's endings show)."""
    fig, axes = _panel_grid(len(panels), 1.0)
    for ax, (label, inc, s) in zip(axes.flat, panels, strict=False):
        # t = max_turns + 1 holds the last turn's endings; the grey rest there is what the limit stopped.
        ts = [*range(inc.max_turns + 2), inc.max_turns + 1.5]
        base = [0.0] * len(ts)
        layers = [(e, inc.curves[e], ENDING_COLOURS[e]) for e in ENDINGS]
        layers.append(("still going: S(t)", (*s, inc.still_going), SURVIVING_COLOUR))
        for name, curve, colour in layers:
            top = [b + 100 * v for b, v in zip(base, [*curve, curve[-1]], strict=True)]
            ax.fill_between(ts, base, top, step="post", color=colour, linewidth=0, label=name)
            base = top
        ax.set_xlim(0, inc.max_turns + 1.5)
        ax.set_ylim(0, 100)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(_panel_title(f"{label} (n={inc.episodes} plays)"), fontsize=9)
        ax.set_xlabel("t: player turns played")
    for ax in axes[:, 0]:
        # n counts plays (a story played k times is k of them): the shares are of plays.
        ax.set_ylabel("plays (%)")
    if panels:
        handles, names = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    fig.suptitle("What ended each story: cumulative incidence by ending, S(t) on top", fontsize=10)
    return fig


def write_endings(panels: Sequence[tuple[str, Incidence, Sequence[float]]], out: Path) -> tuple[Path, Path]:
    return _save(endings_figure(panels), out, "endings")


def passk_figure(rts: Sequence[RunTrials]) -> Figure:
    """Per run, pass^k(t) for every k (one curve each, darker as k grows) and S(t) dashed: the gap
    between pass^1 and pass^k is how much of survival is luck of the draw (report/trials.py)."""
    fig, axes = _panel_grid(len(rts), 0.8)
    for ax, rt in zip(axes.flat, rts, strict=False):
        # The last level held for half a turn, as on the survival plot: the step at t = max_turns shows.
        ts = [*range(rt.max_turns + 1), rt.max_turns + 0.5]

        def held(curve: Sequence[float]) -> list[float]:
            return [100 * v for v in curve] + [100 * curve[-1]]

        for i, (k, curve) in enumerate(rt.curves.items()):
            shade = 0.15 + 0.75 * i / max(1, len(rt.curves) - 1)
            ax.step(
                ts,
                held(curve),
                where="post",
                color=(0.1, 0.3 * (1 - shade) + 0.1, shade),
                linewidth=1.6,
                marker=MARKERS[i % len(MARKERS)],
                markersize=3,
                markevery=list(range(rt.max_turns + 1)),
                label=f"pass^{k}",
            )
        # On top, dashed: where pass^1 and S(t) agree (same plays per story, none censored) both show.
        ax.step(
            ts,
            held(rt.survival),
            where="post",
            color="black",
            linestyle="--",
            linewidth=0.9,
            zorder=3,
            label="S(t)",
        )
        ax.set_xlim(0, rt.max_turns + 0.5)
        ax.set_ylim(0, 100)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(_panel_title(f"{rt.label} ({rt.trials} trials x {len(rt.stories)} stories)"), fontsize=9)
        ax.set_xlabel("t: player turns played")
        ax.legend(fontsize=8, frameon=False)
    for ax in axes[:, 0]:
        # pass^k is a share of stories (all k of a story's plays survive); S(t) a share of plays.
        ax.set_ylabel("stories (pass^k) / plays (S(t)) (%)")
    fig.suptitle("pass^k(t): all k plays of a story survive t turns", fontsize=10)
    return fig


def write_passk(rts: Sequence[RunTrials], out: Path) -> tuple[Path, Path]:
    return _save(passk_figure(rts), out, "passk")


def inline_svg(svg_path: Path) -> str:
    """The SVG element alone, to embed in an HTML page."""
    text = svg_path.read_text(encoding="utf-8")
    start = text.find("<svg")
    if start < 0:
        return ""
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text[start:], count=1, flags=re.S)


# mode=plant's plot: each auditor's recall per type and false-alarm rate (any type), with their intervals.
def plants_figure(figs: Sequence[AuditorFigures]) -> Figure:
    keys = [s.figure for s in figs[0].shares if s.figure.key.startswith("recall:") or s.figure.key == "false_alarm"]
    fig = Figure(figsize=(7.0, 3.6), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(figs))
    for i, f in enumerate(figs):
        by_key = {s.figure.key: s for s in f.shares}
        shown = [by_key[k.key] for k in keys if k.key in by_key]
        x = [j + (i - (len(figs) - 1) / 2) * width for j, k in enumerate(keys) if k.key in by_key]
        vals = [100 * s.value for s in shown]
        errs = [[100 * (s.value - s.lo) for s in shown], [100 * (s.hi - s.value) for s in shown]]
        ax.bar(x, vals, width, yerr=errs, capsize=3, label=f.label)
    ax.set_xticks(range(len(keys)), [k.label for k in keys], fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of items")
    fig.legend(loc="outside lower center", fontsize=7, frameon=False)  # below: labels are long
    return fig


def write_plants_plot(figs: Sequence[AuditorFigures], out: Path) -> tuple[Path, Path]:
    return _save(plants_figure(figs), out, "plants")
