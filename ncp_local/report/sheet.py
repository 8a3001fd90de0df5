"""The review sheet's columns and its reader: one row per standing conflict of a sampled conflict
termination, a human's verdict on each (review.py writes the sheet; review.py's summary and
precision.py's correction read it back)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..errors import InputError
from ..protocol.stages import CONFLICT_TYPES

VERDICTS = ("agree", "dispute")
SHEET_COLUMNS = (
    "item",
    "run",
    "run_dir",
    "spec_id",
    "turn",
    "type",
    "target_id",
    "target_text",
    "player_input",
    "response",
    "reason_initial",
    "reason_reviewed",
    "review_reason",
    "verdict",
    "note",
)


def read_sheet(path: str | Path) -> list[dict[str, str]]:
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "review.sheet", f"cannot read: {exc}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [c for c in ("type", "verdict") if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError(path, "header", f"missing column(s) {', '.join(missing)}")
    rows = []
    # Rows are numbered as a spreadsheet shows them (the header is row 1); a quoted field may span lines.
    for row_no, row in enumerate(reader, start=2):
        verdict = (row.get("verdict") or "").strip().lower()
        if verdict not in ("", *VERDICTS):
            raise InputError(path, f"row {row_no}: verdict", f"{row.get('verdict')!r} is not agree, dispute or blank")
        ctype = (row.get("type") or "").strip()
        if ctype not in CONFLICT_TYPES:
            raise InputError(path, f"row {row_no}: type", f"{ctype!r} is not one of {', '.join(CONFLICT_TYPES)}")
        rows.append({**{k: (v or "") for k, v in row.items() if k is not None}, "verdict": verdict, "type": ctype})
    return rows
