"""Where the rig's own folders lie: `conf/` (Hydra's configs), `prompts/` (the default prompt pack) and
`specs/` (the `local` dataset).

They stay at the top of the repository, where a reader of a clone looks for them; a wheel carries
them inside the package (`ncp_local/conf`, ...: setup.py maps them there), since an installed
package has no repository around it. So the root is the package's own folder when it holds `conf/`
(a wheel install) and the folder above it otherwise (a clone, run with `python run.py` or installed
editable). The package's copy wins: `site-packages/conf` may belong to some other distribution.

Constants and paths only, importing nothing of the rig: the protocol (the bottom layer) reads
PROMPTS_DIR from here.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The three folders a wheel carries (setup.py reads this tuple to map them into the package).
BUNDLED = ("conf", "prompts", "specs")
ROOT = PACKAGE_DIR if (PACKAGE_DIR / "conf").is_dir() else PACKAGE_DIR.parent
INSTALLED = ROOT == PACKAGE_DIR  # a wheel install: no clone around the package (no git, no slurm/ scripts)
CONF_DIR = ROOT / "conf"
PROMPTS_DIR = ROOT / "prompts"
