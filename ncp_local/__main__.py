"""`python -m ncp_local [overrides]`: the same command as `ncp-local` and `python run.py`.

The guard matters: vLLM's CPU build starts its engine in a spawned process, which re-imports the
main module (as `__mp_main__`), and nothing may run there.
"""

import sys

if __name__ == "__main__":
    from ncp_local.entry import main

    sys.exit(main())
