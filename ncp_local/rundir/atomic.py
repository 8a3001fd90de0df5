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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

# A test and bench hook, never a setting of a run: every fsync the rig makes also waits this long, as
# on a slow (network) filesystem. `NCP_FSYNC_DELAY_S` sets it for a whole process; `fsync_delay` for a
# block (mode=bench's rig-alone way).
_delay_s = float(os.environ.get("NCP_FSYNC_DELAY_S") or 0.0)


def fsync(fd: int) -> None:
    """The one place the rig makes a file durable (every writer calls it), with the injected delay."""
    os.fsync(fd)
    if _delay_s > 0:
        time.sleep(_delay_s)  # blocks the calling thread, as a slow fsync does


@contextmanager
def fsync_delay(seconds: float) -> Iterator[None]:
    """Every fsync in the block waits `seconds` more (a slow filesystem, for benches and tests)."""
    global _delay_s
    before, _delay_s = _delay_s, seconds
    try:
        yield
    finally:
        _delay_s = before


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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


@dataclass
class Staged:
    """A file's new bytes written to a temp file beside it: not yet durable (`fd` still open for the
    fsync) nor in place (`land`). Written files are made durable side by side, then landed in order."""

    path: Path
    tmp: Path | None
    fd: int | None

    def land(self) -> None:
        """Close the temp file and rename it over the file (after its fsync)."""
        self._close()
        assert self.tmp is not None
        os.replace(self.tmp, self.path)
        self.tmp = None

    def drop(self) -> None:
        """Close and remove the temp file if it was not landed (a failed or abandoned write)."""
        self._close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
            self.tmp = None

    def _close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def stage(path: Path, text: str | bytes) -> Staged:
    """Write `text` to a new temp file beside `path` (mode 0666 less the umask). A full disk raises
    DiskFull and leaves nothing behind."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    staged: Staged | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                # 0o666: the process umask applies, as for any file the user creates.
                staged = Staged(path, tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                break
            except FileExistsError:
                continue
        assert staged.fd is not None
        write_all(staged.fd, data)
        return staged
    except BaseException as exc:
        if staged is not None:
            staged.drop()
        _raise_if_full(exc, path)
        raise


def fsync_dir(path: Path) -> None:
    """Make the names in directory `path` durable (a rename, an unlink). A filesystem that cannot fsync a
    directory (EINVAL) keeps them as it keeps them."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write whole or not at all; readable as the umask says. A full disk raises DiskFull."""
    staged = stage(path, text)
    try:
        assert staged.fd is not None
        fsync(staged.fd)
        staged.land()
    except OSError as exc:
        _raise_if_full(exc, staged.path)
        raise
    finally:
        staged.drop()


def _raise_if_full(exc: BaseException, path: Path) -> None:
    """A full disk while writing `path`, raised as DiskFull (named by its folder)."""
    if isinstance(exc, OSError) and is_disk_full(exc):
        raise DiskFull(path.parent, f"writing {path.name}: {exc.strerror}") from None
