"""The one entry point behind `python run.py`, the `ncp-local` console script (pyproject's
[project.scripts]) and `python -m ncp_local`; and the submitter's, behind `python slurm/submit.py` in a
clone and the `ncp-local-submit` console script.

Only the exit codes and the closed-output check (the standard library's only) are imported up front:
every import the start-up makes (Hydra, the command line) is inside the guard, so a Ctrl-C during any
of them ends in the rig's one line, not a traceback.

A closed output (`ncp-local mode=status | head -1`) is decided here, for every mode and launcher: the
reader chose to stop reading, so the process ends quietly with EXIT_CLOSED_PIPE, as a shell tool killed
by SIGPIPE does. Python's default SIGPIPE handling is kept: restoring SIGPIPE's own would also kill the
rig when an engine's endpoint closes its socket, which must end in the engine's exit code instead.
"""

import os
import sys
from collections.abc import Callable

from ncp_local.errors import OutputClosed, closed_outputs
from ncp_local.exits import EXIT_CLOSED_PIPE, EXIT_SIGNAL, INTERRUPTED_LINE


def main() -> int:
    """Runs this process's command line (`sys.argv[1:]`) and returns its exit code."""
    try:
        from ncp_local.launch.cli import main as cli_main
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
    return _until_the_reader_stops(cli_main)


def submit() -> int:
    """`ncp-local-submit [options] -- [overrides]`: slurm/submit.py, for an installed package."""
    try:
        from ncp_local.launch.submit import main as submit_main
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
    return _until_the_reader_stops(lambda: submit_main(sys.argv[1:]))


def _until_the_reader_stops(command: Callable[[], int]) -> int:
    """`command`'s exit code, or EXIT_CLOSED_PIPE, without a traceback, when its output's reader closed it."""
    try:
        code = command()
        sys.stdout.flush()  # a short output is still in the buffer: a closed pipe shows here
        return code
    except (OutputClosed, BrokenPipeError) as exc:
        closed = closed_outputs()
        if isinstance(exc, BrokenPipeError) and not closed:
            raise  # not this process's output (a socket): a bug, with its traceback
        # What is still buffered, and the interpreter's own flush at exit, go nowhere instead of failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in closed or [1]:
            os.dup2(devnull, fd)
        os.close(devnull)
        return EXIT_CLOSED_PIPE
