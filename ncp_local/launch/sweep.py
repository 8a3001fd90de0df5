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

The points are launch/sweep_point.py's, the shared engines and their groups
launch/shared_engines.py's, the index rows launch/point_index.py's.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .. import modes, tracking
from ..engines.base import EngineDead
from ..errors import InputError
from ..execution import engine_log, layout, sweep_index
from ..execution.atomic import DiskFull
from ..execution.calls import systematic_invalid
from ..execution.episodes import manifest, play
from ..execution.failures import exit_for
from ..execution.progress import Progress
from ..execution.provenance import command
from ..execution.store import RunDir, RunLocked, RunMismatch
from ..exits import (
    EXIT_BAD_INPUT,
    EXIT_ENGINE_DEAD,
    EXIT_FAILED,
    EXIT_SIGNAL,
    EXIT_SWEEP_FAILED,
    EXIT_SYSTEMATIC,
)
from ..modes.reaudit import auditor_table, point_dir
from ..protocol import ROLES
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..report.labels import by_difference, from_template
from .point_index import write_index
from .shared_engines import SharedEngines, groups, place
from .sweep_point import Point, mark_swept, point_cfg, prepare

# ---- running ------------------------------------------------------------------------


def _manifest(p: Point, sweep_dir: Path, pool: SharedEngines) -> dict[str, Any]:
    assert p.cfg is not None and p.raw is not None and p.ready is not None and p.ready.dataset is not None
    assert p.engines is not None and p.ident is not None
    m = manifest(p.cfg, p.raw, p.ready.dataset, p.ready, p.engines, p.ident)
    # The point's own command (what running it alone would be), beside the sweep's.
    sweep_cmd = command()
    m["command"] = {
        **sweep_cmd,
        "overrides": list(p.overrides),
        "line": shlex.join([sys.executable, "run.py", *p.overrides]),
        "sweep_line": sweep_cmd.get("line"),
    }
    # Which shared engine served each role, the points it serves and how often it was started so far.
    engines = {role: pool.engines[p.keys[role]].describe().model_dump(mode="json", exclude={"roles"}) for role in ROLES}
    m["sweep"] = {
        "dir": str(sweep_dir.resolve()),
        "job": p.num,
        "launcher": "batched",
        "pid": os.getpid(),
        "engines": engines,
    }
    return m


def _episodes(p: Point) -> tuple[str, ...]:
    """The point's episodes: each trial of each of its specs, or its shard's (protocol/trials.py names them)."""
    assert p.cfg is not None and p.ready is not None and p.ready.dataset is not None
    return layout.run_episodes(p.cfg, [s.id for s in p.ready.dataset.specs])


def _todo(p: Point) -> bool:
    assert p.out is not None
    return not all(layout.result_file(p.out, e).exists() for e in _episodes(p))


class Sweep:
    """The points of one batched sweep and their engines, run group after group."""

    def __init__(self, points: list[Point], sweep_dir: Path, out: Callable[[str], None] | None = None) -> None:
        self.points = points
        self.sweep_dir = sweep_dir
        self.say = out or (lambda line: print(line, file=sys.stderr, flush=True))
        self.pool = SharedEngines(self.say)
        self.groups: list[list[Point]] = []
        self.stopped: list[str] = []
        self.index_name = sweep_index.name_for(next((p.cfg for p in points if p.cfg is not None), None))
        first = next((p.cfg for p in points if p.cfg is not None), None)
        self.progress = Progress(
            enabled=bool(first and first.progress),
            every_s=float(getattr(first, "progress_every_s", 30.0) or 30.0),
            heartbeat_s=first.status.heartbeat_s if first is not None else 0.0,  # each point's status.json
        )

    def index(self) -> None:
        write_index(self.sweep_dir, self.points, self.pool, "batched", self.groups, self.index_name)

    async def run(self) -> None:
        runnable = [p for p in self.points if p.mode == "run" and p.status == "waiting"]
        for p in runnable:
            self.pool.register(p)
        self.groups = groups(runnable, self.pool)
        if len(self.groups) > 1:
            self.say(
                f"sweep: {len(self.groups)} groups of points whose engines fit together: "
                + "; ".join(" ".join(f"#{p.num}" for p in g) for g in self.groups)
            )
        for p in runnable:
            self.progress.add_run(p.name, _episodes(p), point_cfg(p).max_turns, p.out)
            self.progress.point(p.name, "waiting")
        self.index()
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):

            def on_signal(name: str = sig.name) -> None:
                self.stopped.append(name)
                if task:
                    task.cancel()

            loop.add_signal_handler(sig, on_signal)
        try:
            for g in self.groups:
                await self._group(g)
        except asyncio.CancelledError:
            code = EXIT_SIGNAL[self.stopped[0] if self.stopped else "SIGINT"]
            for p in runnable:
                if p.status in ("waiting", "running", "stopped"):
                    p.status, p.code = "stopped", code
        finally:
            self.progress.close()
            try:
                await asyncio.shield(self.pool.close_all())
            finally:
                self.index()

    async def _group(self, group: list[Point]) -> None:
        keys = {k for p in group for k in p.keys.values()}
        await self.pool.keep_only(keys)
        place(group, self.pool)
        working: list[Point] = []
        for p in group:
            # Nothing left to do: no engine is started for it, its stored results are reported.
            if _todo(p) or not self._finish(p):
                working.append(p)
        # Each engine this group's work needs, once, before any store opens (their manifests name them).
        for key in sorted({k for p in working for k in p.keys.values()}):
            needing = [p for p in working if key in p.keys.values() and p.status == "waiting"]
            if not needing:
                continue  # its points failed already (another of their engines did not start)
            try:
                await self.pool.get(key)
            except Exception as exc:
                e = self.pool.engines[key]
                e.dead = True
                for p in needing:
                    p.fail(
                        EXIT_ENGINE_DEAD,
                        f"engine {e.id} ({e.label}) did not start: {type(exc).__name__}: {exc}".splitlines()[0],
                    )
                    self._ended(p)
        working = [p for p in working if p.status == "waiting"]
        if self.progress.started is None:
            self.progress.start()
        await asyncio.gather(*(self._point(p) for p in working))

    def _finish(self, p: Point) -> bool:
        """A point whose results are all on disk: verified and reported without an engine. False if
        opening its run directory moved a damaged result aside (the point has work after all)."""
        store = self._open(p)
        if store is None:
            return True
        try:
            names = _episodes(p)
            if not all(store.has_result(e) for e in names):
                return False
            p.results = {e: store.load_result(e) for e in names}
            store.mark_done(len(names))
            p.status, p.code = "done", 0
            self.say(f"sweep: {p.name}: all {len(names)} episodes already finished in {p.out}; nothing left to do")
        except (InputError, DiskFull) as exc:
            known = exit_for(exc)
            assert known is not None
            p.fail(known.code, known.message)
        finally:
            store.close()
        self._ended(p)
        return True

    def _open(self, p: Point) -> RunDir | None:
        """The point's run directory, opened (lock, identity check); None after failing the point."""
        store = RunDir(p.out)  # type: ignore[arg-type]
        try:
            store.open(_manifest(p, self.sweep_dir, self.pool), p.ident)
        except (InputError, RunLocked, RunMismatch, DiskFull) as exc:
            known = exit_for(exc)
            assert known is not None
            p.fail(known.code, known.message)
            self._ended(p)
            return None
        return store

    def _ended(self, p: Point) -> None:
        self.progress.point(p.name, "done" if p.status == "done" else "failed", p.code, p.message or None)
        if p.status == "failed":
            self.say(f"error: sweep point {p.name}: {p.message}")
        self.index()

    async def _point(self, p: Point) -> None:
        store = self._open(p)
        if store is None:
            return
        p.status = "running"
        self.progress.point(p.name, "running")
        self.index()
        assert p.cfg is not None and p.ready is not None
        cfg = p.cfg
        try:
            engines = {role: await self.pool.get(p.keys[role]) for role in ROLES}
            # The point as it would run alone, on the sweep's shared engines (its own config, not the
            # group's placement: placement never changes what a run computes).
            p.results = await play(
                replace(p.ready, cfg=cfg), p.specs, engines, store, self.progress, p.name, _episodes(p)
            )
            store.mark_done(len(_episodes(p)))
            broken = systematic_invalid(p.results.values(), cfg.max_invalid_share)
            if broken:
                p.fail(EXIT_SYSTEMATIC, f"{broken} (max_invalid_share={cfg.max_invalid_share})")
            else:
                p.status, p.code = "done", 0
                self.say(f"sweep: {p.name}: done, {len(p.results)} episodes in {p.out}")
        except asyncio.CancelledError:
            p.status = "stopped"
            raise
        except Exception as exc:
            if isinstance(exc, EngineDead):
                for role in ROLES:
                    self.pool.engines[p.keys[role]].dead = True
            known = exit_for(exc, f"every committed turn is checkpointed in {p.out}")
            if known is None:  # a bug: this point fails, loudly, and the others go on
                traceback.print_exc(file=sys.stderr)
                known_code, message = EXIT_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
            else:
                known_code, message = known.code, known.message
                if known.code == EXIT_SYSTEMATIC:
                    message = message.replace("the run stopped early", "the point stopped early")
            p.fail(known_code, message)
        finally:
            store.close()
        self._ended(p)


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
    with engine_log.quiet(verbose, "sweep"):
        engine_log.place(sweep_dir / layout.ENGINE_LOG)
        return _run_sweep(points, sweep_dir)


def _run_sweep(points: list[Point], sweep_dir: Path) -> int:
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    mark_swept(points)
    for p in points:
        if p.status == "waiting" and p.cfg is None:
            prepare(p)
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
    sweep = Sweep(points, sweep_dir, say)
    runnable = [p for p in points if p.mode == "run" and p.status == "waiting"]
    print(
        f"sweep: {len(points)} point(s) in one process ({len(runnable)} to run batched"
        + (f", {len(bad)} refused" if bad else "")
        + f"); index: {sweep_dir / sweep.index_name}",
        flush=True,
    )
    if runnable:
        asyncio.run(sweep.run())
    for p in points:
        if p.status == "waiting" and p.mode != "run":
            run_other(p)
            sweep.index()
    sweep.index()
    rows = rows_labelled(points)
    if rows:
        print(results_table(rows))
    # A point's mode is read from its validated config: a reaudit point has one.
    reaudits = [p for p in points if p.mode == "reaudit" and p.status == "done" and len(point_cfg(p).runs) == 1]
    if reaudits:
        for p in reaudits:
            p.out = point_dir(point_cfg(p), p.raw or {})
        sweep.index()
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
