"""Sweeps in batched turns: every point of a sweep in one process, sharing its engines.

`python run.py -m hydra/launcher=batched ...` (hydra_plugins/ncp_batched_launcher)
hands every point's composed config here. Then:

1. Every point is checked before anything starts, as its own run would be
   (config, plan, dataset, prompt pack, method options, model paths, run
   directory). A point that fails is named in one line and left out; the
   others run.
2. Engines are keyed by model identity (engine settings + model settings,
   as `execution.engine_pool.EnginePool` keys them) and each is started once for all the
   points that use it. Points whose engines do not fit the hardware
   together (`ncp_local.plan`) run in successive groups; an engine the next
   group also uses (the shared narrator) stays loaded.
3. The episodes of all points of a group are in flight together, so the
   engine batches across points. Each point writes its own run directory,
   with the identity and the results it would have alone (per-call seeds
   do not depend on what else is in flight; on the CPU build fp32 is
   batch-invariant), and resumes by itself when the sweep is run again.
4. A failing point (an engine that died, a systematic failure) is reported
   and the others go on; the sweep ends with a summary and exit code 6
   (`exits.EXIT_SWEEP_FAILED`, as under the basic launcher) if any point
   failed (130/143 when stopped by a signal).

The sweep folder (`hydra.sweep.dir`) gets `index.json` and `index.md`: job
number, overrides, run directory, status and exit code of every point, and
the engines with the points they served and how often each was started.

Each point lives as any run does (execution/life.py: prepared, opened, played, sealed, its exit
decided); its engines come from the one pool (execution/engine_pool.py), its group from
execution/placement.py; the index rows are launch/point_index.py's.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .. import modes, tracking
from ..errors import InputError, reader_may_close
from ..execution import engine_log
from ..execution.life import Life, Point, SweepOf, point_cfg, prepare
from ..exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_SIGNAL, EXIT_SWEEP_FAILED
from ..modes import plant as plant_mode
from ..modes.reaudit import auditor_table, point_dir
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..report.labels import by_difference, from_template
from ..rundir import layout, sweep_index
from .point_index import write_index


def mark_swept(points: Sequence[Point]) -> None:
    """Name each point by the overrides that differ between points (all of them are in the index)."""
    given = [dict(o.partition("=")[::2] for o in p.overrides) for p in points]
    keys = {k for g in given for k in g}
    varying = {k for k in keys if len({g.get(k) for g in given}) > 1}
    for p in points:
        p.swept = tuple(o for o in p.overrides if o.partition("=")[0] in varying)


# ---- the whole sweep ----------------------------------------------------------------


def rows_labelled(points: Sequence[Point]) -> list[tuple[str, Any]]:
    """(label, aggregate) per point with results, labelled by what differs between the points."""
    with_results = [p for p in points if p.results]
    cfgs = [point_cfg(p) for p in with_results]  # a point with results ran
    template = next((c.report.label for c in cfgs if getattr(c.report, "label", None)), None)
    if template:
        labels = [from_template(template, p.raw or {}) for p in with_results]
    else:
        labels = by_difference([p.raw or {} for p in with_results]) or [
            p.out.name if p.out else p.name for p in with_results
        ]
    return [
        (f"#{p.num} {label}", aggregate([episode_metrics(r) for r in p.results.values()], cfg.max_turns))
        for p, cfg, label in zip(with_results, cfgs, labels, strict=True)
    ]


def summary(points: Sequence[Point]) -> tuple[int, str]:
    """The sweep's exit code and its last line."""
    done = [p for p in points if p.status == "done"]
    failed = [p for p in points if p.status == "failed"]
    stopped = [p for p in points if p.status == "stopped"]
    counts = (
        f"{len(points)} point(s): {len(done)} done"
        + (f", {len(failed)} failed" if failed else "")
        + (f", {len(stopped)} stopped" if stopped else "")
    )
    if stopped:
        code = stopped[0].code or EXIT_SIGNAL["SIGINT"]
        return code, (
            f"sweep: {counts}; every committed turn is checkpointed: re-run the same command to resume "
            "(finished points are not run again)"
        )
    if failed:
        which = "; ".join(f"{p.name} (exit {p.code}: {p.message})" for p in failed)
        refused = any(p.code == EXIT_BAD_INPUT for p in failed)
        advice = (
            "fix the refused point(s), then " if refused else ""
        ) + "re-run the same command to resume (finished points are not run again)"
        return EXIT_SWEEP_FAILED, f"sweep: {counts}: {which}; {advice}"
    return 0, f"sweep: {counts}"


def run_other(p: Point) -> None:
    """A point of another mode (report, reaudit, ...) through the mode's own entry."""
    try:
        p.status = "running"
        p.code = modes.main(OmegaConf.create(p.raw) if p.raw is not None else p.task)
    except SystemExit as exc:
        p.code = exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        p.code, p.message = EXIT_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
    p.status = "done" if p.code == 0 else "failed"
    if p.code and not p.message:
        p.message = "see its error above"


def run_sweep(points: list[Point], sweep_dir: Path) -> int:
    """Check every point, run the valid ones (batched), print the table and the summary; the exit code.

    The engines serve every point, so their log is the sweep folder's `engine.log`."""
    verbose = any(bool((p.raw or {}).get("verbose")) for p in points)
    with reader_may_close(), engine_log.quiet(verbose, "sweep"):  # the table's reader may close it (entry.py)
        engine_log.place(sweep_dir / layout.ENGINE_LOG)
        return _run_sweep(points, sweep_dir)


def _run_sweep(points: list[Point], sweep_dir: Path) -> int:
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    mark_swept(points)
    for p in points:
        if p.status == "waiting" and p.cfg is None:
            prepare(p, lambda mode: modes.find(mode).writes)
    shared = layout.shared_run_dir(
        (p.name, p.out, p.ident.key)
        for p in points
        if p.status == "waiting" and p.out is not None and p.ident is not None
    )
    if shared:
        # Several experiments, one run directory: the second would be refused only after the first ran.
        say(f"error: {shared}")
        return EXIT_BAD_INPUT
    for p in points:
        if p.status == "waiting" and p.cfg is not None:
            try:
                tracking.require(p.cfg.tracker)  # a tracker that is not installed: nothing starts
            except InputError as exc:
                say(f"error: {exc}")
                return EXIT_BAD_INPUT
    bad = [p for p in points if p.status == "failed"]
    for p in bad:
        say(f"error: sweep point {p.name}: {p.message} (it will not run; the other points do)")
    index_name = sweep_index.name_for(next((p.cfg for p in points if p.cfg is not None), None))
    life = Life(points, SweepOf(sweep_dir), say)

    def index() -> None:
        write_index(sweep_dir, points, life.pool, "batched", life.groups, index_name)

    life.on_change = index
    runnable = life.runnable()
    print(
        f"sweep: {len(points)} point(s) in one process ({len(runnable)} to run batched"
        + (f", {len(bad)} refused" if bad else "")
        + f"); index: {sweep_dir / index_name}",
        flush=True,
    )
    if runnable:
        asyncio.run(life.run())
    for p in points:
        if p.status == "waiting" and p.mode != "run":
            run_other(p)
            index()
    index()
    rows = rows_labelled(points)
    if rows:
        print(results_table(rows))
    # A point's mode is read from its validated config: a reaudit point has one.
    reaudits = [p for p in points if p.mode == "reaudit" and p.status == "done" and len(point_cfg(p).runs) == 1]
    if reaudits:
        for p in reaudits:
            p.out = point_dir(point_cfg(p))
        index()
        first = point_cfg(reaudits[0])
        if len(reaudits) > 1 and len({tuple(point_cfg(p).runs) for p in reaudits}) == 1:
            # Several auditors on one run: the paper's Table 2 over the run and its re-audits.
            print(f"auditor table over {len(reaudits)} re-audits of {first.runs[0]}:")
            auditor_table(
                first.model_copy(
                    update={
                        "report": first.report.model_copy(
                            update={"out": first.report.out or str(sweep_dir / "auditors")}
                        )
                    }
                ),
                [first.runs[0], *(str(p.out) for p in reaudits)],
            )
    plants = [p for p in points if p.mode == "plant" and p.status == "done" and len(point_cfg(p).runs) == 1]
    if len(plants) > 1:  # several auditors on one run's plants: side by side, paired on the same items
        for p in plants:
            p.out = plant_mode.point_dir(point_cfg(p))
        index()
        first = point_cfg(plants[0])
        out = first.report.out or str(sweep_dir / "plants")
        plant_mode.table(
            first.model_copy(update={"report": first.report.model_copy(update={"out": out})}),
            [str(p.out) for p in plants],
        )
    for p in points:
        if p.out is not None and p.status == "done":
            print(f"run directory: #{p.num} {p.out}")
    # The finished run points, as one tracker group (after every result is on disk; never fails the sweep).
    tracking.track_sweep(
        [
            tracking.Point(p.cfg, p.out, p.name)
            for p in points
            if p.mode == "run" and p.status == "done" and p.out is not None and p.cfg is not None
        ],
        sweep_dir,
    )
    code, line = summary(points)
    if code:
        say(f"error: {line}")
    else:
        print(line)
    return code
