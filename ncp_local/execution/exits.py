"""The exit codes of every command, and the one mapping from a failure to its code and line
(README "Exit codes" lists them). Every entry point (run.py, both sweep launchers, the Slurm
submitter, merge) turns an exception into its exit this way."""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.base import EngineDead
from ..errors import InputError
from .calls import SystematicFailure
from .store import DiskFull, RunLocked, RunMismatch

EXIT_OK = 0
EXIT_FAILED = 1  # mode=build with failed specs, mode=plan overflow, sbatch failed, or a bug (with its traceback)
EXIT_BAD_INPUT = 2  # a config, override, spec, pack, model path or run directory refused before anything ran
EXIT_ENGINE_DEAD = 3  # an engine died or failed to start: the same command resumes
EXIT_DISK_FULL = 4  # disk full or quota while writing; every file written is whole
# The run failed systematically: a stage's first calls failed the same engine-side way in every
# episode tried (stopped early), or most finished episodes are invalid for one reason.
EXIT_SYSTEMATIC = 5
# A sweep (either launcher) ran every point it could and some failed (each said why).
EXIT_SWEEP_FAILED = 6
# 128 + signal number, as a shell reports it; Slurm requeues a preempted task.
EXIT_SIGNAL = {"SIGTERM": 143, "SIGINT": 130}
STOPPED_BY_SIGNAL = tuple(EXIT_SIGNAL.values())


@dataclass(frozen=True)
class Exit:
    code: int
    message: str  # the `error:` line's text, without the prefix


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
        return Exit(EXIT_ENGINE_DEAD, f"engine died: {exc}" + (f"; {resume}" if resume else ""))
    if isinstance(exc, SystematicFailure):
        return Exit(EXIT_SYSTEMATIC, f"{exc}; the run stopped early (fix the cause, then re-run)")
    return None
