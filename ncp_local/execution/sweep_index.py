"""A sweep folder's index: `index.json` (one per shard when array tasks run shards of one sweep)
and its `index.md` table: job number, overrides, run directory, status and exit code of every
point, and the engines a batched sweep shared. Written by both launchers, read by reports."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import InputError
from .atomic import atomic_write
from .formats import check_version, stamped
from .layout import shard_name
from .provenance import command, now

INDEX = "index.json"


def name_for(cfg: RunConfig | None) -> str:
    """`index.json`, or one per shard when array tasks run shards of the same sweep (never one file for two);
    a point refused before its config validated (None) writes the plain index."""
    if cfg is None or cfg.shard.count == 1:
        return INDEX
    return shard_index(cfg.shard.index, cfg.shard.count)


def shard_index(index: int, count: int) -> str:
    """The index array task `index` of `count` writes for its shard of every point."""
    return f"index-{shard_name(index, count)}.json"


def write(
    sweep_dir: Path,
    rows: list[dict[str, Any]],
    engines: list[dict[str, Any]],
    groups: list[list[int]],
    launcher: str,
    name: str = INDEX,
) -> Path:
    """index.json (and its index.md table): every point's row, the shared engines, the groups."""
    doc = {
        "kind": "ncp-sweep",
        "launcher": launcher,
        "updated": now(),
        "command": command().get("line"),
        # The batched launcher runs every point in this one process; the basic one, one after the other.
        "pid": os.getpid(),
        "points": rows,
        "engines": engines,
        "groups": groups,
    }
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(sweep_dir / name, json.dumps(stamped(doc, "sweep_index"), indent=2, default=str))
    lines = ["| job | status | exit | run directory | overrides |", "|---:|---|---:|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['job']} | {r['status']} | {'' if r['exit_code'] is None else r['exit_code']} | "
            f"{r['run_dir'] or '-'} | {' '.join(r['overrides'])} |"
        )
    if engines:
        lines += ["", "| engine | model | roles | points | starts |", "|---|---|---|---|---:|"]
        lines += [
            f"| {e['id']} | {e['model']} | {', '.join(e['roles'])} | {' '.join(f'#{n}' for n in e['points'])} "
            f"| {e['starts']} |"
            for e in engines
        ]
    atomic_write(sweep_dir / name.replace(".json", ".md"), "\n".join(lines) + "\n")
    return sweep_dir / name


def read_index(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every point row of a sweep folder's index files (one per shard when sharded); [] if there is none."""
    rows: list[dict[str, Any]] = []
    for path in sorted(Path(sweep_dir).glob("index*.json")):
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise InputError(path, "runs", f"cannot read the sweep index: {exc}".splitlines()[0]) from None
        if not isinstance(doc, dict) or doc.get("kind") != "ncp-sweep" or not isinstance(doc.get("points"), list):
            raise InputError(path, "runs", "not a sweep index (kind ncp-sweep with a list of points)")
        check_version(path, doc, "sweep_index")
        rows += [r for r in doc["points"] if isinstance(r, dict)]
    return rows


def read_rows(path: Path) -> list[dict[str, Any]] | None:
    """A sweep index's rows, None when unreadable (the launcher then writes a new one); one of a newer
    rig's format is refused (`NewerFormat`), never overwritten."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    check_version(path, doc, "sweep_index")
    return [r for r in doc.get("points", []) if isinstance(r, dict)]
