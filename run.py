"""ncp-local entry point: `python run.py [group=option ...] [key=value ...]`.

The same command as the installed `ncp-local` (both call `ncp_local.entry.main`); `python run.py
--help` lists the modes. vLLM's CPU build starts its engine in a spawned process, which re-imports
this file: hence the `__main__` guard and nothing at import.
"""

import sys

if __name__ == "__main__":
    from ncp_local.entry import main

    sys.exit(main())
