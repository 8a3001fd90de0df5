"""Weights & Biases: a run is a W&B run (config: the run's config and identity; summary and history: the
main table and the cost by role; S(t) as a table and a line plot; the report folder as an artifact); a
sweep is one W&B group. Offline by default: the run files stay under `dir` until `wandb sync`."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import TrackerCfg
from .record import RunRecord


def where(settings: TrackerCfg) -> str:
    """Where the run files go (`dir`, ./wandb), and the mode."""
    return f"{Path(settings.dir or 'wandb').expanduser().resolve()} ({settings.mode})"


class WandbTracker:
    name = "wandb"

    def __init__(self, settings: TrackerCfg) -> None:
        self.settings = settings
        self.where = where(settings)
        self.dir = Path(settings.dir or "wandb").expanduser().resolve()
        self.opening = f"wandb sync {self.dir}" if settings.mode == "offline" else "its page on wandb.ai"
        # W&B falls back to a temporary folder when `dir` cannot be written; a run logged there would be
        # lost, so a folder that cannot be made or written fails here instead.
        self.dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise PermissionError(f"{self.dir}: cannot be written")
        os.environ.setdefault("WANDB_SILENT", "true")  # no banner lines on the rig's terminal

    def group(self, name: str, group_id: str | None) -> str:
        """A W&B group is a name on each of its runs: the sweep's, kept so a re-run joins it."""
        return group_id or name

    def log_run(self, rec: RunRecord, run_id: str | None, group: str | None) -> str:
        import wandb

        s = self.settings
        run = wandb.init(
            project=s.project,
            entity=s.entity,
            dir=str(self.dir),
            mode=s.mode,
            id=run_id,
            resume="allow" if run_id else None,
            name=rec.name,
            group=group,
            job_type="point" if group else "run",
            config={**rec.config, "ncp": rec.tags},
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False),
        )
        try:
            run.config.update({**rec.config, "ncp": rec.tags}, allow_val_change=True)
            cost = {f"cost/{role}/{k}": v for role, fields in rec.cost.items() for k, v in fields.items()}
            survival = wandb.Table(columns=["turns_played", "S", "lo", "hi"], data=[list(r) for r in rec.survival])
            costs = wandb.Table(
                columns=["role", *next(iter(rec.cost.values()), {})],
                data=[[role, *fields.values()] for role, fields in rec.cost.items()],
            )
            tables = {
                "survival": survival,
                "survival_plot": wandb.plot.line(survival, "turns_played", "S", title="S(t)"),
                "cost_by_role": costs,
            }
            run.log({**rec.metrics, **cost, **(tables if rec.survival else {})})  # a plant directory has none
            # The summary is what a run shows and what is compared: the figures of this (latest) logging.
            run.summary.update({**rec.metrics, **cost})
            if rec.report is not None:
                art = wandb.Artifact(f"report-{rec.key}", type="report")
                art.add_dir(str(rec.report))
                run.log_artifact(art)
            for name, text in rec.files.items():
                path = Path(run.dir) / name
                path.write_text(text)
            return str(run.id)
        finally:
            run.finish()

    def close_group(self, group_id: str) -> None:
        """Nothing to close: a W&B group is the name on its runs."""


def run_files(folder: Path, run_id: str) -> list[Path]:
    """The offline run files of a run under `tracker.dir` (one per time it was logged: a resume adds one),
    oldest first."""
    return sorted((Path(folder) / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
