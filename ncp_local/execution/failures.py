"""The one mapping from a failure to its exit code and `error:` line, used by every entry point
(run.py's modes, both sweep launchers, the Slurm submitter, merge)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..engines.base import EngineDead
from ..errors import InputError
from ..exits import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_ENGINE_DEAD, EXIT_SYSTEMATIC
from ..rundir.atomic import DiskFull
from ..rundir.store import RunLocked, RunMismatch
from . import engine_log
from .calls import SystematicFailure


@dataclass(frozen=True)
class Exit:
    code: int
    message: str  # the `error:` line's text, without the prefix
    detail: tuple[str, ...] = ()  # lines under it: an engine failure's last relevant lines of engine.log

    def print(self) -> None:
        """The `error:` line, then its detail, on stderr."""
        print(f"error: {self.message}", file=sys.stderr)
        for line in self.detail:
            print(line, file=sys.stderr)


def exit_for(exc: BaseException, resume: str = "") -> Exit | None:
    """The exit a known failure ends in; None for anything else (a bug: let its traceback show).

    `resume`: what the resume advice says after an engine death or a systematic stop (e.g. where
    the committed turns are); without it, the bare messages.
    """
    if isinstance(exc, (InputError, RunLocked, RunMismatch)):
        return Exit(EXIT_BAD_INPUT, str(exc))
    if isinstance(exc, DiskFull):
        return Exit(EXIT_DISK_FULL, str(exc))
    if isinstance(exc, EngineDead):
        return Exit(
            EXIT_ENGINE_DEAD,
            f"engine died: {exc}" + (f"; {resume}" if resume else ""),
            tuple(engine_log.failure_lines()),
        )
    if isinstance(exc, SystematicFailure):
        return Exit(EXIT_SYSTEMATIC, f"{exc}; the run stopped early (fix the cause, then re-run)")
    return None
