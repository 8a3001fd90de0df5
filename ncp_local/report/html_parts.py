"""The HTML report's shared parts: escaping, the page frame with its stylesheet, links, badges, tables."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from ..protocol import turns
from ..protocol.metrics import EpisodeMetrics
from ..protocol.stages import CONFLICT_TYPES, INTERNAL_ID
from .assets import asset
from .glossary import define, define_ending, plain
from .labels import shortened
from .runs import Run
from .tables import MIN_FOR_INTERVAL


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def prose(text: str) -> str:
    """The rig's own prose (a note, a definition) as HTML: escaped, its Markdown code spans (`x`) as
    <code>; a backtick without its pair stays as it is. Never for model or spec text (that is `esc`)."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [esc(text[at : m.start()]), f"<code>{esc(m.group(1))}</code>"]
        at = m.end()
    return "".join(out) + esc(text[at:])


def label_text(label: str) -> str:
    """A run's label where space is short: shortened (labels.shortened), the full label on hover."""
    short = shortened(label)
    shown = breakable(short)
    if short == label:
        return shown
    return f'<span class=label title="{esc(label)}">{shown}</span>'


def breakable(text: str) -> str:
    """Escaped text that a narrow column breaks after `_` or `=` first (`player_input`, `seed=1`)."""
    return re.sub(r"([_=])", r"\1<wbr>", esc(text))


def page(title: str, body: str, script: str = "") -> str:
    js = f"<script>{script}</script>" if script else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{asset('report.css')}</style></head>\n"
        f"<body><main>\n{body}\n</main>{js}</body></html>\n"
    )


def run_key(i: int, run: Run) -> str:
    return f"{i:02d}-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", run.key).strip("._") or "run")


def episode_href(key: str, spec_id: str) -> str:
    return f"episodes/{quote(key)}/{quote(spec_id)}.html"


def header_cell(column: str, cls: str = "", text: str | None = None) -> str:
    """A column header with its glossary definition as the tooltip (report/glossary.py)."""
    klass = f" class={cls}" if cls else ""
    return f'<th{klass} title="{esc(plain(define(column)))}">{esc(text or column)}</th>'


def with_interval(iv: Any, d: int, scored: int) -> str:
    """A cell's value, and its interval below it when there are 2 or more scored episodes."""
    if scored < MIN_FOR_INTERVAL or iv.lo != iv.lo:
        return f"{iv.point:.{d}f}"
    return f"{iv.point:.{d}f}<div class='muted small iv'>[{iv.lo:.{d}f}, {iv.hi:.{d}f}]</div>"


_INTERVAL = re.compile(r"\[[^\]\[]*\]")


def number_cell(value: Any) -> str:
    """A count table's number, escaped; an interval in it (`[9.3, 18.0]`) kept on one line (class iv)."""
    text = esc(value)
    return _INTERVAL.sub(lambda m: f"<span class=iv>{m.group(0)}</span>", text)


def badge(text: str, cls: str = "") -> str:
    return f'<span class="badge {esc(cls)}">{esc(text)}</span>'


def conflict_badges(m: EpisodeMetrics) -> str:
    return "".join(badge(t, t) for t in CONFLICT_TYPES if getattr(m, t))


def turns_cell(m: EpisodeMetrics) -> str:
    """Turns; a censored episode's count is a lower bound (`n+`)."""
    if m.censored:
        return (
            f'<td class=num data-v="{m.turns}" title="censored: the window filled during '
            f'{turns.label(m.turns)}">'
            f"{m.turns}+</td>"
        )
    return f"<td class=num>{m.turns}</td>"


def target_tag(ctype: str, target_id: str) -> str:
    """What names a conflict's target: its fact or commitment id, or a label where it has none."""
    if ctype == "fact" and target_id == INTERNAL_ID:
        return badge("internal contradiction", "internal")
    if ctype == "player_input":
        return ""  # the target is the player input itself, shown in full
    return f"<span class=fid>{esc(target_id)}</span>"


def count_table(
    cls: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    tips: bool = True,
    define: Callable[[str], str] = define_ending,
) -> str:
    """An index page's table of counts: each row is its cells, the first naming the row and the rest
    numbers (escaped here); the headers get their glossary text (`define`: the endings table's by
    default) as tooltips unless `tips` is off, and the table scrolls in its frame."""

    def th(i: int, h: str) -> str:
        tip = f' title="{esc(plain(define(h)))}"' if tips and h else ""
        return f"<th{'' if i == 0 else ' class=num'}{tip}>{breakable(h)}</th>"

    head = "<tr>" + "".join(th(i, h) for i, h in enumerate(header)) + "</tr>"
    # The first cell names the row (a run's label, an ending): shortened, in full on hover.
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{label_text(str(c))}</td>" if i == 0 else f"<td class=num>{number_cell(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<div class=scroll><table class='counts {cls}'><thead>{head}</thead><tbody>{body}</tbody></table></div>"


def rendered_table(cls: str, header: Sequence[str], rows: Sequence[str]) -> str:
    """An episode page's table: plain headers over rows already rendered (their cells link and mark up)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    return f"<table class={cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
