"""ncp-local entry point: `python run.py [group=option ...] [key=value ...]`.

The command line itself is `ncp_local.launch.cli.main`; `python run.py --help`
lists the modes. vLLM's CPU build starts its engine in a spawned process,
which re-imports this file: hence the `__main__` guard and nothing at import.
"""

import sys

if __name__ == "__main__":
    from ncp_local.exits import EXIT_SIGNAL, INTERRUPTED_LINE

    try:  # every import the start-up makes is inside: a Ctrl-C during any is one line
        from ncp_local.launch.cli import main
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        sys.exit(EXIT_SIGNAL["SIGINT"])
    sys.exit(main())
