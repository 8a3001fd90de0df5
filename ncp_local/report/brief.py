"""The answer first: what `mode=report` and `mode=compare` print, at most BUDGET lines, the rest in the
files they write.

A report answers four questions before any detail: what ran (engine and models, scripted or not), the
headline table, each comparison's verdict, and what ended the stories. Each is a section said in full
while the budget allows, else in the one line that says where it is; the last lines are the files
written, so a reader of a terminal finds them without scrolling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .compare import Comparisons
from .compare_doc import CompareDoc, verdict
from .endings import SUMMARY_HEADER as ENDINGS_HEADER
from .endings import RunEndings, endings_summary_rows, past_data_lines
from .paper import BesidePaper, paper_markdown
from .ran import ran_lines
from .runs import Run
from .tables import Row, markdown_table, summary_lines, summary_table

BUDGET = 40


@dataclass(frozen=True)
class Section:
    title: str
    lines: Sequence[str]
    pointer: str  # the one line said instead when the section does not fit


def fit(sections: Sequence[Section], closing: Sequence[str], budget: int = BUDGET) -> str:
    """The sections in order, each whole while it leaves room for a pointer to each one after it and the
    closing lines, else its pointer; then the closing lines."""
    out: list[str] = []
    for i, s in enumerate(sections):
        later = 2 * (len(sections) - i - 1)  # a pointer and a blank line each
        whole = [s.title, *(line for text in s.lines for line in text.split("\n")), ""]
        out += whole if len(out) + len(whole) + later + len(closing) <= budget else [s.pointer, ""]
    return "\n".join(out + list(closing))


def verdicts(cs: Comparisons | None) -> Section | None:
    """Each comparison's verdict, with what was left out of it, and the runs not compared."""
    if cs is None or not (cs.compared or cs.refused):
        return None
    lines = []
    for c in cs.compared:
        lines += [f"- {verdict(c)}", *(f"  - {n}" for n in c.notes)]
    lines += [f"- {line}" for line in cs.refused]
    return Section(
        "comparisons with the baseline (paired by story; every figure with its test in the files below):",
        lines,
        f"comparisons: {len(cs.compared)} runs with the baseline, each figure's verdict in the files below",
    )


def report_brief(
    runs: Sequence[Run],
    rows: Sequence[Row],
    comparisons: Comparisons | None,
    ends: Sequence[RunEndings],
    notes: Sequence[str],
    closing: Sequence[str],
    paper: Sequence[BesidePaper] = (),
    level: float = 0.95,
) -> str:
    legend, scripted = ran_lines(runs)
    sections = [
        Section(
            "what ran:", [f"- {line}" for line in (*legend, *scripted)], f"what ran: {len(runs)} runs, in the files"
        ),
        Section(
            "results:",
            [summary_table(rows), *summary_lines(rows)],
            "results: the table is too long for a terminal, see the files",
        ),
    ]
    if said := verdicts(comparisons):
        sections.append(said)
    if ends:
        sections.append(
            Section(
                "what ended each story: each ending's share of the plays by the last turn",
                [markdown_table(ENDINGS_HEADER, endings_summary_rows(ends)), *past_data_lines(ends)],
                "what ended each story: in the files",
            )
        )
    if paper:
        sections.append(_paper(paper, level, "results.md"))
    if notes:
        sections.append(Section("notes:", list(notes), f"{len(notes)} notes: at the end of results.md"))
    return fit(sections, closing)


def compare_brief(doc: CompareDoc, level: float, closing: Sequence[str]) -> str:
    """`mode=compare`'s answer: the runs (what ran in each), each comparison's verdict, the paper beside a
    run when asked; the tables and sentences are in compare.md."""
    sections = []
    if doc.comparisons is not None and doc.comparisons.legend:
        lines = [f"- {line}" for line in doc.comparisons.legend]
        sections.append(Section("runs:", lines, f"runs: {len(lines)}, each with what ran, in compare.md"))
    if said := verdicts(doc.comparisons):
        sections.append(said)
    if doc.paper:
        sections.append(_paper(doc.paper, level, "compare.md"))
    return fit(sections, closing)


def _paper(items: Sequence[BesidePaper], level: float, where: str) -> Section:
    """The paper's figures beside a run, or where they are when they do not fit."""
    rows = ", ".join(f"{b.run} beside {b.row.id}" for b in items)
    return Section("beside the paper:", [paper_markdown(items, level)], f"beside the paper ({rows}): in {where}")
