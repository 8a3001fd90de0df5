"""A finished run, or a batched sweep's points, logged to the tracker in a thread given
`tracker.timeout_s` at most; a failure or a timeout is one `warning:` line, never the run's."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig, TrackerCfg
from . import state
from .backends import Tracker, load_backend
from .record import RunRecord, run_record


@dataclass(frozen=True)
class Point:
    """A finished sweep point to log: its config, run directory and name (the overrides that tell it apart)."""

    cfg: RunConfig
    run_dir: Path
    name: str


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
        tracker = load_backend(settings)
        run_id = _log(tracker, run_record(cfg, run_dir), run_dir, None)
        print(f"tracker={settings.name}: run {run_id} in {tracker.where} (to open it: {tracker.opening})")

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
        tracker = load_backend(settings)
        name = f"sweep {folder.parent.name}/{folder.name}"
        group = tracker.group(name, state.read(folder, tracker.name, tracker.where))
        state.write(folder, tracker.name, tracker.where, group)
        for p in points:
            _log(tracker, run_record(p.cfg, p.run_dir, p.name), p.run_dir, group)
        tracker.close_group(group)
        print(
            f"tracker={settings.name}: sweep {group} ({len(points)} point(s)) in {tracker.where}"
            f" (to open it: {tracker.opening})"
        )

    return guarded(settings, work)
