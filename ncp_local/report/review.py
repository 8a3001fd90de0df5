"""Human verification of conflict terminations (the paper's human review).

`export_sheet` samples N conflict terminations (seeded) into a CSV sheet and
an HTML form (agree / dispute per conflict; the form saves the filled CSV).
`disputed_summary` gives a filled sheet's disputed rate by conflict type
(the sheet's columns and its reader are in sheet.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..protocol.replay import conflict_details, replay
from ..protocol.stages import CONFLICT_TYPES
from ..protocol.turns import shown as shown_turn
from ..rundir.atomic import atomic_write
from .assets import asset
from .html_parts import esc, page, target_tag
from .runs import Run
from .sheet import SHEET_COLUMNS, VERDICTS, read_sheet
from .tables import csv_text, markdown_table

__all__ = ["SHEET_COLUMNS", "VERDICTS", "disputed_summary", "export_sheet", "read_sheet", "sample_conflicts"]

CONTEXT_TURNS = 3


def sample_conflicts(runs: Sequence[Run], n: int, seed: int) -> list[dict[str, Any]]:
    """Rows for N sampled conflict terminations (one row per standing conflict of each)."""
    pool = [(run, result) for run in runs for result in run.results.values() if result.termination == "conflict"]
    rng = random.Random(seed)
    picked = rng.sample(pool, min(n, len(pool)))
    rows: list[dict[str, Any]] = []
    for run, result in picked:
        rec = result.turns[-1]
        spec = run.specs.get(result.spec_id)
        view = replay(spec, result).turns[-1] if spec is not None else None
        details = conflict_details(spec, view, rec)
        for d in details:
            rows.append(
                {
                    "item": f"{len(rows) + 1:03d}",
                    "run": run.label,
                    "run_dir": str(run.path),
                    "spec_id": result.episode,  # the episode's name: a trial past 0 is <spec>~t<k>
                    "turn": shown_turn(rec.turn),
                    "type": d["type"],
                    "target_id": d["id"],
                    "target_text": d["target_text"],
                    "player_input": rec.player_input,
                    "response": rec.response,
                    "reason_initial": d["reason_initial"],
                    "reason_reviewed": d["reason_reviewed"],
                    "review_reason": d["review_reason"],
                    "verdict": "",
                    "note": "",
                    # For the HTML form only: what came just before, so a reviewer can judge.
                    "_context": [(t.player_input, t.response) for t in result.turns[-1 - CONTEXT_TURNS : -1]],
                    "_opening": result.opening if len(result.turns) <= CONTEXT_TURNS else "",
                }
            )
    return rows


def sheet_csv(rows: Sequence[dict[str, Any]]) -> str:
    return csv_text(SHEET_COLUMNS, [[r[c] for c in SHEET_COLUMNS] for r in rows])


def _json_for_script(obj: Any) -> str:
    # Inside <script> only "</" can end the element early; \\u003c keeps it inert.
    return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")


def _context_html(r: dict[str, Any]) -> str:
    parts = []
    if r.get("_opening"):
        parts.append(f"<div class=narrator><span class=who>opening</span>{esc(r['_opening'])}</div>")
    for player, narrator in r.get("_context", []):
        parts.append(
            f"<div class=player><span class=who>player</span>{esc(player)}</div>"
            f"<div class=narrator><span class=who>narrator</span>{esc(narrator)}</div>"
        )
    if not parts:
        return ""
    return f"<details><summary>the turns before</summary>{''.join(parts)}</details>"


def sheet_html(rows: Sequence[dict[str, Any]]) -> str:
    public = [{c: r[c] for c in SHEET_COLUMNS} for r in rows]
    items = []
    for r in rows:
        i = esc(r["item"])
        items.append(
            f'<fieldset class="card review-item" id="item-{i}"><legend>#{i} &middot; {esc(r["spec_id"])} turn '
            f'{esc(r["turn"])} &middot; <span class="badge {esc(r["type"])}">{esc(r["type"])}</span> '
            f"{target_tag(r['type'], r['target_id'])} <span class='muted small'>{esc(r['run'])}</span></legend>"
            + _context_html(r)
            + f"<div class=player><span class=who>player</span>{esc(r['player_input'])}</div>"
            f"<div class=narrator><span class=who>narrator</span>{esc(r['response'])}</div>"
            f"<div class=conflict><b>target</b><div class=target>{esc(r['target_text'])}</div><dl>"
            f"<dt>first check</dt><dd>{esc(r['reason_initial'])}</dd>"
            f"<dt>after double-check</dt><dd>{esc(r['reason_reviewed'])}</dd>"
            f"<dt>review</dt><dd>{esc(r['review_reason'])}</dd></dl></div>"
            f'<label><input type=radio name="verdict-{i}" value="agree"> agree: a real conflict</label> &nbsp; '
            f'<label><input type=radio name="verdict-{i}" value="dispute"> dispute: not a conflict</label>'
            f'<div><textarea id="note-{i}" rows=2 style="width:100%" '
            'placeholder="note (optional)"></textarea></div>'
            "</fieldset>"
        )
    body = (
        "<h1>Conflict review sheet</h1><p class=muted>For each sampled conflict termination: is it a real "
        "conflict? Pick agree or dispute, then save the filled CSV and read it back with "
        "<code>python run.py mode=review review.sheet=FILE</code>.</p>"
        "<p><button id=save type=button>Save filled CSV</button> <span id=progress class=muted></span></p>"
        + "".join(items)
        + f'<script type="application/json" id="sheet-data">{_json_for_script(public)}</script>'
        + '<script type="application/json" id="sheet-columns">'
        + f"{_json_for_script(list(SHEET_COLUMNS))}</script>"
    )
    return page("Conflict review sheet", body, asset("review.js"))


def export_sheet(runs: Sequence[Run], out: Path, n: int, seed: int) -> tuple[Path, Path, int]:
    rows = sample_conflicts(runs, n, seed)
    atomic_write(out / "review_sheet.csv", sheet_csv(rows))
    atomic_write(out / "review_sheet.html", sheet_html(rows))
    return out / "review_sheet.csv", out / "review_sheet.html", len(rows)


# ---- reading a filled sheet back -------------------------------------------


@dataclass(frozen=True)
class TypeSummary:
    type: str
    items: int
    reviewed: int
    disputed: int

    @property
    def rate(self) -> float | None:
        return self.disputed / self.reviewed if self.reviewed else None


def disputed_summary(rows: Sequence[dict[str, str]]) -> list[TypeSummary]:
    out = []
    for t in (*CONFLICT_TYPES, "all"):
        sel = [r for r in rows if t == "all" or r["type"] == t]
        out.append(
            TypeSummary(
                t, len(sel), sum(r["verdict"] in VERDICTS for r in sel), sum(r["verdict"] == "dispute" for r in sel)
            )
        )
    return out


SUMMARY_HEADER = ("type", "items", "reviewed", "disputed", "disputed %")


def _summary_cells(s: TypeSummary) -> list[Any]:
    return [s.type, s.items, s.reviewed, s.disputed, "n/a" if s.rate is None else f"{100 * s.rate:.1f}"]


def summary_markdown(summary: Sequence[TypeSummary]) -> str:
    return markdown_table(SUMMARY_HEADER, [_summary_cells(s) for s in summary])


def summary_csv(summary: Sequence[TypeSummary]) -> str:
    return csv_text(
        ("type", "items", "reviewed", "disputed", "disputed_rate"),
        [[s.type, s.items, s.reviewed, s.disputed, "" if s.rate is None else round(s.rate, 6)] for s in summary],
    )
