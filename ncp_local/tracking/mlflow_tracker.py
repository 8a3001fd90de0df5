"""MLflow: a run is an MLflow run (params: the config; tags: identity, version, label; metrics: the main
table, S(t) by step, the cost by role; artifacts: the report folder); a sweep is a parent run whose
children are its points. Written through `MlflowClient` (mlflow-skinny), by default to MLflow 3's own
default store in `dir` (the working folder): the SQLite database `mlflow.db` with the artifacts in `mlruns/`,
which `mlflow ui` and `mlflow.search_runs()` started in that folder read with no setting at all."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from ..config import TrackerCfg
from .record import RunRecord, flat

PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for a nested run
MAX_PARAM = 6000  # MLflow's longest param value
# MLflow's log_batch limits: 100 params, 1000 metrics per call.
PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000
T = TypeVar("T")


# MLflow 3's defaults (mlflow.store.tracking.DEFAULT_TRACKING_URI and its artifact root), kept in `dir`.
DATABASE, ARTIFACTS = "mlflow.db", "mlruns"


def store_dir(settings: TrackerCfg) -> Path:
    return Path(settings.dir or ".").expanduser().resolve()


def where(settings: TrackerCfg) -> str:
    """The tracking URI: `uri`, else the SQLite database in `dir` (./mlflow.db)."""
    if settings.uri:
        return settings.uri
    return f"sqlite:///{store_dir(settings) / DATABASE}"


def needs_database(settings: TrackerCfg) -> bool:
    """The store is a database (SQLAlchemy and Alembic: the `tracking` extra), not a server or file store."""
    return not settings.uri or settings.uri.split(":", 1)[0].split("+", 1)[0] in (
        "sqlite",
        "postgresql",
        "mysql",
        "mssql",
    )


def _chunks(items: Sequence[T], n: int) -> Iterable[Sequence[T]]:
    return (items[i : i + n] for i in range(0, len(items), n))


class MlflowTracker:
    name = "mlflow"

    def __init__(self, settings: TrackerCfg) -> None:
        self.where = where(settings)
        # One command that opens what was written (the run's closing line prints it).
        self.opening = f"mlflow ui --backend-store-uri {self.where}"
        artifacts = None
        if not settings.uri:
            folder = store_dir(settings)
            folder.mkdir(parents=True, exist_ok=True)
            # Named at the experiment's creation: MLflow would put them under the working folder's mlruns/.
            artifacts = (folder / ARTIFACTS).as_uri()
        elif self.where.startswith("file:"):
            # An older file store asked for by its URI: MLflow 3 keeps it in maintenance mode behind this
            # switch (set for this process only; reading it back needs the same).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            self.opening = f"MLFLOW_ALLOW_FILE_STORE=true {self.opening}"
            Path(self.where.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        from mlflow.tracking import MlflowClient

        # A new SQLite store is made by Alembic's migrations, each announced at INFO on stderr: the rig's
        # terminal keeps to its own lines (a failure is still the one warning line, track.guarded's).
        for library in ("mlflow", "alembic"):
            logging.getLogger(library).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=self.where)
        exp = self.client.get_experiment_by_name(settings.project)
        self.experiment = (
            exp.experiment_id
            if exp is not None
            else self.client.create_experiment(settings.project, artifact_location=artifacts)
        )

    def _existing(self, run_id: str | None) -> str | None:
        if run_id is None:
            return None
        try:
            self.client.get_run(run_id)
        except Exception:  # deleted or never there: start a new one
            return None
        return run_id

    def group(self, name: str, group_id: str | None) -> str:
        """The sweep's parent run (created once, found again by its id)."""
        found = self._existing(group_id)
        if found is not None:
            return found
        return str(self.client.create_run(self.experiment, run_name=name, tags={"ncp.kind": "sweep"}).info.run_id)

    def log_run(self, rec: RunRecord, run_id: str | None, group: str | None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        found = self._existing(run_id)
        tags = {**rec.tags, "ncp.kind": "run", **({PARENT_TAG: group} if group else {})}
        if found is None:
            found = str(self.client.create_run(self.experiment, run_name=rec.name, tags=tags).info.run_id)
            # Params are immutable in MLflow: logged once, when the run is made (a resume may change
            # `limit`; the config as it is now also goes in as config.json below).
            params = [Param(k, v[:MAX_PARAM]) for k, v in flat(rec.config).items()]
            for batch in _chunks(params, PARAMS_PER_BATCH):
                self.client.log_batch(found, params=list(batch))
        else:
            self.client.update_run(found, status="RUNNING")
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in rec.metrics.items()]
        # S(t) as one metric by step t (MLflow plots it), with its band.
        for t, s, lo, hi in rec.survival:
            metrics += [Metric(n, v, now, t) for n, v in (("survival", s), ("survival_lo", lo), ("survival_hi", hi))]
        metrics += [Metric(f"cost.{role}.{k}", v, now, 0) for role, row in rec.cost.items() for k, v in row.items()]
        for mbatch in _chunks(metrics, METRICS_PER_BATCH):
            self.client.log_batch(found, metrics=list(mbatch))
        self.client.log_batch(found, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.log_dict(found, rec.config, "config.json")
        # The tables as JSON artifacts, rewritten by each logging (MLflow's log_table would append a
        # resumed run's rows to the first logging's).
        self.client.log_dict(
            found,
            {"columns": ["turns_played", "S", "lo", "hi"], "data": [list(r) for r in rec.survival]},
            "survival.json",
        )
        self.client.log_dict(found, rec.cost, "cost_by_role.json")
        for name, text in rec.files.items():
            self.client.log_text(found, text, name)
        if rec.report is not None:
            self.client.log_artifacts(found, str(rec.report), "report")
        self.client.set_terminated(found)
        return found

    def close_group(self, group_id: str) -> None:
        self.client.set_terminated(group_id)
