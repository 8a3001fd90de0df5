"""Submit a run, or a sweep (`-m`), as a Slurm array job: task i of N runs shard i.

    python slurm/submit.py --shards N [sbatch options] -- <hydra overrides>

The submitter is `ncp_local/launch/submit.py` (its docstring and `--help` say what it does); this
script only puts the repository first on the path, so it runs from any directory with the
repository's own package, as `run.py` does.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ncp_local.entry import submit  # noqa: E402  (a closed output, Ctrl-C: as ncp-local-submit ends)
from ncp_local.launch.submit import main  # noqa: E402, F401  (the tests call it in their own process)

if __name__ == "__main__":
    sys.exit(submit())
