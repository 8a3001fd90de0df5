"""The format version of each kind of file a run writes, and the check every reader makes.

The manifest and a sweep's index always carry `format_version`. The sealed records (results,
checkpoints, re-audit results) and the call log's lines carry it once their kind's format is past 1.
Version 1 is every format as it was when versions began (2026-12-04), so a file without the key is
version 1. That keeps the sealed records written until now, and those written in version 1 from now
on, byte for byte as they were: results are compared byte for byte across rig versions.

A rig that changes a kind's shape bumps its version here. Its writers then stamp the new version,
and its readers take both the old and the new shape. An older rig that meets the newer version
refuses in one line naming the file (exit 2), instead of misreading it or moving it to quarantine/
as damaged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError

FORMAT_KEY = "format_version"
Kind = Literal["result", "checkpoint", "reaudit", "plant", "manifest", "calls", "sweep_index"]
# The version this rig writes and the newest it reads, per kind of file.
VERSIONS: dict[Kind, int] = {
    "result": 1,  # results/<episode>.json of a run (protocol/episode.py EpisodeResult, sealed)
    # 2: checkpoints/<episode>.jsonl, a line per committed turn (rundir/turn_log.py); 1: checkpoints/
    # <episode>.json, the whole Checkpoint sealed, rewritten every turn (still read: a run resumes from it)
    "checkpoint": 2,
    "reaudit": 1,  # results/<episode>.json of a re-audit (protocol/reaudit.py ReauditResult, sealed)
    "plant": 1,  # results/<episode>.json of a plant directory (protocol/plant.py PlantResult, sealed)
    "manifest": 1,  # manifest.json (rundir/layout.py ManifestShape)
    "calls": 1,  # each line of calls.jsonl (execution/calls.py)
    "sweep_index": 1,  # a sweep folder's index.json (rundir/sweep_index.py)
}


class NewerFormat(InputError):
    """A file written by a newer rig: refused, never moved to quarantine/ as damaged."""


def version_of(data: Mapping[str, Any]) -> Any:
    return data.get(FORMAT_KEY, 1)


def check_version(path: str | Path, data: Mapping[str, Any], kind: Kind) -> None:
    """Refuse a file in a format this rig does not read (newer, or not a version at all)."""
    got = version_of(data)
    newest = VERSIONS[kind]
    if isinstance(got, bool) or not isinstance(got, int) or got < 1:
        raise NewerFormat(path, "", f"{FORMAT_KEY} {got!r} is not a format version of a {kind} file")
    if got > newest:
        raise NewerFormat(
            path,
            "",
            f"written in format {got} of a {kind} file by a newer ncp-local; this one reads up to "
            f"format {newest}: update ncp-local (git pull, then make install)",
        )


# Kinds whose files always say their version (neither sealed nor compared byte for byte).
ALWAYS_STAMPED: frozenset[Kind] = frozenset({"manifest", "sweep_index"})


def stamped(data: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """`data` with its kind's version first: always for the manifest and the sweep index, past 1 only for
    the sealed records and the call log's lines (module docstring)."""
    if kind in ALWAYS_STAMPED or VERSIONS[kind] > 1:
        return {FORMAT_KEY: VERSIONS[kind], **{k: v for k, v in data.items() if k != FORMAT_KEY}}
    return data
