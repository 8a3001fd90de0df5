"""Experiment trackers: a finished run logged to MLflow or Weights & Biases besides its run directory.

`tracker=mlflow` / `tracker=wandb` (conf/tracker/, the `tracking` extra). After a run (or a batched
sweep) has finished and written its results, its figures (`record.py`: the report's main table with its
intervals, S(t), the cost by role, the report folder) go to the tracker; the tracker's run id is kept in
the run directory (`tracker.json`), so a resumed run continues the same tracker run, and a sweep's group
or parent run in the sweep folder. A tracker never fails or holds up the evaluation: everything it does
happens after the results are on disk, in a thread given `tracker.timeout_s` at most, and any failure is
one `warning:` line; the run's exit code and results are what they would have been without it.

Each backend is named by "module:class" and imported only when used (the inspect_ai and lm-eval way with
optional providers), after checking its package is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..config import ConfigError, RunConfig, TrackerCfg
from . import state
from .record import RunRecord, run_record

INSTALL = "pip install -e '.[tracking]' (mlflow-skinny and wandb, pinned in pyproject.toml)"
# name -> (the package it needs, "module:class" of its backend)
BACKENDS: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow", "ncp_local.tracking.mlflow_tracker:MlflowTracker"),
    "wandb": ("wandb", "ncp_local.tracking.wandb_tracker:WandbTracker"),
}

__all__ = ["BACKENDS", "Point", "require", "track_run", "track_sweep"]


class Tracker(Protocol):
    name: str
    where: str

    def group(self, name: str, group_id: str | None) -> str: ...
    def log_run(self, rec: RunRecord, run_id: str | None, group: str | None) -> str: ...
    def close_group(self, group_id: str) -> None: ...


@dataclass(frozen=True)
class Point:
    """A finished sweep point to log: its config, run directory and name (the overrides that tell it apart)."""

    cfg: RunConfig
    run_dir: Path
    name: str


def require(settings: TrackerCfg) -> None:
    """The tracker's package is installed (checked before a run starts: a missing one is bad input)."""
    if settings.name == "none":
        return
    package, _ = BACKENDS[settings.name]
    if importlib.util.find_spec(package) is None:
        raise ConfigError("tracker", f"tracker={settings.name} needs {package}, which is not installed: {INSTALL}")


def _backend(settings: TrackerCfg) -> Tracker:
    module, _, cls = BACKENDS[settings.name][1].partition(":")
    made: Tracker = getattr(importlib.import_module(module), cls)(settings)
    return made


def warn(settings: TrackerCfg, why: str) -> None:
    print(f"warning: tracker={settings.name}: {why}; the run and its results are not affected", file=sys.stderr)


def guarded(settings: TrackerCfg, work: Callable[[], None]) -> bool:
    """`work` in a thread given `settings.timeout_s`; a failure or a timeout is one warning line. True when
    it finished."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            work()
        except BaseException as exc:  # whatever a tracker raises, the run goes on
            failed.append(exc)

    worker = threading.Thread(target=body, name=f"tracker-{settings.name}", daemon=True)
    worker.start()
    worker.join(settings.timeout_s)
    if worker.is_alive():
        warn(settings, f"gave up after tracker.timeout_s={settings.timeout_s:g} s")
        return False
    if failed:
        exc = failed[0]
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        warn(settings, f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
        return False
    return True


def _log(tracker: Tracker, rec: RunRecord, run_dir: Path, group: str | None) -> str:
    run_id = tracker.log_run(rec, state.read(run_dir, tracker.name, tracker.where), group)
    state.write(run_dir, tracker.name, tracker.where, run_id)
    return run_id


def track_run(cfg: RunConfig, run_dir: Path) -> bool:
    """Log one finished run (`mode=run`); True when it was logged."""
    settings = cfg.tracker
    if settings.name == "none":
        return False
    if cfg.shard.count > 1:
        warn(settings, "a shard is not tracked alone; merge the shards (mode=merge), then track the merged run")
        return False

    run_dir = Path(run_dir).resolve()  # the thread may outlive its timeout: never relative to a later cwd

    def work() -> None:
        tracker = _backend(settings)
        run_id = _log(tracker, run_record(cfg, run_dir), run_dir, None)
        print(f"tracker={settings.name}: run {run_id} in {tracker.where}")

    return guarded(settings, work)


def track_sweep(points: Sequence[Point], sweep_dir: Path) -> bool:
    """Log a batched sweep's finished points as one group (W&B) or one parent run with a child each
    (MLflow); the group's id is kept in the sweep folder, so the sweep run again joins it."""
    if not points or points[0].cfg.tracker.name == "none":
        return False
    settings = points[0].cfg.tracker

    folder = Path(sweep_dir).resolve()
    points = [Point(p.cfg, Path(p.run_dir).resolve(), p.name) for p in points]

    def work() -> None:
        tracker = _backend(settings)
        name = f"sweep {folder.parent.name}/{folder.name}"
        group = tracker.group(name, state.read(folder, tracker.name, tracker.where))
        state.write(folder, tracker.name, tracker.where, group)
        for p in points:
            _log(tracker, run_record(p.cfg, p.run_dir, p.name), p.run_dir, group)
        tracker.close_group(group)
        print(f"tracker={settings.name}: sweep {group} ({len(points)} point(s)) in {tracker.where}")

    return guarded(settings, work)
