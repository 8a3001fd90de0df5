"""Episodes in flight: a checkpoint and no result yet, counted by `mode=report` while a run plays.

An episode that has committed n turns and not finished (still playing, or its process stopped) has a
story at least n turns long: it is right-censored at n, the third reason after the turn cap and the
context window (protocol/metrics.py). So S(t), turns kept and the endings' curves count it there; the
per-episode averages (avg turns, progress, conflict rates) stay over finished episodes, whose values
are known. Nothing here writes into a run directory.

The report cannot tell a playing episode from a stopped one (a heartbeat can): the line says both.
Reading while a run writes is safe: checkpoints are renamed into place whole (rundir/atomic.py),
the run lists its results before its checkpoints (an episode that finishes in between is found by its
result), and a checkpoint that is gone or fails its check by the time it is read is skipped with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..protocol.metrics import EpisodeMetrics, in_flight_metrics
from ..rundir.layout import CHECKPOINTS, RESULTS
from ..rundir.turn_log import checkpoint_paths, read_checkpoint
from .reference_runs import REFERENCE_KIND
from .runs import LEFT_OUT, Run


def _checkpoint_files(run: Run) -> dict[str, Path]:
    """Episode -> its checkpoint, each part's folder listed once (the first part that holds it)."""
    parts = ([run.path] if (run.path / RESULTS).is_dir() else []) + list(run.shards)
    found: dict[str, Path] = {}
    for part in parts:
        for episode, path in checkpoint_paths(part / CHECKPOINTS).items():
            found.setdefault(episode, path)
    return found


def count_in_flight(run: Run) -> None:
    """Read the checkpoint of each of `run.unfinished` into `run.in_flight` (censored at its committed
    turns); a checkpoint gone or failing its check is skipped with a note in `run.notes`. A folder of
    official result files keeps its note (its checkpoints are not the rig's)."""
    if run.manifest.get("kind") == REFERENCE_KIND:
        return
    found: list[EpisodeMetrics] = []
    skipped: list[str] = []
    files = _checkpoint_files(run)
    for episode in run.unfinished:
        path = files.get(episode)
        if path is None or not path.is_file():
            skipped.append(
                f"{episode}: its checkpoint went away while the report read the run (finished or "
                "moved to quarantine/): counted in neither; run the report again"
            )
            continue
        cp, why = read_checkpoint(path, run.manifest)
        if cp is None:
            skipped.append(f"{path}: {why}: skipped (a checkpoint being replaced, or damaged)")
            continue
        found.append(in_flight_metrics(cp))
    run.in_flight = tuple(found)
    run.notes[:] = [n for n in run.notes if not n.endswith(LEFT_OUT)] + skipped
    run.forget_aggregates()


def in_flight_line(run: Run) -> str:
    """The one plain line a report shows for a run with episodes in flight ('' when none)."""
    n = len(run.in_flight)
    if not n:
        return ""
    finished = len(run.results)
    if not finished:
        return (
            f"nothing has finished yet: {n} episodes still playing or stopped, followed to turn "
            f"{max(m.turns for m in run.in_flight)} at most; the averages wait for a finished episode, and S(t), "
            "turns kept and the endings rest on these alone, not estimable (n/e) past the turn after the last followed"
        )
    return (
        f"{n} of {n + finished} episodes still playing or stopped (counted as censored at their last committed "
        f"turn): S(t), turns kept and the endings include them; the results table's episodes and averages "
        f"are over the {finished} finished"
    )


def in_flight_lines(runs: Sequence[Run]) -> list[str]:
    """`in_flight_line` of each run that has one, labelled."""
    return [f"{r.label}: {line}" for r in runs if (line := in_flight_line(r))]


def nothing_yet(run: Run) -> bool:
    """No episode of the run has finished or committed a turn (a run just started, or never played)."""
    return not run.results and not run.in_flight and not run.damaged


NOTHING_YET = "no episode has finished or committed a turn yet: nothing to report"
