"""`mode=run` (the default): play episodes into a run directory; the same command resumes. With
`tracker=mlflow|wandb`, the finished run is logged to the tracker too (ncp_local/tracking)."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..execution.life import run_one
from ..tracking import require, track_run


def main(cfg: RunConfig) -> int:
    require(cfg.tracker)  # a tracker that is not installed is refused before anything starts

    def track(out: Path) -> None:
        track_run(cfg, out)

    return run_one(cfg, on_finished=track if cfg.tracker.name != "none" else None)
