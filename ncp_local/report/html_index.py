"""The report's index page: the results table, survival, endings, failure modes, the auditor's error,
trials, cost, and each run's episodes."""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol.metrics import episode_metrics
from ..protocol.records import EpisodeResult
from ..protocol.stages import CONFLICT_TYPES
from . import compare_doc, failure_modes, precision
from .assets import asset
from .compare import Comparisons
from .cost import PER_TURN_NOTE, CostTable, headers, rows_of, table_note
from .cost import cells as cost_cells
from .endings import ENDINGS_NOTE, RunEndings, endings_summary_rows, past_data_lines
from .endings import SUMMARY_HEADER as ENDINGS_SUMMARY_HEADER
from .failure_modes import RunModes
from .glossary import define, define_cost, define_trials, plain
from .html_parts import (
    badge,
    conflict_badges,
    count_table,
    episode_href,
    esc,
    header_cell,
    label_text,
    page,
    prose,
    run_key,
    turns_cell,
    with_interval,
)
from .precision import UNCORRECTED_NOTE, AuditorError
from .ran import ran_lines
from .runs import Run
from .tables import METRICS, PAST_DATA, TERMINATIONS, Row
from .trials import RunTrials
from .trials_doc import noise_note, noise_table, passk_table, trials_notes


def _overturned(result: EpisodeResult) -> int:
    return sum(bool(t.conflict_check.conflicts) and not t.conflicts for t in result.turns)


# ---- index -------------------------------------------------------------------


def _ran_html(runs: Sequence[Run]) -> str:
    """What ran (report/ran.py): each run's engine and models, then the scripted lines, highlighted."""
    per_run, rest = ran_lines(runs)
    return (
        "<ul class='ran small'>"
        + "".join(f"<li>{prose(line)}</li>" for line in per_run)
        + "</ul>"
        + "".join(f"<div class=scripted>{prose(line)}</div>" for line in rest)
    )


def _summary_html(rows: Sequence[Row]) -> str:
    head = (
        "<tr><th>run</th>"
        + header_cell("episodes", "num")
        + "".join(header_cell(h, "num") for _, h, _ in METRICS)
        + header_cell("conflict-free plays", "num")
        + "<th>terminations</th>"
        + header_cell("bound hits", "num")
        + "</tr>"
    )
    body = []
    for r in rows:
        # Episodes the window stopped are in the averages at their committed turns: say how many.
        censored = (
            f"<div class='muted small censored' title=\"{esc(plain(define('context_limit')))}\">"
            f"{r.agg.censored} context_limit</div>"
            if r.agg.censored
            else ""
        )
        cells = [
            f"<td>{label_text(r.label)}<div class='muted small path' title=\"{esc(r.path)}\">{esc(r.path)}</div>"
            f"<div class='small ran' title=\"{esc(plain(define('engine')))}\">engine: {esc(r.ran.short)}</div></td>",
            f"<td class=num>{r.agg.episodes}{censored}</td>",
        ]
        for k, _, d in METRICS:
            iv = r.ci[k]
            if iv.point != iv.point:  # NaN: no scored episode
                cells.append("<td class=num>n/a</td>")
            else:
                cells.append(f"<td class=num>{with_interval(iv, d, r.agg.scored)}</td>")
        cells.append(f"<td class=num>{with_interval(r.ci['conflict_free'], 0, r.agg.scored)}</td>")
        cells.append(
            "<td class='small terms'>"
            + "<br>".join(
                f'<span title="{esc(plain(define(t)))}">{t}</span>&nbsp;<b>{r.agg.terminations[t]}</b>'
                for t in TERMINATIONS
            )
            + (f"<br>unfinished&nbsp;<b>{r.unfinished}</b>" if r.unfinished else "")
            + "</td>"
        )
        cells.append(f"<td class=num>{r.agg.bound_hits}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<div class=scroll><table class='summary'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table></div>"


def _episode_table(i: int, run: Run) -> str:
    key = run_key(i, run)
    tid = f"episodes-{i}"
    rows = []
    for sid, result in run.results.items():  # sid: the episode's name (a story's trial past 0: <spec>~t<k>)
        m = episode_metrics(result)
        spec = run.specs.get(result.spec_id)
        title = spec.meta.title if spec else ""
        genres = ", ".join(spec.meta.genres) if spec else ""
        rows.append(
            f'<tr class="episode" data-termination="{esc(m.termination)}" data-spec="{esc(sid)}">'
            f'<td><a href="{esc(episode_href(key, sid))}">{esc(sid)}</a></td><td>{esc(title)}</td>'
            f"<td class=small>{esc(genres)}</td><td>{badge(m.termination, 't-' + m.termination)}</td>"
            f"{turns_cell(m)}<td class=num>{100 * m.trajectory_progress:.1f}</td>"
            f"<td class=num>{100 * m.satisfied:.1f}</td>"
            f'<td data-v="{esc(" ".join(t for t in CONFLICT_TYPES if getattr(m, t)))}">'
            f"{conflict_badges(m)}</td><td class=num>{_overturned(result)}</td>"
            f"<td class=num>{m.bound_hits}</td></tr>"
        )
    options = "".join(f'<option value="{t}">{t}</option>' for t in TERMINATIONS)
    return (
        f'<div class="controls" data-table="{tid}"><select aria-label="termination">'
        f'<option value="">all terminations</option>{options}</select>'
        f'<input type="search" placeholder="filter episodes" aria-label="filter">'
        f'<span class="count muted small">{len(rows)} episodes</span></div>'
        f'<table class="sortable episodes" id="{tid}"><thead><tr><th>episode</th><th>title</th><th>genres</th>'
        f"<th>termination</th>{header_cell('turns', 'num')}{header_cell('traj %', 'num')}{header_cell('sat %', 'num')}"
        f"<th>conflict</th>{header_cell('overturned', 'num')}{header_cell('bound hits', 'num')}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _cost_html(tables: Sequence[CostTable]) -> str:
    """Per run: the cost table, run figures then per episode-turn, each header defined in its tooltip."""
    parts = [f"<p class='muted small'>{prose(PER_TURN_NOTE)}.</p>"]
    for t in tables:
        head = (
            "<tr><th>per</th><th>role</th><th>stage</th>"
            + "".join(f'<th class=num title="{esc(plain(define_cost(h)))}">{esc(h)}</th>' for h in headers(t))
            + "</tr>"
        )
        body = "".join(
            f'<tr class="cost{" total" if role == "all" else ""}" data-per="{esc(per)}"><td>{esc(per)}</td>'
            f"<td>{esc(role)}</td><td>{esc(stage)}</td>"
            + "".join(f"<td class=num>{esc(c)}</td>" for c in cost_cells(t, per, values))
            + "</tr>"
            for per, role, stage, values in rows_of(t)
        )
        note = table_note(t) + ("" if t.gpu_hour_cost is not None else "; set report.gpu_hour_cost= for a cost figure")
        parts.append(
            f"<h3>{esc(t.label)}</h3><p class='muted small'>{prose(note)}</p><div class=scroll>"
            f"<table class='cost'><thead>{head}</thead><tbody>{body}</tbody></table></div>"
        )
    return "".join(parts)


def _endings_answer(ends: Sequence[RunEndings]) -> str:
    """The endings' shares by the last turn per run: part of the answer."""
    return count_table("endings", ENDINGS_SUMMARY_HEADER, endings_summary_rows(ends)) + "".join(
        f"<p class='warn'>{prose(line)}</p>" for line in past_data_lines(ends)
    )


def _endings_html(ends: Sequence[RunEndings], svg: str) -> str:
    """How the endings' shares are estimated, the stacked plot, and each run's table by turn band."""
    parts = [f"<p class='muted small'>{prose(ENDINGS_NOTE)}</p>"]
    if svg:
        parts.append(f"<figure>{svg}</figure>")
    for e in ends:
        parts += [f"<h3>{esc(e.label)}: endings by turns played</h3>", count_table("bands", *e.bands)]
    return "".join(parts)


def _modes_html(modes: Sequence[RunModes]) -> str:
    """Each run's conflicts by failure mode, and by conflict type and mode."""
    parts = [f"<p class='muted small'>{prose(failure_modes.NOTE)}</p>"]
    if any(m.asked for m in modes):
        parts.append(count_table("modes", failure_modes.HEADER, failure_modes.mode_rows(modes), tips=False))
        for m in modes:
            if m.asked:
                parts += [
                    f"<h3>{esc(m.label)}: failure modes by conflict type</h3>",
                    count_table("modes", *failure_modes.type_rows(m), tips=False),
                ]
    parts += [f"<p class='muted small'>{prose(line)}</p>" for line in failure_modes.notes(modes)]
    return "".join(parts)


def _auditor_html(err: AuditorError | None, level: float) -> str:
    """The review sheet's precision per type and each reviewed run's figures as judged and corrected."""
    if err is None:
        return f"<p class='muted small'>{prose(UNCORRECTED_NOTE)}</p>"
    parts = [
        f"<p class='muted small'>{prose(precision.intro(err, level))}</p>",
        count_table("precision", precision.PRECISION_HEADER, precision.precision_rows(err), tips=False),
    ]
    for c in err.corrected:
        parts += [
            f"<h3>{esc(precision.corrected_title(c))}</h3>",
            count_table("corrected", precision.CORRECTED_HEADER, precision.corrected_rows(c), tips=False),
        ]
        if note := precision.notes(err, c):
            parts.append(f"<p class='muted small'>{prose(note)}</p>")
    if note := precision.notes(err):
        parts.append(f"<p class='muted small'>{prose(note)}</p>")
    return "".join(parts)


def _trials_html(rts: Sequence[RunTrials], svg: str, level: float) -> str:
    """The pass^k plot, then per run its pass^k table and its noise floor (report/trials.py)."""
    parts = [f"<figure>{svg}</figure>"]
    for rt in rts:
        parts += [
            f"<h3>{esc(rt.label)}: {rt.trials} trials of {len(rt.stories)} stories</h3>",
            count_table("passk", *passk_table(rt), define=define_trials),
            count_table("noise", *noise_table(rt, level), define=define_trials),
            *(f"<p class='muted small'>{prose(n)}</p>" for n in trials_notes(rt)),
        ]
    parts.append(f"<p class='muted small'>{prose(noise_note(level))}</p>")
    return "".join(parts)


def _verdicts_html(cs: Comparisons) -> str:
    """Each comparison's verdict in one line (compare_doc.verdict), and the runs not compared."""
    said = [compare_doc.verdict(c) for c in cs.compared] + cs.refused
    return "<ul class=verdicts>" + "".join(f"<li>{prose(line)}</li>" for line in said) + "</ul>"


def _comparisons_html(cs: Comparisons) -> str:
    """mode=compare's section in full: per run against the baseline, its notes, the table and the sentences
    (the runs are listed at the top of the page)."""
    parts = [f"<p class='muted small'>{prose(compare_doc.comparisons_note(cs))}</p>"]
    parts += [f"<div class=warn>{prose(line)}</div>" for line in cs.refused]
    for c in cs.compared:
        parts.append(f"<h3>{esc(compare_doc.comparison_title(c))}</h3>")
        parts += [f"<p class='muted small'>{prose(n)}</p>" for n in (compare_doc.window_line(c), *c.notes)]
        parts.append(count_table("compare", compare_doc.HEADER, compare_doc.comparison_rows(c), tips=False))
        parts.append(
            "<ul class=small>"
            + "".join(f"<li>{esc(compare_doc.sentence(c, d, cs.level))}</li>" for d in c.rows)
            + "</ul>"
        )
    return "".join(parts)


def index_page(
    runs: Sequence[Run],
    rows: Sequence[Row],
    svg: str,
    level: float,
    costs: Sequence[CostTable] = (),
    endings: tuple[Sequence[RunEndings], str] | None = None,
    auditor: AuditorError | None = None,
    modes: Sequence[RunModes] = (),
    trials: tuple[Sequence[RunTrials], str] | None = None,
    comparisons: Comparisons | None = None,
) -> str:
    # The resampling rule (protocol/resample.py): stories with their plays; a story played once is its episode.
    over = "stories, each with all its plays" if trials is not None else "episodes"
    parts = [
        "<h1>NCP report</h1>",
        f"<p class=muted>{sum(len(r.results) for r in runs)} episodes in {len(runs)} run(s). "
        f"Intervals: {level:.0%} bootstrap over {over}; averages and rates leave <code>invalid</code> out. "
        "<code>context_limit</code> episodes (the model's window was full) are averaged at their committed "
        "turns and censored in S(t), the Kaplan-Meier estimate (band: its confidence interval, "
        "+: where a <code>context_limit</code> episode leaves the count).</p>",
        _ran_html(runs),
        "<h2>Results</h2>",
        _summary_html(rows),
        # Episodes in flight (report/in_flight.py): one plain line per run that has some.
        *(f"<p class='warn in-flight'>{esc(r.label)}: {prose(r.in_flight)}</p>" for r in rows if r.in_flight),
        *(
            f"<p class='warn'>{esc(r.label)}: {prose(PAST_DATA.format(t=r.known_to))}</p>"
            for r in rows
            if r.known_to >= 0
        ),
    ]
    # The answer first (what ran, the results, the verdicts, what ended the stories); every detail after
    # it, folded, each under its heading.
    compared = comparisons is not None and bool(comparisons.compared)
    if comparisons is not None and compared:
        parts += ["<h2>Comparisons</h2>", _verdicts_html(comparisons)]
    if endings is not None:
        parts += ["<h2>What ended each story</h2>", _endings_answer(endings[0])]
    folded: list[tuple[str, str, str]] = []
    if comparisons is not None and compared:
        folded.append(("comparisons", "Comparisons: every figure with its test", _comparisons_html(comparisons)))
    if svg:
        folded.append(("survival", "Survival", f"<figure>{svg}</figure>"))
    if endings is not None:
        folded.append(("endings", "What ended each story: by turn", _endings_html(*endings)))
    if modes:
        folded.append(("modes", "Failure modes", _modes_html(modes)))
    if trials is not None:
        folded.append(("trials", "Trials: pass^k and the noise floor", _trials_html(*trials, level)))
    folded.append(("auditor", "The auditor's error", _auditor_html(auditor, level)))
    if costs:
        folded.append(("cost", "Cost by role and stage", _cost_html(costs)))
    for i, run in enumerate(runs):
        body = [
            f"<p class='muted small'>{esc(run.path)}"
            + (f" &middot; {len(run.shards)} shard(s)" if run.shards else "")
            + "</p>",
            *(f"<div class=warn>{prose(note)}</div>" for note in run.notes),
            _episode_table(i, run),
        ]
        folded.append((f"run-{i}", f"Episodes: {run.label}", "".join(body)))
    parts += [
        f'<details class=section id="{key}"><summary><h2>{esc(title)}</h2></summary>{body}</details>'
        for key, title, body in folded
    ]
    return page("NCP report", "\n".join(parts), asset("index.js"))


# ---- one episode -------------------------------------------------------------
