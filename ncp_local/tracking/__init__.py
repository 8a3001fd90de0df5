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

The package face: `backends` names the backends and loads one, `track` logs a run or a sweep.
"""

from .backends import BACKENDS, require
from .track import Point, track_run, track_sweep

__all__ = ["BACKENDS", "Point", "require", "track_run", "track_sweep"]
