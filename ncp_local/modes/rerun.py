"""`mode=rerun from=DIR`: repeat a finished run from its manifest (`out_dir` defaults to `<DIR>-rerun`)."""

from __future__ import annotations

from ..config import RunConfig, validate
from ..execution.life import run_one
from ..execution.rerun import rerun_config


def main(cfg: RunConfig) -> int:
    # The finished run's own config from its manifest, found again here by content.
    again = rerun_config(cfg.source)
    return run_one(validate(again))
