"""The one entry point behind `python run.py`, the `ncp-local` console script (pyproject's
[project.scripts]) and `python -m ncp_local`; and the submitter's, behind `python slurm/submit.py` in a
clone and the `ncp-local-submit` console script.

Only the exit codes are imported up front: every import the start-up makes (Hydra, the command line)
is inside the guard, so a Ctrl-C during any of them ends in the rig's one line, not a traceback.
"""

import sys

from ncp_local.exits import EXIT_SIGNAL, INTERRUPTED_LINE


def main() -> int:
    """Runs this process's command line (`sys.argv[1:]`) and returns its exit code."""
    try:
        from ncp_local.launch.cli import main as cli_main
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
    return cli_main()


def submit() -> int:
    """`ncp-local-submit [options] -- [overrides]`: slurm/submit.py, for an installed package."""
    try:
        from ncp_local.launch.submit import main as submit_main
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
    return submit_main(sys.argv[1:])
