"""matplotlib made importable where it has no folder to write.

matplotlib writes a config and cache folder as it imports: `$MPLCONFIGDIR`, else
`~/.config/matplotlib` and `~/.cache/matplotlib`, else a new temporary folder; with none writable
(a read-only home on a node with no usable temporary directory) the import raises OSError. The
report's plots import it only through `ready()`, which points `MPLCONFIGDIR` at a folder inside the
report's own folder when matplotlib found no other, so the tables and the plots are written; when even
that fails, the caller skips the plots with a warning and the tables are still written.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

# Inside the folder the plots go to: created only when matplotlib would find no other place.
FOLDER = ".matplotlib"


def ready(out: Path) -> str | None:
    """Import matplotlib (given a folder inside `out` when it would find none); None, or why it cannot be.

    Decided before the import: a failed import of matplotlib leaves it half-imported, so it is tried once.
    """
    if "matplotlib" not in sys.modules and not _has_a_folder():
        home = out / FOLDER
        if not _writable(home):
            return f"matplotlib has no writable folder, and {home} cannot be made"
        os.environ["MPLCONFIGDIR"] = str(home)
    try:
        importlib.import_module("matplotlib")
    except OSError as exc:
        return str(exc).split(";")[0]
    return None


def _has_a_folder() -> bool:
    """Whether matplotlib's own search (its config and cache folders, else a temporary one) finds one."""
    try:
        if os.environ.get("MPLCONFIGDIR"):
            folders = [Path(os.environ["MPLCONFIGDIR"])]
        else:
            home = Path.home()
            folders = [
                Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib",
                Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib",
            ]
    except RuntimeError:  # no home directory at all
        folders = []
    if folders and all(_writable(f) for f in folders):
        return True
    try:
        tempfile.gettempdir()  # raises when no temporary directory is usable
    except OSError:
        return False
    return True


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)
