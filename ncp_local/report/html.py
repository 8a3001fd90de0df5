"""A self-contained HTML report: an index of episodes and one page per episode.

No network: CSS, the small sorting/filtering script and the survival SVG are
inline. Every piece of model or spec text goes through `esc`; nothing from a
run is ever placed in markup unescaped.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..execution.store import atomic_write
from ..protocol import ledger, turns
from ..protocol.episode import EpisodeResult, TurnRecord
from ..protocol.metrics import EpisodeMetrics, episode_metrics, opening_bound_hits, turn_bound_hits
from ..protocol.replay import Replay, TurnView, conflict_details, diff, replay
from ..protocol.stages import CONFLICT_TYPES, INTERNAL_ID
from . import failure_modes, precision
from .assets import asset
from .cost import PER_TURN_NOTE, CostTable, headers, rows_of, table_note
from .cost import cells as cost_cells
from .endings import ENDINGS_NOTE, RunEndings, endings_summary_rows
from .endings import SUMMARY_HEADER as ENDINGS_SUMMARY_HEADER
from .failure_modes import RunModes
from .glossary import define, define_cost, define_ending, define_trials, plain
from .precision import UNCORRECTED_NOTE, AuditorError
from .runs import Run
from .tables import METRICS, MIN_FOR_INTERVAL, TERMINATIONS, Row
from .trials import NOISE_NOTE, RunTrials, noise_table, passk_table


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# The page's stylesheet and the index's script: files of the package (report/assets/), read once.
CSS = asset("report.css")

INDEX_JS = asset("index.js")


def page(title: str, body: str, script: str = "") -> str:
    js = f"<script>{script}</script>" if script else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>\n{body}\n</main>{js}</body></html>\n"
    )


def run_key(i: int, run: Run) -> str:
    return f"{i:02d}-" + (re.sub(r"[^A-Za-z0-9._-]+", "_", run.key).strip("._") or "run")


def episode_href(key: str, spec_id: str) -> str:
    return f"episodes/{quote(key)}/{quote(spec_id)}.html"


def _th(column: str, cls: str = "", text: str | None = None) -> str:
    """A column header with its glossary definition as the tooltip (report/glossary.py)."""
    klass = f" class={cls}" if cls else ""
    return f'<th{klass} title="{esc(plain(define(column)))}">{esc(text or column)}</th>'


def _with_interval(iv: Any, d: int, scored: int) -> str:
    """A cell's value, and its interval below it when there are 2 or more scored episodes."""
    if scored < MIN_FOR_INTERVAL or iv.lo != iv.lo:
        return f"{iv.point:.{d}f}"
    return f"{iv.point:.{d}f}<div class='muted small'>[{iv.lo:.{d}f}, {iv.hi:.{d}f}]</div>"


def _badge(text: str, cls: str = "") -> str:
    return f'<span class="badge {esc(cls)}">{esc(text)}</span>'


def _conflict_badges(m: EpisodeMetrics) -> str:
    return "".join(_badge(t, t) for t in CONFLICT_TYPES if getattr(m, t))


def _turns_cell(m: EpisodeMetrics) -> str:
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
        return _badge("internal contradiction", "internal")
    if ctype == "player_input":
        return ""  # the target is the player input itself, shown in full
    return f"<span class=fid>{esc(target_id)}</span>"


def _overturned(result: EpisodeResult) -> int:
    return sum(bool(t.conflict_check.get("conflicts")) and not t.conflicts for t in result.turns)


# ---- index -------------------------------------------------------------------


def _summary_html(rows: Sequence[Row]) -> str:
    head = (
        "<tr><th>run</th>"
        + _th("episodes", "num")
        + "".join(_th(h, "num") for _, h, _ in METRICS)
        + _th("conflict-free", "num")
        + "<th>terminations</th>"
        + _th("bound hits", "num")
        + "</tr>"
    )
    body = []
    for r in rows:
        # Censored episodes are in the averages at their committed turns: say how many, beside the count.
        censored = (
            f"<div class='muted small censored' title=\"context_limit: averaged at their committed turns, "
            f'censored in S(t)">{r.agg.censored} censored</div>'
            if r.agg.censored
            else ""
        )
        cells = [
            f"<td>{esc(r.label)}<div class='muted small'>{esc(r.path)}</div></td>",
            f"<td class=num>{r.agg.episodes}{censored}</td>",
        ]
        for k, _, d in METRICS:
            iv = r.ci[k]
            if iv.point != iv.point:  # NaN: no scored episode
                cells.append("<td class=num>n/a</td>")
            else:
                cells.append(f"<td class=num>{_with_interval(iv, d, r.agg.scored)}</td>")
        cells.append(f"<td class=num>{_with_interval(r.ci['conflict_free'], 0, r.agg.scored)}</td>")
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
            f"<td class=small>{esc(genres)}</td><td>{_badge(m.termination, 't-' + m.termination)}</td>"
            f"{_turns_cell(m)}<td class=num>{100 * m.trajectory_progress:.1f}</td>"
            f"<td class=num>{100 * m.satisfied:.1f}</td>"
            f'<td data-v="{esc(" ".join(t for t in CONFLICT_TYPES if getattr(m, t)))}">'
            f"{_conflict_badges(m)}</td><td class=num>{_overturned(result)}</td>"
            f"<td class=num>{m.bound_hits}</td></tr>"
        )
    options = "".join(f'<option value="{t}">{t}</option>' for t in TERMINATIONS)
    return (
        f'<div class="controls" data-table="{tid}"><select aria-label="termination">'
        f'<option value="">all terminations</option>{options}</select>'
        f'<input type="search" placeholder="filter episodes" aria-label="filter">'
        f'<span class="count muted small">{len(rows)} episodes</span></div>'
        f'<table class="sortable episodes" id="{tid}"><thead><tr><th>episode</th><th>title</th><th>genres</th>'
        f"<th>termination</th>{_th('turns', 'num')}{_th('traj %', 'num')}{_th('sat %', 'num')}"
        f"<th>conflict</th>{_th('overturned', 'num')}{_th('bound hits', 'num')}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _cost_html(tables: Sequence[CostTable]) -> str:
    """Per run: the cost table, run figures then per episode-turn, each header defined in its tooltip."""
    parts = [f"<p class='muted small'>{esc(PER_TURN_NOTE)}.</p>"]
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
            f"<h3>{esc(t.label)}</h3><p class='muted small'>{esc(note)}</p><div class=scroll>"
            f"<table class='cost'><thead>{head}</thead><tbody>{body}</tbody></table></div>"
        )
    return "".join(parts)


def _count_table(
    cls: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    tips: bool = True,
    define: Callable[[str], str] = define_ending,
) -> str:
    """A table whose first column names the row and the rest are numbers; its headers get their glossary
    text (`define`: the endings table's by default) as tooltips."""

    def th(i: int, h: str) -> str:
        tip = f' title="{esc(plain(define(h)))}"' if tips and h else ""
        return f"<th{'' if i == 0 else ' class=num'}{tip}>{esc(h)}</th>"

    head = "<tr>" + "".join(th(i, h) for i, h in enumerate(header)) + "</tr>"
    body = "".join(
        "<tr>" + "".join(f"<td{'' if i == 0 else ' class=num'}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<div class=scroll><table class='{cls}'><thead>{head}</thead><tbody>{body}</tbody></table></div>"


def _endings_html(ends: Sequence[RunEndings], svg: str) -> str:
    """The endings' shares by the last turn per run, the stacked plot, and each run's table by turn band."""
    parts = [
        f"<p class='muted small'>{esc(ENDINGS_NOTE)}</p>",
        _count_table("endings", ENDINGS_SUMMARY_HEADER, endings_summary_rows(ends)),
    ]
    if svg:
        parts.append(f"<figure>{svg}</figure>")
    for e in ends:
        parts += [f"<h3>{esc(e.label)}: endings by turns played</h3>", _count_table("bands", *e.bands)]
    return "".join(parts)


def _modes_html(modes: Sequence[RunModes]) -> str:
    """Each run's conflicts by failure mode, and by conflict type and mode."""
    parts = [f"<p class='muted small'>{esc(failure_modes.NOTE)}</p>"]
    if any(m.asked for m in modes):
        parts.append(_count_table("modes", failure_modes.HEADER, failure_modes.mode_rows(modes), tips=False))
        for m in modes:
            if m.asked:
                parts += [
                    f"<h3>{esc(m.label)}: failure modes by conflict type</h3>",
                    _count_table("modes", *failure_modes.type_rows(m), tips=False),
                ]
    parts += [f"<p class='muted small'>{esc(line)}</p>" for line in failure_modes.notes(modes)]
    return "".join(parts)


def _auditor_html(err: AuditorError | None, level: float) -> str:
    """The review sheet's precision per type and each reviewed run's figures as judged and corrected."""
    if err is None:
        return f"<p class='muted small'>{esc(plain(UNCORRECTED_NOTE))}</p>"
    parts = [
        f"<p class='muted small'>{esc(plain(precision.intro(err, level)))}</p>",
        _count_table("precision", precision.PRECISION_HEADER, precision.precision_rows(err), tips=False),
    ]
    for c in err.corrected:
        parts += [
            f"<h3>{esc(precision.corrected_title(c))}</h3>",
            _count_table("corrected", precision.CORRECTED_HEADER, precision.corrected_rows(c), tips=False),
        ]
        if note := precision.notes(err, c):
            parts.append(f"<p class='muted small'>{esc(note)}</p>")
    if note := precision.notes(err):
        parts.append(f"<p class='muted small'>{esc(note)}</p>")
    return "".join(parts)


def _trials_html(rts: Sequence[RunTrials], svg: str, level: float) -> str:
    """The pass^k plot, then per run its pass^k table and its noise floor (report/trials.py)."""
    parts = [f"<figure>{svg}</figure>"]
    for rt in rts:
        parts += [
            f"<h3>{esc(rt.label)}: {rt.trials} trials of {len(rt.stories)} stories</h3>",
            _count_table("passk", *passk_table(rt), define=define_trials),
            _count_table("noise", *noise_table(rt, level), define=define_trials),
        ]
    parts.append(f"<p class='muted small'>{esc(NOISE_NOTE)}</p>")
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
) -> str:
    parts = [
        "<h1>NCP report</h1>",
        f"<p class=muted>{sum(len(r.results) for r in runs)} episodes in {len(runs)} run(s). "
        f"Intervals: {level:.0%} bootstrap over episodes; averages and rates leave <code>invalid</code> out. "
        "<code>context_limit</code> episodes (the model's window was full) are averaged at their committed "
        "turns and censored in S(t), the Kaplan-Meier estimate (band: its confidence interval, "
        "+: where a censored episode leaves the count).</p>",
        "<h2>Results</h2>",
        _summary_html(rows),
    ]
    if svg:
        parts += ["<h2>Survival</h2>", f"<figure>{svg}</figure>"]
    if endings is not None:
        parts += ["<h2>What ended each story</h2>", _endings_html(*endings)]
    if modes:
        parts += ["<h2>Failure modes</h2>", _modes_html(modes)]
    if trials is not None:
        parts += ["<h2>Trials: pass^k and the noise floor</h2>", _trials_html(*trials, level)]
    parts += ["<h2>The auditor's error</h2>", _auditor_html(auditor, level)]
    if costs:
        parts += ["<h2>Cost by role and stage</h2>", _cost_html(costs)]
    for i, run in enumerate(runs):
        parts.append(
            f"<h2 id=\"run-{i}\">{esc(run.label)}</h2><p class='muted small'>{esc(run.path)}"
            + (f" &middot; {len(run.shards)} shard(s)" if run.shards else "")
            + "</p>"
        )
        for note in run.notes:
            parts.append(f"<div class=warn>{esc(note)}</div>")
        parts.append(_episode_table(i, run))
    return page("NCP report", "\n".join(parts), INDEX_JS)


# ---- one episode -------------------------------------------------------------


def _fact(f: Any) -> str:
    return f"<span class=fid>{esc(f.id)}</span> {esc(f.text)}"


def _ledger_changes(view: TurnView) -> str:
    items = []
    if not view.pending.empty:
        items += [
            f"<li class=add>+ {_fact(f)} <span class='muted small'>(from the opening)</span></li>"
            for f in view.pending.added
        ]
        items += [
            f"<li class=neg>&minus; {_fact(f)} <span class='muted small'>(from the opening)</span></li>"
            for f in view.pending.negated
        ]
    note = "" if view.committed else " <span class='muted small'>(candidate, not committed)</span>"
    items += [f"<li class=add>+ {_fact(f)}{note}</li>" for f in view.update.added]
    items += [f"<li class=neg>&minus; {_fact(f)}{note}</li>" for f in view.update.negated]
    return f"<ul class=changes>{''.join(items)}</ul>" if items else ""


def _progress_changes(rec: TurnRecord, spec: Any) -> str:
    items = []
    if rec.node_completed:
        desc = next((n.description for n in spec.trajectory if n.id == rec.node_completed), "") if spec else ""
        items.append(
            f"<li class=node-done>&#10003; node <span class=fid>{esc(rec.node_completed)}</span> "
            f"completed {esc(desc)}</li>"
        )
    if rec.newly_satisfied:
        items.append(
            "<li class=sat>&#9733; satisfied: "
            + " ".join(f"<span class=fid>{esc(c)}</span>" for c in rec.newly_satisfied)
            + "</li>"
        )
    if rec.back_to_pending:
        items.append(
            "<li class=unsat>&#8634; back to pending: "
            + " ".join(f"<span class=fid>{esc(c)}</span>" for c in rec.back_to_pending)
            + "</li>"
        )
    return f"<ul class=changes>{''.join(items)}</ul>" if items else ""


def _conflict_block(details: list[dict[str, Any]], turn: int) -> str:
    blocks = []
    for d in details:
        blocks.append(
            f'<div class="conflict" data-type="{esc(d["type"])}"><b>Conflict</b> {turns.at(turn)}: '
            f"{_badge(d['type'], d['type'])} {target_tag(d['type'], d['id'])}"
            + f"<div class=target>{esc(d['target_text'])}</div><dl>"
            f"<dt>first check</dt><dd>{esc(d['reason_initial'])}</dd>"
            f"<dt>after double-check</dt><dd>{esc(d['reason_reviewed'])}</dd>"
            f"<dt>review</dt><dd>{esc(d['review_reason'])}</dd>"
            + (
                f"<dt>failure mode</dt><dd>{_badge(d['mode'], 'mode')} {esc(d['mode_reason'])}</dd>"
                if d.get("mode")
                else ""
            )
            + "</dl></div>"
        )
    return "".join(blocks)


def _audit_details(rec: TurnRecord) -> str:
    first = rec.conflict_check.get("conflicts", [])
    out = []
    if first and not rec.conflicts:
        out.append(
            "<div class=overturned>The first check raised "
            + ", ".join(f"{esc(c['type'])} <span class=fid>{esc(c['id'])}</span>" for c in first)
            + "; the double-check cleared it"
            + (f": {esc((rec.double_check or {}).get('review_reason', ''))}" if rec.double_check else "")
            + "</div>"
        )
    payload = {
        "fact_update": rec.fact_update.model_dump(mode="json"),
        "conflict_check": rec.conflict_check,
        "double_check": rec.double_check,
        "trajectory_check": rec.trajectory_check,
    }
    out.append(
        "<details><summary>auditor outputs</summary><pre>"
        + esc(json.dumps(payload, indent=1, ensure_ascii=False))
        + "</pre></details>"
    )
    return "".join(out)


def _bound_note(hits: tuple[str, ...]) -> str:
    # A capped output may be cut mid-sentence or have dropped items: the reader should know.
    if not hits:
        return ""
    return (
        '<div class="warn bound-hits">reached a configured bound: '
        + " ".join(_badge(h, "bound") for h in hits)
        + "</div>"
    )


def _turn_card(rec: TurnRecord, view: TurnView | None, spec: Any) -> str:
    ended = bool(rec.conflicts)
    hits = turn_bound_hits(rec)
    cls = "card turn" + (" conflict-turn" if ended else "") + (" bound-hit" if hits else "")
    parts = [
        f'<article class="{cls}" id="t{turns.shown(rec.turn)}"><h3>{turns.label(rec.turn).capitalize()}</h3>',
        f"<div class=player><span class=who>player</span>{esc(rec.player_input)}</div>",
        f"<div class=narrator><span class=who>narrator</span>{esc(rec.response)}</div>",
    ]
    if view is not None:
        parts.append(_ledger_changes(view))
    else:
        fu = rec.fact_update
        items = [f"<li class=add>+ {esc(a)}</li>" for a in fu.add_facts if a.strip()]
        items += [f"<li class=neg>&minus; <span class=fid>{esc(i)}</span></li>" for i in fu.negate_facts]
        if items:
            parts.append(f"<ul class=changes>{''.join(items)}</ul>")
    parts.append(_progress_changes(rec, spec))
    parts.append(_bound_note(hits))
    if ended:
        details = conflict_details(spec, view, rec)
        parts.append(_conflict_block(details, rec.turn))
    parts.append(_audit_details(rec))
    parts.append("</article>")
    return "".join(parts)


def _fact_table(rp: Replay) -> str:
    origin: dict[str, str] = {f.id: "initial" for f in rp.spec.initial_facts}
    negated_at: dict[str, str] = {f.id: "spec (t=0)" for f in rp.spec.initial_facts if f.negated}
    for v in rp.turns:
        if not v.committed:
            break
        for f in v.pending.added:
            origin[f.id] = "opening"
        for f in v.pending.negated:
            negated_at[f.id] = "opening"
        for f in v.update.added:
            origin[f.id] = turns.label(v.record.turn)
        for f in v.update.negated:
            negated_at[f.id] = turns.label(v.record.turn)
    rows = []
    for f in rp.final.facts:
        rows.append(
            f'<tr class="{"active" if f.active else "inactive"}"><td><span class=fid>{esc(f.id)}</span></td>'
            f"<td class=text>{esc(f.text)}</td><td>{esc(origin.get(f.id, ''))}</td>"
            f"<td>{esc(negated_at.get(f.id, ''))}</td></tr>"
        )
    return _table("ledger", ("id", "fact", "added", "negated"), rows)


def _table(cls: str, headers: tuple[str, ...], rows: list[str]) -> str:
    """A plain table of an episode page: fixed headers, rows already rendered."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return f"<table class={cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _node_table(rp: Replay) -> str:
    done = {v.record.node_completed: v.record.turn for v in rp.turns if v.committed and v.record.node_completed}
    rows = []
    for n, occurred in zip(rp.spec.trajectory, rp.final.node_occurred, strict=True):
        at = turns.label(done[n.id]) if n.id in done else ("yes" if occurred else "")
        rows.append(
            f"<tr><td><span class=fid>{esc(n.id)}</span></td><td>{esc(n.description)}</td>"
            f"<td class=small>{esc(n.trigger_event)}</td><td class=small>{esc(n.key_delta)}</td>"
            f"<td>{esc(at)}</td></tr>"
        )
    return _table("nodes", ("node", "description", "trigger event", "key change", "completed"), rows)


def _commitment_table(rp: Replay) -> str:
    committed = [v for v in rp.turns if v.committed]
    final = rp.final.status_map
    rows = []
    for c in rp.spec.commitments:
        strip = "".join(
            f'<span class="{"s" if v.after is not None and v.after.status_map.get(c.id) == "satisfied" else "p"}" '
            f'title="{turns.label(v.record.turn)}"></span>'
            for v in committed
        )
        sat = [str(turns.shown(v.record.turn)) for v in committed if c.id in v.record.newly_satisfied]
        back = [str(turns.shown(v.record.turn)) for v in committed if c.id in v.record.back_to_pending]
        status = final.get(c.id, "pending")
        resolved = "t-all_resolved" if final.get(c.id) == "satisfied" else ""
        rows.append(
            f'<tr class="commitment status-{esc(status)}"><td><span class=fid>{esc(c.id)}</span>'
            f"</td><td>{esc(c.type)}</td><td>{esc(c.description)}</td>"
            f"<td>{_badge(status, resolved)}</td>"
            f"<td class=small>{esc(', '.join(sat))}</td><td class=small>{esc(', '.join(back))}</td>"
            f"<td><div class=strip>{strip}</div></td></tr>"
        )
    return _table(
        "commitments",
        ("id", "type", "description", "final", "satisfied at turn", "back to pending at", "status per turn"),
        rows,
    )


def episode_page(run: Run, result: EpisodeResult, index_href: str) -> str:
    spec = run.specs.get(result.spec_id)
    m = episode_metrics(result)
    rp = replay(spec, result) if spec is not None else None
    views: dict[int, TurnView] = {v.record.turn: v for v in rp.turns} if rp else {}
    title = f"{result.episode}" + (f" — {spec.meta.title}" if spec else "")
    parts = [
        f'<p class=small><a href="{esc(index_href)}">&larr; all episodes</a> &middot; {esc(run.label)}</p>',
        f"<h1>{esc(title)}</h1>",
    ]
    if spec:
        parts.append(
            f"<p class=muted>{esc(', '.join(spec.meta.genres))} &middot; player: {esc(spec.meta.player_role)}</p>"
        )
    parts.append(
        "<div class=metrics>"
        f"<div>termination<b>{_badge(m.termination, 't-' + m.termination)}</b></div>"
        f"<div>turns<b>{m.turns}{'+' if m.censored else ''}</b></div>"
        f"<div>trajectory<b>{100 * m.trajectory_progress:.1f}%</b></div>"
        f"<div>satisfied<b>{100 * m.satisfied:.1f}%</b></div>"
        f"<div>conflict<b>{_conflict_badges(m) or '&ndash;'}</b></div></div>"
    )
    if result.reason:
        parts.append(f"<div class=warn>{esc(result.termination)}: {esc(result.reason)}</div>")
    if m.censored:
        where = "the opening" if not result.turns and not result.opening else turns.label(m.turns)
        parts.append(
            f'<div class="warn censored">Censored: a call of {where} no longer fit the model\'s window, '
            f"so this story's length is only known to exceed {m.turns} turns. The averages count its "
            f"{m.turns} committed turns; S(t) counts it as running through t = {m.turns + 1}, then "
            "censored.</div>"
        )
    if m.bound_hits:
        parts.append(
            f"<div class=warn>{m.bound_hits} output(s) reached a configured bound (marked on their turns below).</div>"
        )
    if spec is None:
        parts.append(
            "<div class=warn>The spec of this episode was not found, so the fact ledger, targets and "
            "node texts are not shown (pass report.dataset=DIR).</div>"
        )
    for problem in rp.problems if rp else ():
        parts.append(f"<div class=warn>{esc(problem)}</div>")
    last = result.turns[-1] if result.turns else None
    if last is not None and last.conflicts:
        kinds = ", ".join(sorted({c["type"] for c in last.conflicts}))
        parts.append(
            f"<p class=ending>Ended by a {esc(kinds)} conflict at "
            f'<a href="#t{turns.shown(last.turn)}">{turns.label(last.turn)} &darr;</a></p>'
        )

    parts.append("<h2>Transcript</h2>")
    o_hits = opening_bound_hits(result)
    opening = [
        f'<article class="card turn opening{" bound-hit" if o_hits else ""}" id="opening"><h3>Opening</h3>'
        f"<div class=narrator><span class=who>narrator</span>{esc(result.opening)}</div>",
        _bound_note(o_hits),
    ]
    ou = result.opening_update
    if ou and (ou.add_facts or ou.negate_facts):
        if rp is not None:  # ids and texts as they will be when the first turn commits
            pending = diff(rp.opening_state.facts, ledger.projected_facts(rp.opening_state))
            items = [f"<li class=add>+ {_fact(f)}</li>" for f in pending.added]
            items += [f"<li class=neg>&minus; {_fact(f)}</li>" for f in pending.negated]
        else:
            items = [f"<li class=add>+ {esc(a)}</li>" for a in ou.add_facts if a.strip()]
            items += [f"<li class=neg>&minus; <span class=fid>{esc(i)}</span></li>" for i in ou.negate_facts]
        opening.append(
            f"<div class='muted small'>fact updates, held pending until {turns.label(0)} commits:</div>"
            f"<ul class=changes>{''.join(items)}</ul>"
        )
    opening.append("</article>")
    parts.append("".join(opening))
    for rec in result.turns:
        parts.append(_turn_card(rec, views.get(rec.turn), spec))
    if rp is not None:
        parts += [
            "<h2>Fact ledger</h2>",
            _fact_table(rp),
            "<h2>Trajectory</h2>",
            _node_table(rp),
            "<h2>Commitments</h2>",
            _commitment_table(rp),
        ]
    return page(title, "\n".join(parts))


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
) -> Path:
    for i, run in enumerate(runs):
        key = run_key(i, run)
        for sid, result in run.results.items():
            atomic_write(out / "episodes" / key / f"{sid}.html", episode_page(run, result, "../../index.html"))
    index = out / "index.html"
    atomic_write(index, index_page(runs, rows, svg, level, costs, endings, auditor, modes, trials))
    return index
