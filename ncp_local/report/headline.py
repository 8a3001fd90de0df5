"""A finished run's two length figures, for places that show a run in one line (the sweep index).

avg turns (the mean of the scored episodes' turns, censored ones at their committed turns) and turns
kept (the restricted mean: the area under the Kaplan-Meier S(t) to the horizon, protocol/metrics.py),
points only: an index row has no room for intervals, the run's report gives them. Reading a run directory
costs a pass over its result files, so the figures are kept per directory until its results change.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..protocol.metrics import identified_to, restricted_mean_point
from .runs import load_run


@dataclass(frozen=True)
class Headline:
    avg_turns: float
    turns_kept: float | None  # None past the data (protocol/metrics.identified_to)
    horizon: int


def _stamp(run_dir: Path) -> tuple[int, ...]:
    """Changes when a result is added or replaced (a folder's mtime moves when a file is renamed into it)."""
    dirs = [run_dir / "results", *sorted(run_dir.glob("shard-*/results"))]
    return tuple(d.stat().st_mtime_ns for d in dirs if d.is_dir())


def headline(run_dir: Path, horizon: int | None = None) -> Headline | None:
    """avg turns and turns kept to `horizon` (the run's turn cap when None, never past it); None when the
    directory holds no readable scored episode."""
    path = Path(run_dir)
    return _cached(str(path.resolve()), horizon, _stamp(path))


@functools.lru_cache(maxsize=256)
def _cached(run_dir: str, horizon: int | None, stamp: tuple[int, ...]) -> Headline | None:
    try:
        run = load_run(run_dir)
    except (InputError, OSError, ValueError):  # a damaged or newer directory: the row goes without figures
        return None
    scored = [m for m in run.metrics() if m.termination != "invalid"]
    if not scored:
        return None
    h = run.max_turns if horizon is None else min(horizon, run.max_turns)
    turns = np.asarray([m.turns for m in scored], dtype=np.intp)
    ended = 1.0 - np.asarray([m.censored for m in scored], dtype=float)
    # Past the last turn anyone was followed turns kept has no point (protocol/metrics.identified_to).
    kept = restricted_mean_point(turns, ended, h) if identified_to(turns, ended, h) >= h else None
    return Headline(float(turns.mean()), kept, h)
