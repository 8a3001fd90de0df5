"""One episode's page: its turns with the ledger's changes, conflicts and audits, and its facts, nodes
and commitments."""

from __future__ import annotations

import json
from typing import Any

from ..protocol import ledger, turns
from ..protocol.metrics import episode_metrics, opening_bound_hits, turn_bound_hits
from ..protocol.records import EpisodeResult, TurnRecord
from ..protocol.replay import Replay, TurnView, conflict_details, diff, replay
from .html_parts import badge, conflict_badges, esc, page, prose, rendered_table, target_tag
from .ran import SCRIPTED_LINE, what_ran
from .runs import Run


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


def _commitment(cid: str, spec: Any) -> str:
    """A commitment by its id and its text (the id alone when the spec was not found)."""
    c = next((c for c in spec.commitments if c.id == cid), None) if spec else None
    text = f" {esc(c.description)} <span class='muted small'>({esc(c.type)})</span>" if c else ""
    return f"<span class=fid>{esc(cid)}</span>{text}"


def _progress_changes(rec: TurnRecord, spec: Any) -> str:
    items = []
    if rec.node_completed:
        desc = next((n.description for n in spec.trajectory if n.id == rec.node_completed), "") if spec else ""
        items.append(
            f"<li class=node-done>&#10003; node <span class=fid>{esc(rec.node_completed)}</span> "
            f"completed {esc(desc)}</li>"
        )
    # One line per commitment, with its text: an id alone (c_4) tells a reader nothing.
    items += [f"<li class=sat>&#9733; satisfied: {_commitment(c, spec)}</li>" for c in rec.newly_satisfied]
    items += [f"<li class=unsat>&#8634; back to pending: {_commitment(c, spec)}</li>" for c in rec.back_to_pending]
    return f"<ul class=changes>{''.join(items)}</ul>" if items else ""


def _conflict_block(details: list[dict[str, Any]], turn: int) -> str:
    blocks = []
    for d in details:
        blocks.append(
            f'<div class="conflict" data-type="{esc(d["type"])}"><b>Conflict</b> {turns.at(turn)}: '
            f"{badge(d['type'], d['type'])} {target_tag(d['type'], d['id'])}"
            + f"<div class=target>{esc(d['target_text'])}</div><dl>"
            f"<dt>first check</dt><dd>{esc(d['reason_initial'])}</dd>"
            f"<dt>after double-check</dt><dd>{esc(d['reason_reviewed'])}</dd>"
            f"<dt>review</dt><dd>{esc(d['review_reason'])}</dd>"
            + (
                f"<dt>failure mode</dt><dd>{badge(d['mode'], 'mode')} {esc(d['mode_reason'])}</dd>"
                if d.get("mode")
                else ""
            )
            + "</dl></div>"
        )
    return "".join(blocks)


def _audit_details(rec: TurnRecord) -> str:
    first = rec.conflict_check.conflicts
    out = []
    if first and not rec.conflicts:
        out.append(
            "<div class=overturned>The first check raised "
            + ", ".join(f"{esc(c.type)} <span class=fid>{esc(c.id)}</span>" for c in first)
            + "; the double-check cleared it"
            + (f": {esc(rec.double_check.review_reason)}" if rec.double_check else "")
            + "</div>"
        )
    payload = {
        "fact_update": rec.fact_update,
        "conflict_check": rec.conflict_check,
        "double_check": rec.double_check,
        "trajectory_check": rec.trajectory_check,
    }
    shown = {k: v.model_dump(mode="json") if v is not None else None for k, v in payload.items()}
    out.append(
        "<details><summary>auditor outputs</summary><pre>"
        + esc(json.dumps(shown, indent=1, ensure_ascii=False))
        + "</pre></details>"
    )
    return "".join(out)


def _bound_note(hits: tuple[str, ...]) -> str:
    # A capped output may be cut mid-sentence or have dropped items: the reader should know.
    if not hits:
        return ""
    return (
        '<div class="warn bound-hits">reached a configured bound: '
        + " ".join(badge(h, "bound") for h in hits)
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
    return rendered_table("ledger", ("id", "fact", "added", "negated"), rows)


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
    return rendered_table("nodes", ("node", "description", "trigger event", "key change", "completed"), rows)


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
            f"<td>{badge(status, resolved)}</td>"
            f"<td class=small>{esc(', '.join(sat))}</td><td class=small>{esc(', '.join(back))}</td>"
            f"<td><div class=strip>{strip}</div></td></tr>"
        )
    return rendered_table(
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
    ran = what_ran(run.manifest)
    parts = [
        f'<p class=small><a href="{esc(index_href)}">&larr; all episodes</a> &middot; {esc(run.label)}'
        f" &middot; {esc(ran.line)}</p>",
        f"<h1>{esc(title)}</h1>",
    ]
    if spec:
        parts.append(
            f"<p class=muted>{esc(', '.join(spec.meta.genres))} &middot; player: {esc(spec.meta.player_role)}</p>"
        )
    parts.append(
        "<div class=metrics>"
        f"<div>termination<b>{badge(m.termination, 't-' + m.termination)}</b></div>"
        f"<div>turns<b>{m.turns}{'+' if m.censored else ''}</b></div>"
        f"<div>trajectory<b>{100 * m.trajectory_progress:.1f}%</b></div>"
        f"<div>satisfied<b>{100 * m.satisfied:.1f}%</b></div>"
        f"<div>conflict<b>{conflict_badges(m) or '&ndash;'}</b></div></div>"
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
    if ran.scripted:
        parts.append(f"<div class=scripted>{prose(SCRIPTED_LINE)}</div>")
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
        kinds = ", ".join(sorted({c.type for c in last.conflicts}))
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
