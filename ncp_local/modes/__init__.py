"""One module per mode, listed once in `MODES`: run.py dispatches through it, `--help`
prints it, and the docs' modes reference is generated from it. A mode is a thin entry
(`main(cfg) -> exit code`: the config typed once, its composed source in `cfg.source`) over
execution, plan and report; it never imports another mode. Adding a mode takes its module and one row in `MODES`.

The package face: `_registry` holds the table (`Mode`, `MODES`, `find`), `_dispatch` the entry
(`main`) that validates the config and runs its mode.
"""

from ._dispatch import fail, main
from ._registry import BY_NAME, MODES, Mode, find

__all__ = ["BY_NAME", "MODES", "Mode", "fail", "find", "main"]
