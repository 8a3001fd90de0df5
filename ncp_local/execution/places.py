"""Where the rig may write: a folder it can create or write into, and a place fit for a run directory.

Checked before anything is written, so a bad `out_dir` (the filesystem root, a file, a folder of
something else, a folder inside another run, a read-only place) is refused in one line naming the
setting, instead of failing half-way through a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from .layout import (
    CALLS,
    CHECKPOINTS,
    ENGINE_LOG,
    LOCK,
    MANIFEST,
    QUARANTINE,
    RESULTS,
    RUN_FILES,
    RUN_FOLDERS,
    RUN_MARKERS,
    SLURM_LOGS,
    SUBMIT_STATE,
)


def check_destination(path: str | Path, field: str) -> Path:
    """A folder the rig is about to write into: a folder or nothing yet, and writable (its nearest
    existing ancestor when it does not exist yet). The resolved path; an InputError naming `field`."""
    resolved = Path(path).expanduser().resolve()
    if resolved.exists() and not resolved.is_dir():
        raise InputError(path, field, "exists and is not a directory; give a folder (new or existing)")
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(path, field, f"{existing} is a file, so no folder can be made under it; give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == resolved else f" ({existing} is the nearest existing folder)"
        raise InputError(
            path, field, f"cannot be written{where}: read-only or no permission; give a folder you can write"
        )
    return resolved


def check_place(root: Path) -> None:
    """Where a run may write: never `/`, a folder of something else, inside another run, a place that
    cannot be written, or a run directory whose parts are of the wrong kind."""
    resolved = Path(root).expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise InputError(root, "out_dir", "the filesystem root is never a run directory")
    for parent in resolved.parents:
        if (parent / MANIFEST).is_file() and (parent / RESULTS).is_dir():
            raise InputError(
                root,
                "out_dir",
                f"inside the run directory {parent} (a run never writes into another; use a folder of its own)",
            )
    if resolved.is_dir():
        names = {p.name for p in resolved.iterdir()}
        # The submitter's record and its tasks' logs come before the first task writes anything (and a served
        # role's endpoint file before its tasks start).
        bookkeeping = {LOCK, CALLS, ENGINE_LOG, CHECKPOINTS, QUARANTINE, SUBMIT_STATE, SLURM_LOGS}
        served = {n for n in names if n.startswith("endpoint-")}
        if names and not names.intersection(RUN_MARKERS) and not names - served <= bookkeeping:
            shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise InputError(
                root, "out_dir", f"not empty and not a run directory (holds {shown}); use an empty or new folder"
            )
        for name in RUN_FOLDERS:
            if (resolved / name).exists() and not (resolved / name).is_dir():
                raise InputError(
                    Path(root) / name,
                    "out_dir",
                    "a file where the run keeps a folder; move it away (a run never deletes it), then re-run",
                )
        for name in RUN_FILES:
            if (resolved / name).is_dir():
                raise InputError(
                    Path(root) / name,
                    "out_dir",
                    "a folder where the run keeps a file; move it away (a run never deletes it), then re-run",
                )
    elif resolved.exists():
        raise InputError(root, "out_dir", "exists and is not a directory")
    check_destination(root, "out_dir")
