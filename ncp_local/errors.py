"""The rig-wide "bad input" error, how user input is shown in a one-line message, and a closed output.

Every layer raises `InputError` for input it refuses (a spec, a config key, a
prompt pack, a run directory): it names the file and the field, and every entry
point turns it into one `error:` line and exit code 2 (`execution/exits.py`).
"""

from __future__ import annotations

import contextlib
import reprlib
import select
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxtuple, _SHOW.maxset = 2, 4, 4, 4, 4


def shown(value: Any, limit: int = 80) -> str:
    """A repr of user input short enough for a one-line error, whatever its size or depth."""
    text = _SHOW.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputError(ValueError):
    """Input the rig refuses before anything runs; names the file (or `config`) and the field."""

    def __init__(self, file: str | Path, field: str, message: str) -> None:
        self.file = str(file)
        self.field = field
        self.message = message
        super().__init__(f"{self.file}: {field}: {message}" if field else f"{self.file}: {message}")


class OutputClosed(BaseException):
    """The reader of this process's output closed it (`ncp-local mode=status | head -1`): its choice, not
    a failure. A BaseException, as KeyboardInterrupt is, so that no `except Exception` on its way up
    (Hydra's own turns any into a traceback and exit 1) stops it before the entry, which ends the
    process quietly with EXIT_CLOSED_PIPE (ncp_local/entry.py)."""


def closed_outputs() -> list[int]:
    """The descriptors of sys.stdout and sys.stderr that are pipes whose reader has gone (poll reports an
    error on the write end): a BrokenPipeError from a printed line has one, one from a socket (an engine's
    endpoint) none. The streams' own descriptors: while engine output goes to its log, they are not 1 and 2."""
    fds = set()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream with no descriptor (a capture in tests)
            fds.add(stream.fileno())
    try:
        poll = select.poll()
    except AttributeError:  # no poll() on this platform: the caller decides without it
        return []
    for fd in fds:
        poll.register(fd, select.POLLOUT)
    return sorted(fd for fd, events in poll.poll(0) if events & select.POLLERR)


@contextlib.contextmanager
def reader_may_close() -> Iterator[None]:
    """A BrokenPipeError of this process's own output leaves the block as OutputClosed (one from a socket
    stays what it is). Around what Hydra calls: every mode's entry and the batched sweep."""
    try:
        yield
    except BrokenPipeError as exc:
        if closed_outputs():
            raise OutputClosed from exc
        raise
