"""Where the rig may write: a folder it can create or write into, and a place fit for a run directory.

Checked before anything is written, so a bad `out_dir` (the filesystem root, a file, a folder of
something else, a folder inside another run, a read-only place) is refused in one line naming the
setting, instead of failing half-way through a run. `check_outputs` checks every output key a mode
names (modes/_registry.py lists them) at the entry, before any model loads; `refused_write` turns a
write the system refused later anyway (a mount gone read-only mid-run) into the same one line.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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
    STATUS,
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
    refused = _probe(existing)
    if refused is not None:
        # os.access says yes to root everywhere and knows nothing of pseudo-filesystems (/proc, /sys)
        # or of a mount that refuses writes: only a real file tells.
        raise InputError(
            path, field, f"cannot be written: {existing} refuses a new file ({refused}); give a folder you can write"
        )
    return resolved


def check_file_destination(path: str | Path, field: str) -> Path:
    """A file the rig is about to write: not a folder, and its folder one `check_destination` accepts."""
    resolved = Path(path).expanduser().resolve()
    if resolved.is_dir():
        raise InputError(path, field, "is a directory; give a file name")
    try:
        check_destination(resolved.parent, field)
    except InputError as exc:
        raise InputError(path, field, exc.message) from None  # named as given, not its folder
    return resolved


def _probe(folder: Path) -> str | None:
    """Why a new file cannot be made in `folder` (the system's reason), or None: one is made and removed."""
    probe = folder / f".ncp-write-check-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    probe.unlink(missing_ok=True)
    return None


# Output keys that name a file (the others name a folder).
FILE_KEYS = frozenset({"submission"})


def _value(raw: Mapping[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def check_outputs(keys: Iterable[str], raw: Mapping[str, Any]) -> list[tuple[str, Path]]:
    """Every output key of `keys` the config sets, checked as a place to write (a file's folder for
    FILE_KEYS); the (key, resolved path) pairs. The first that cannot be written is an InputError
    naming its key. A key left null is the mode's default, checked where the mode works it out."""
    named: list[tuple[str, Path]] = []
    for key in keys:
        value = _value(raw, key)
        if value in (None, ""):
            continue
        check = check_file_destination if key in FILE_KEYS else check_destination
        named.append((key, check(str(value), key)))
    return named


# What a refused write looks like: no permission, a read-only mount, a path through a file. Not a
# missing file (a read's failure as much as a write's) nor a full disk (atomic.DiskFull, exit 4).
_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR})


def refused_write(exc: BaseException, named: Iterable[tuple[str, Path]]) -> InputError | None:
    """A write refused at or under one of the `named` outputs (see `check_outputs`) as the one-line
    InputError naming its key; None for any other failure."""
    if not isinstance(exc, OSError) or exc.errno not in _REFUSED or not exc.filename:
        return None
    where = Path(os.fsdecode(exc.filename)).expanduser().resolve()
    for key, path in named:
        # A file key's file, or the temporary file its atomic write makes beside it (rundir/atomic.py).
        beside = key in FILE_KEYS and where.parent == path.parent and where.name.startswith(f".{path.name}.")
        if where == path or path in where.parents or beside:
            return InputError(where, key, f"cannot be written ({exc.strerror}); give a place you can write")
    return None


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
        bookkeeping = {LOCK, CALLS, ENGINE_LOG, STATUS, CHECKPOINTS, QUARANTINE, SUBMIT_STATE, SLURM_LOGS}
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
