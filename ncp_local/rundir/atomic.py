"""Files written whole or not at all, and a full disk named as such.

A file is written to a temp file beside it, fsynced and renamed over the old one, so a kill or a
full disk at any moment leaves either the old or the new file, never half of one. Files are created
with mode 0666 and the umask decides (no `mkstemp`, whose 0600 would hide results from a team on a
shared disk). Running out of space (or quota) raises `DiskFull`, which says that everything written
so far is whole and how to go on.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from pathlib import Path

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """No space left (or quota) while writing: nothing half-written is left behind."""

    def __init__(self, where: Path, detail: str = "") -> None:
        self.where, self.detail = where, detail
        super().__init__(
            f"{where}: disk full{f' ({detail})' if detail else ''}; every file written so far "
            "is whole: free space, then re-run the same command to resume"
        )


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


# A slow filesystem for the bench (modes=bench's rig way): seconds added to every fsync the rig makes.
# Set by the bench before it plays; 0 for every run.
FSYNC_DELAY_S = float(os.environ.get("NCP_FSYNC_DELAY_S", "0") or 0)


def fsync(fd: int) -> None:
    """Every fsync the run directory makes (atomic writes, the turn logs' group commits)."""
    os.fsync(fd)
    if FSYNC_DELAY_S > 0:
        time.sleep(FSYNC_DELAY_S)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write whole or not at all; readable as the umask says. A full disk raises DiskFull."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                # 0o666: the process umask applies, as for any file the user creates.
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                continue
        try:
            write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(path.parent, f"writing {path.name}: {exc.strerror}") from None
        raise
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
