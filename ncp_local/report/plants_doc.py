"""mode=plant's figures as files: Markdown and CSV tables, a plot, and an HTML page that shows each planted
item beside the turn it was planted in, the planted words marked."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from ..protocol.plant import ItemAudit, PlantResult
from ..protocol.turns import shown
from .html_parts import esc, page, prose
from .mpl_home import ready as plots_ready
from .plants import AuditorFigures, PairedComparison, significant
from .tables import csv_text, markdown_table, write

PLANTS_MD, PLANTS_CSV, PAIRED_CSV, PLANTS_HTML = "plants.md", "plants.csv", "plants_paired.csv", "plants.html"
ITEMS_SHOWN = 40  # planted items the HTML page shows beside their originals (the first, in the run's order)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def method_note(level: float, resamples: int) -> str:
    return (
        f"Shares in %, {level:.0%} intervals clustered by story: Jeffreys' interval at the effective number of "
        f"items a bootstrap of stories ({resamples} draws) implies. Recall: planted items of the type on which a "
        "conflict stands after the double-check; type named right: ... a conflict of the planted type; id named "
        "right: ... a conflict of that type citing the planted fact, commitment or `input` itself; false "
        "alarm: clean turns (as played, which the run's own auditor passed) on which a conflict stands. "
        "Differences: auditor minus the first, on the items both judged, paired by item; interval from a "
        "bootstrap of stories (its standard error, widened for few stories) and a two-sided sign-flip "
        "permutation test by story (Holm over auditors, per figure)."
    )


def figures_markdown(figs: Sequence[AuditorFigures], level: float) -> str:
    head = ("figure", *(f.label for f in figs))
    rows = []
    for i, share in enumerate(figs[0].shares):
        cells = [share.figure.label]
        for f in figs:
            s = f.shares[i] if i < len(f.shares) else None
            cells.append(
                "n/a" if s is None or not s.items else f"{_pct(s.value)} [{_pct(s.lo)}, {_pct(s.hi)}] ({s.items})"
            )
        rows.append(cells)
    notes = [f"- {f.label}: {n}" for f in figs for n in f.notes]
    return "\n\n".join(p for p in (markdown_table(head, rows), "\n".join(notes)) if p)


def paired_markdown(cmps: Sequence[PairedComparison], level: float) -> str:
    parts = []
    head = ("figure", "baseline %", "auditor %", "difference", f"{level:.0%} paired", "p", "Holm p", "items")
    for c in cmps:
        rows = [
            [
                d.figure.label,
                _pct(d.base),
                _pct(d.other),
                ("+" if d.diff > 0 else "") + _pct(d.diff),
                f"[{_pct(d.lo)}, {_pct(d.hi)}]",
                _p(d.p) + (" *" if significant(d) else ""),
                _p(d.p_holm),
                str(d.items),
            ]
            for d in c.rows
            if d.items
        ]
        notes = "\n".join(f"- {n}" for n in c.notes)
        parts.append(
            f"### {c.other} vs {c.baseline}\n\n" + markdown_table(head, rows) + (f"\n\n{notes}" if notes else "")
        )
    return "\n\n".join(parts)


def plants_markdown(
    figs: Sequence[AuditorFigures], cmps: Sequence[PairedComparison], level: float, resamples: int, lines: Sequence[str]
) -> str:
    said = "".join(f"- {line}\n" for line in lines)
    doc = f"# Auditors against planted contradictions\n\n{said}\n{method_note(level, resamples)}\n\n"
    doc += figures_markdown(figs, level)
    if cmps:
        doc += "\n\n## Paired differences\n\n" + paired_markdown(cmps, level)
    return doc + "\n"


def plants_csv(figs: Sequence[AuditorFigures]) -> str:
    head = ("auditor", "path", "plants", "figure", "hits", "items", "stories", "value", "lo", "hi")
    rows = [
        [f.label, f.path, f.plants, s.figure.key, s.hits, s.items, s.stories, *(_r(x) for x in (s.value, s.lo, s.hi))]
        for f in figs
        for s in f.shares
    ]
    return csv_text(head, rows)


def paired_csv(cmps: Sequence[PairedComparison]) -> str:
    head = ("baseline", "auditor", "figure", "baseline_value", "value", "difference", "lo", "hi", "p", "p_holm")
    rows = [
        [c.baseline, c.other, d.figure.key, *(_r(x) for x in (d.base, d.other, d.diff, d.lo, d.hi, d.p, d.p_holm))]
        for c in cmps
        for d in c.rows
    ]
    return csv_text(head, rows)


def _r(x: float) -> object:
    return "" if math.isnan(x) else round(x, 6)


# ---- HTML -------------------------------------------------------------------------------------------


def marked(a: ItemAudit) -> str:
    """The judged narration, the planted words in <mark>."""
    it = a.item
    text = it.response
    if not it.planted:
        return esc(text)
    start = it.at + (len(it.inserted) - len(it.inserted.lstrip()))
    end = start + len(it.sentence)
    return f"{esc(text[:start])}<mark class=planted>{esc(text[start:end])}</mark>{esc(text[end:])}"


def _verdict(a: ItemAudit) -> str:
    if not a.judged:
        return f"not judged ({esc(a.audit.error)})"
    if not a.audit.conflicts:
        return "no conflict"
    return ", ".join(f"{esc(c.type)} {esc(c.id)}" for c in a.audit.conflicts)


def item_rows(results: Sequence[PlantResult], limit: int = ITEMS_SHOWN) -> list[str]:
    """A row per planted item: where, its type and target, the original, the planted text, the verdict."""
    rows: list[str] = []
    for r in results:
        for a in r.items:
            if not a.item.planted or len(rows) >= limit:
                continue
            it = a.item
            rows.append(
                f"<tr><td>{esc(r.episode)}<br>turn {shown(it.turn)}</td><td>{esc(it.kind)}<br>"
                f"<code>{esc(it.target)}</code></td><td class=original>{esc(it.original)}</td>"
                f"<td class=planted>{marked(a)}</td><td>{_verdict(a)}</td></tr>"
            )
    return rows


def plants_html(
    figs_md: str, results: Sequence[PlantResult], svg: str, lines: Sequence[str], figs: Sequence[AuditorFigures]
) -> str:
    said = "".join(f"<li>{prose(line)}</li>" for line in lines)
    table_rows = []
    for i, share in enumerate(figs[0].shares):
        cells = "".join(
            f"<td>{_pct(f.shares[i].value)} [{_pct(f.shares[i].lo)}, {_pct(f.shares[i].hi)}] "
            f"<small>({f.shares[i].items})</small></td>"
            for f in figs
        )
        table_rows.append(f"<tr><th>{esc(share.figure.label)}</th>{cells}</tr>")
    head = "".join(f"<th>{esc(f.label)}</th>" for f in figs)
    body = (
        f"<h1>Auditors against planted contradictions</h1><ul>{said}</ul>"
        f"<table class=plants><tr><th>figure</th>{head}</tr>{''.join(table_rows)}</table>{svg}"
        "<h2>Planted items beside the turn as played</h2>"
        f"<p>{prose(f'The first {ITEMS_SHOWN} planted items of the first auditor, the planted words marked.')}</p>"
        "<table class=items><tr><th>episode</th><th>planted</th><th>original</th><th>with the plant</th>"
        f"<th>verdict</th></tr>{''.join(item_rows(results))}</table>"
    )
    style = "mark.planted{background:#ffe08a;padding:0 2px}td.original,td.planted{max-width:32em;vertical-align:top}"
    return page("Planted contradictions", f"<style>{style}</style>{body}")


def write_plant_report(
    out: Path,
    figs: Sequence[AuditorFigures],
    cmps: Sequence[PairedComparison],
    first_results: Sequence[PlantResult],
    level: float,
    resamples: int,
    lines: Sequence[str] = (),
    html: bool = True,
) -> tuple[str, list[Path]]:
    """Write plants.md/.csv, plants_paired.csv (two auditors or more), the plot and plants.html."""
    md = plants_markdown(figs, cmps, level, resamples, lines)
    files = [write(out / PLANTS_MD, md), write(out / PLANTS_CSV, plants_csv(figs))]
    if cmps:
        files.append(write(out / PAIRED_CSV, paired_csv(cmps)))
    svg = ""
    no_plots = plots_ready(out)
    if no_plots:
        print(f"warning: {out}: plot skipped ({no_plots})", file=sys.stderr)
    else:
        from .plots import inline_svg, write_plants_plot  # after plots_ready(): matplotlib writes its config

        png, svg_path = write_plants_plot(figs, out)
        files += [png, svg_path]
        svg = inline_svg(svg_path)
    if html:
        files.append(write(out / PLANTS_HTML, plants_html(md, first_results, svg, lines, figs)))
    return md, files
