"""The entry run.py calls: the composed config validated, its mode run, and a known failure turned into
one `error:` line and its exit code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..config import validate as validate_config  # not `validate`: that name is the mode module modes/validate.py
from ..errors import reader_may_close
from ..execution import engine_log
from ..execution.failures import exit_for
from ..exits import EXIT_BAD_INPUT
from ..rundir.places import check_outputs, refused_write
from ._registry import find


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(dcfg: DictConfig) -> int:
    """Validate the composed config, run its mode; a known failure is one `error:` line and its exit code."""
    try:
        raw: dict[str, Any] = OmegaConf.to_container(dcfg, resolve=True)  # type: ignore[assignment]
    except Exception as exc:  # interpolation errors name the key themselves
        return fail(f"config: {exc}".splitlines()[0])
    named: list[tuple[str, Path]] = []  # the output paths the config names: (key, resolved path)
    try:
        cfg = validate_config(raw)
        mode = find(cfg.mode)
        # Every output path the config names can be written, before any model loads or file is written.
        named = check_outputs(mode.writes, raw)
        # Engine and library output to engine.log, the rig's lines to the terminal (verbose=true: both);
        # output closed by its reader ends at the entry, quietly (outside: the terminal's descriptors back).
        with reader_may_close(), engine_log.quiet(cfg.verbose, mode.name):
            return mode.load()(cfg)
    except Exception as exc:
        known = exit_for(refused_write(exc, named) or exc)
        if known is None:
            raise
        known.print()
        return known.code
