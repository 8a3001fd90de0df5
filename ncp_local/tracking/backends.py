"""The tracker backends: each named by "module:class" and imported only when used (the inspect_ai and
lm-eval way with optional providers), after checking its package is installed."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Protocol

from ..config import ConfigError, TrackerCfg
from ..resources import install_hint
from .mlflow_tracker import needs_database  # the module imports MLflow only inside its tracker
from .record import RunRecord

INSTALL = f"{install_hint('tracking')} (mlflow-skinny with sqlalchemy and alembic, and wandb, pinned in pyproject.toml)"
# name -> (the package it needs, "module:class" of its backend)
BACKENDS: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow", "ncp_local.tracking.mlflow_tracker:MlflowTracker"),
    "wandb": ("wandb", "ncp_local.tracking.wandb_tracker:WandbTracker"),
}


class Tracker(Protocol):
    name: str
    where: str
    opening: str  # how a user opens what was written, printed in the run's closing line

    def group(self, name: str, group_id: str | None) -> str: ...
    def log_run(self, rec: RunRecord, run_id: str | None, group: str | None) -> str: ...
    def close_group(self, group_id: str) -> None: ...


def require(settings: TrackerCfg) -> None:
    """The tracker's package is installed (checked before a run starts: a missing one is bad input)."""
    if settings.name == "none":
        return
    package, _ = BACKENDS[settings.name]
    needed = [package]
    if settings.name == "mlflow":
        needed += ["sqlalchemy", "alembic"] if needs_database(settings) else []
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            "tracker", f"tracker={settings.name} needs {' and '.join(missing)}, which is not installed: {INSTALL}"
        )


def load_backend(settings: TrackerCfg) -> Tracker:
    module, _, cls = BACKENDS[settings.name][1].partition(":")
    made: Tracker = getattr(importlib.import_module(module), cls)(settings)
    return made
