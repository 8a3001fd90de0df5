"""A quiet terminal: engine and library output goes to a log file, the rig's own lines to the terminal.

vLLM's CPU build runs its engine core in a spawned process that writes to the file descriptors it
inherits, and Triton, torch and the C++ parts print below Python. Redirecting Python's `logging`
alone therefore leaves most of it on the terminal. So, while a mode runs, file descriptors 1 and 2
point at the log file (everything the engine's processes and libraries write lands there), and
`sys.stdout` / `sys.stderr` are rebuilt on saved copies of the terminal's descriptors, so the
rig's `print` (the progress bar, tables, `error:` lines) still reaches the terminal, a pipe or a
Slurm log exactly as before. Python loggers that a library pointed at the terminal streams are
moved to the log as well, as are warnings and the last-resort logging handler.

The log starts in a temporary file and moves to its place once a mode knows it (`place`): a run
writes `<run dir>/engine.log`, a batched sweep `<sweep folder>/engine.log`, a re-audit its own
directory. A mode that never places it (plan, lint, report, ...) leaves it in
`<cache>/logs/<mode>.log` when anything was written, else nowhere. `verbose=true` turns all of
this off: the engine's lines stream to the terminal as they always did.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..engines.embedded import cache_root

# Lines of a failed engine start worth showing under its `error:` line.
RELEVANT = re.compile(
    r"error|exception|traceback|fatal|killed|out of memory|not enough|insufficient|cannot|failed", re.IGNORECASE
)
TAIL_LINES = 8
TAIL_CHARS = 300


def cache_logs() -> Path:
    """Where a mode without a folder of its own leaves its log (beside the embedded model's cache)."""
    return cache_root() / "logs"


@dataclass
class _Active:
    path: Path  # where the log is now
    temporary: bool  # still the start-up file (never placed)
    fd: int  # the log file, open for appending; dup'ed onto 1 and 2
    saved: tuple[int, int]  # the terminal's descriptors 1 and 2, kept for the rig's own lines
    streams: tuple[TextIO, TextIO]  # sys.stdout, sys.stderr as they were
    terminal: tuple[TextIO, TextIO]  # what sys.stdout / sys.stderr are while the log is active
    made: list[TextIO] = field(default_factory=list)  # the terminal streams this module opened
    showwarning: Any = None
    last_resort: Any = None


_ACTIVE: _Active | None = None
_LAST: Path | None = None  # the log of the last quiet stretch, for a failure reported after it ended


def current() -> Path | None:
    """The log file engine output goes to now (None when the terminal is not quiet)."""
    return _ACTIVE.path if _ACTIVE is not None else None


def last() -> Path | None:
    """The log in use now, else the one of the last quiet stretch."""
    return current() or _LAST


def _flush() -> None:
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if s is not None:
                s.flush()


def _on_fd(stream: TextIO, fd: int) -> bool:
    """Whether `stream` writes to descriptor `fd` (a capture object in tests does not)."""
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


def _terminal_side(stream: TextIO, fd: int, saved: int, made: list[TextIO]) -> TextIO:
    """The stream the rig prints to while `fd` points at the log: `stream` itself unless it writes to `fd`."""
    if not _on_fd(stream, fd):
        return stream
    # Buffered: a raw FileIO may write part of a line to a pipe and the wrapper would drop the rest.
    out = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(saved, "w", closefd=False)),
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors=getattr(stream, "errors", None) or "backslashreplace",
        line_buffering=True,
        write_through=True,
    )
    made.append(out)
    return out


def _loggers() -> list[logging.Logger]:
    found = [logging.getLogger()]
    found += [lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]
    return found


def _move_handlers(away_from: tuple[TextIO, ...], to: TextIO) -> None:
    """Point every stream handler that writes to one of `away_from` at `to` (libraries configure
    their handlers with whatever sys.stdout / sys.stderr were at the time)."""
    for lg in _loggers():
        for h in list(lg.handlers):
            if (
                isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and any(h.stream is s for s in away_from)
            ):
                with contextlib.suppress(AttributeError):  # a handler whose stream is a read-only property
                    h.setStream(to)


def settle() -> None:
    """Move library log handlers created since the last call (an engine start imports vLLM,
    transformers, ...) from the terminal to the log. Cheap; a no-op when not quiet."""
    a = _ACTIVE
    if a is not None and sys.__stderr__ is not None:
        _move_handlers(tuple(a.made), sys.__stderr__)


def _to_log_showwarning(
    message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: str | None = None
) -> None:
    with contextlib.suppress(Exception):
        assert sys.__stderr__ is not None
        sys.__stderr__.write(warnings.formatwarning(message, category, filename, lineno, line))
        sys.__stderr__.flush()


def _open(path: Path, truncate: bool = False) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
    return os.open(path, flags, 0o666)


@contextlib.contextmanager
def quiet(verbose: bool, mode: str) -> Iterator[None]:
    """While the block runs, engine and library output goes to the log (module docstring).

    Nested use is a no-op (a batched sweep runs other modes' points inside its own stretch).
    """
    global _ACTIVE, _LAST
    if verbose or _ACTIVE is not None:
        yield
        return
    _flush()
    # vLLM's log handler takes the stream named here when vllm is first imported; sys.stdout would be
    # the terminal side by then, sys.__stdout__ is descriptor 1: the log (in the engine core too).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.__stdout__")
    try:
        tmp_fd, tmp_name = tempfile.mkstemp(prefix=f"ncp-{mode}-", suffix=".log")
    except OSError:
        # No usable temporary directory (a read-only root, as an unprivileged user can meet it): run
        # unquieted rather than fail here, so the destination checks that come next say what is wrong
        # in their one line (an unwritable out_dir), instead of a traceback from this file.
        yield
        return
    saved = (os.dup(1), os.dup(2))
    made: list[TextIO] = []
    streams = (sys.stdout, sys.stderr)
    terminal = (_terminal_side(sys.stdout, 1, saved[0], made), _terminal_side(sys.stderr, 2, saved[1], made))
    a = _Active(Path(tmp_name), True, tmp_fd, saved, streams, terminal, made)
    os.dup2(tmp_fd, 1)
    os.dup2(tmp_fd, 2)
    sys.stdout, sys.stderr = terminal
    a.showwarning, warnings.showwarning = warnings.showwarning, _to_log_showwarning
    a.last_resort = logging.lastResort
    logging.lastResort = logging.StreamHandler(sys.__stderr__)
    logging.lastResort.setLevel(logging.WARNING)
    _ACTIVE = a
    settle()
    try:
        yield
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        sys.stdout, sys.stderr = streams
        warnings.showwarning = a.showwarning
        logging.lastResort = a.last_resort
        # Handlers moved to sys.__stderr__ write to the terminal again now; none may keep a stream closed below.
        if sys.__stderr__ is not None:
            _move_handlers(tuple(made), sys.__stderr__)
        for s in made:
            with contextlib.suppress(Exception):
                s.close()
        for fd in saved:
            os.close(fd)
        os.close(a.fd)
        _ACTIVE = None
        _LAST = _finish(a, mode)


def _finish(a: _Active, mode: str) -> Path | None:
    """The log's final place: where a mode put it, else `<cache>/logs/<mode>.log` (nothing when empty)."""
    if not a.temporary:
        return a.path
    try:
        if a.path.stat().st_size == 0:
            a.path.unlink()
            return None
        dest = cache_logs() / f"{mode}.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(a.path), dest)
        return dest
    except OSError:
        return a.path if a.path.exists() else None


def place(path: Path) -> None:
    """From now on the log is `path` (appended to; what was logged before is moved there)."""
    a = _ACTIVE
    if a is None or (not a.temporary and a.path == path):
        return
    _flush()
    try:
        fd = _open(path)
    except OSError:
        return  # an unwritable place: the log stays where it is (the run itself reports the folder)
    if a.temporary:
        with contextlib.suppress(OSError), open(a.path, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
            shutil.copyfileobj(src, dst)
        with contextlib.suppress(OSError):
            a.path.unlink()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(a.fd)
    a.fd, a.path, a.temporary = fd, path, False
    settle()


def tail(path: Path | None = None, n: int = TAIL_LINES) -> list[str]:
    """The last lines of the log that say what went wrong (errors, tracebacks), else its last lines."""
    path = path or last()
    if path is None:
        return []
    _flush()
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256_000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    picked = [ln for ln in lines if RELEVANT.search(ln)][-n:] or lines[-n:]
    return [ln if len(ln) <= TAIL_CHARS else ln[: TAIL_CHARS - 3] + "..." for ln in picked]


def failure_lines(path: Path | None = None) -> list[str]:
    """What follows an engine failure's `error:` line: where the log is and its last relevant lines."""
    path = path or last()
    if path is None:
        return []
    found = tail(path)
    if not found:
        return []
    return [f"  last lines of {path}:", *(f"  | {ln}" for ln in found)]
