"""Which tracker run a run directory (or a sweep folder) is, kept in its `tracker.json`, so that a resumed
run, or a sweep run again, continues the same tracker run instead of starting another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rundir.atomic import atomic_write

STATE = "tracker.json"


def read(folder: Path, tracker: str, where: str) -> str | None:
    """The tracker run id kept for `tracker` at `where` (its store); None when there is none or the store
    differs (a run logged to another store starts a run there)."""
    try:
        doc = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return None
    entry = doc.get(tracker) if isinstance(doc, dict) else None
    if isinstance(entry, dict) and entry.get("where") == where and isinstance(entry.get("id"), str):
        return entry["id"]
    return None


def write(folder: Path, tracker: str, where: str, run_id: str, **extra: Any) -> None:
    path = folder / STATE
    try:
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        doc = {}
    doc[tracker] = {"id": run_id, "where": where, **extra}
    atomic_write(path, json.dumps(doc, indent=2) + "\n")
