"""A run's life, for every way a run is played: `mode=run` (a sweep of one point), `mode=rerun`, a Slurm
array task (one shard), and each point of a batched sweep.

A point is prepared (`prepare`: pre-flight once, bindings once, identity and run directory), then
`Life` plays points group after group on one engine pool: for each point it opens the run directory
(lock, identity, manifest), reports it straight away if every result is on disk (no engine starts),
else plays its unfinished episodes, seals it (`DONE`), and decides its status and exit code. One set of
signal handlers (SIGTERM, SIGINT: every committed turn stands, the points stop, exit 130/143), one
manifest (`manifest`), one "all finished" shortcut, one exit-code decision (`failures.exit_for`). A
point's episodes are played by `playing.play`, the one assembly of call service and scheduler.

What differs between one run and a sweep is only what is said and where: `run_one` prints a single
run's lines (launch/sweep.py a sweep's index and summary).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..engines.base import Engine, EngineDead
from ..errors import InputError
from ..exits import EXIT_BAD_INPUT, EXIT_ENGINE_DEAD, EXIT_FAILED, EXIT_SIGNAL, EXIT_SYSTEMATIC
from ..protocol import ROLES
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..protocol.records import Checkpoint, EpisodeResult
from ..protocol.spec import Spec
from ..rundir import identity as identity_mod
from ..rundir import layout, provenance
from ..rundir.atomic import DiskFull
from ..rundir.call_log import call_summary
from ..rundir.invalid import systematic_invalid
from ..rundir.places import check_outputs, check_place
from ..rundir.store import RunDir, RunLocked, RunMismatch, StoredResults, resume_hint
from . import engine_log, points
from .admission import Admission
from .calls import Pacer
from .engine_pool import EnginePool, embedded_note, roles_described
from .failures import Exit, exit_for
from .placement import groups, place
from .playing import play
from .progress import Ending, Progress
from .ready import Ready
from .signals import signals_cancel, to_the_end


@dataclass
class Point:
    """One run: a point of a sweep, or the whole of `mode=run`. Its overrides and config, what its run
    needs (read once by pre-flight), and how it went."""

    num: int
    overrides: tuple[str, ...]
    task: Any = None  # the composed task config (DictConfig, no `hydra` node)
    raw: dict[str, Any] | None = None
    cfg: config_mod.RunConfig | None = None  # as given (a sweep group's plan places its engines)
    mode: str = "run"
    ready: Ready | None = None  # what pre-flight read: dataset, pack, narrator, player, bindings
    specs: tuple[Spec, ...] = ()
    ident: identity_mod.Identity | None = None
    out: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)  # role -> engine key in the pool
    status: str = "waiting"  # waiting | running | done | failed | stopped
    code: int | None = None
    message: str = ""
    known: Exit | None = None  # the failure as exit_for gave it (a single run prints it whole)
    results: Mapping[str, EpisodeResult] = field(default_factory=dict)  # read from disk when asked
    engine_ids: dict[str, str] = field(default_factory=dict)  # role -> engine id (e1, e2, ...)
    swept: tuple[str, ...] | None = None  # the overrides that differ between the sweep's points
    # mode=bench's fixed workloads: these episodes only (else every trial of every spec, or the shard's),
    # each played through to max_turns whatever the story does (Episode.play_through).
    only: tuple[str, ...] | None = None
    play_through: bool = False
    # mode=bench's long horizon: checkpoints its episodes resume from (a state built on scripted answers),
    # written into the run directory as it opens; and the admission that let them in, kept once played.
    start: tuple[Checkpoint, ...] = ()
    admission: Admission | None = None

    @property
    def name(self) -> str:
        shown = self.overrides if self.swept is None else self.swept
        return f"#{self.num} " + (" ".join(shown) or "(no overrides)")

    def fail(self, code: int, message: str, known: Exit | None = None) -> None:
        self.status, self.code, self.message, self.known = "failed", code, message, known

    def episodes(self) -> tuple[str, ...]:
        """The point's episodes: each trial of each of its specs, or its shard's (protocol/trials.py names them)."""
        assert self.cfg is not None and self.ready is not None and self.ready.dataset is not None
        if self.only is not None:
            return self.only
        return layout.run_episodes(self.cfg, [s.id for s in self.ready.dataset.specs])


def point_cfg(p: Point) -> config_mod.RunConfig:
    """The config of a point `prepare` validated: one that runs or ran (a runnable point, one with
    results), or one of another mode (its mode is read from that config)."""
    assert p.cfg is not None, f"sweep point {p.name}: no validated config"
    return p.cfg


# ---- preparing: what the point's job checks before an engine starts -------------------------------


def prepare(point: Point, writes: Callable[[str], Sequence[str]] = lambda mode: ()) -> Point:
    """Everything the point's job checks before an engine starts (pre-flight once, its bindings once),
    its identity and run directory; a failure marks it failed. `writes(mode)`: the output keys the
    point's mode writes (the modes table's), checked as the entry checks them."""
    if point.raw is None:
        try:
            point.raw = points.resolved(point.task)
        except InputError as exc:
            point.fail(EXIT_BAD_INPUT, str(exc))
            return point
    raw = point.raw
    try:
        # A point that could not start alone is refused here (as run.py refuses it under the basic
        # launcher); its engines are placed per group.
        cfg = config_mod.validate(raw)
        point.cfg, point.mode = cfg, cfg.mode  # also for a point refused below (its index row, its shard)
        checked = points.check(raw)
        check_outputs(writes(cfg.mode), raw)  # as run.py's entry checks them (modes/_dispatch.py)
        point.ready = checked.ready
        if cfg.mode != "run":
            return point  # run through the mode's own entry, one point after the other
        # mode=run is one of points.CHECKED_ROLES: its check ran pre-flight.
        assert point.ready is not None
        point.specs, point.ident, point.out = checked.where()
        check_place(point.out)
    except InputError as exc:
        point.fail(EXIT_BAD_INPUT, str(exc))
    except Exception as exc:  # a bug, not bad input: named, and the other points go on
        point.fail(EXIT_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
        traceback.print_exc(file=sys.stderr)
    return point


def prepared_run(cfg: config_mod.RunConfig) -> Point:
    """`mode=run`'s one point, checked as any point is (`points.check`: pre-flight once; bad input raises,
    before anything is written); its config as planned (memory shares and devices)."""
    checked = points.check(cfg)
    assert checked.ready is not None  # mode=run is one of points.CHECKED_ROLES
    specs, ident, out = checked.where()
    return Point(0, (), raw=cfg.source, cfg=checked.ready.cfg, ready=checked.ready, specs=specs, ident=ident, out=out)


# ---- the run directory's manifest -----------------------------------------------------------------


@dataclass(frozen=True)
class SweepOf:
    """The sweep a point belongs to, as its manifest records it."""

    dir: Path
    launcher: str = "batched"


def manifest(p: Point, pool: EnginePool, sweep: SweepOf | None = None) -> dict[str, Any]:
    """What the run is (config, content hashes per file, weights) and what it ran on (provenance); for a
    sweep's point also its own command beside the sweep's and the shared engine of each role."""
    assert p.cfg is not None and p.ready is not None and p.ready.dataset is not None and p.ident is not None
    ds, pack = p.ready.dataset, p.ready.pack
    models = roles_described(pool, p.ready.bindings, p.keys, p.ready.endpoints)
    for role, weights in p.ident.parts["models"].items():
        if role in models:
            # The revision as configured, and as the download left it on disk (often the only record).
            found = provenance.hf_revision(models[role]["path"]) if weights.get("kind") == "files" else None
            models[role] = {**models[role], "weights": weights, "revision_on_disk": found}
    m = {
        **provenance.environment(),
        "config": p.cfg.source,
        "dataset": {
            "path": str(ds.root.resolve()),
            "sha256": ds.sha256,
            "specs": [s.id for s in ds.specs],
            "files": p.ident.parts["dataset"],
        },
        "prompts": {"path": str(Path(pack.root).resolve()), "sha256": pack.sha256, "files": p.ident.parts["prompts"]},
        "models": models,
    }
    if sweep is None:
        return m
    # The point's own command (what running it alone would be), beside the sweep's.
    sweep_cmd = provenance.command()
    m["command"] = {
        **sweep_cmd,
        "overrides": list(p.overrides),
        "line": shlex.join([sys.executable, "run.py", *p.overrides]),
        "sweep_line": sweep_cmd.get("line"),
    }
    # Which shared engine served each role, the points it serves and how often it was started so far.
    engines = {role: pool.engines[p.keys[role]].describe().model_dump(mode="json", exclude={"roles"}) for role in ROLES}
    m["sweep"] = {
        "dir": str(sweep.dir.resolve()),
        "job": p.num,
        "launcher": sweep.launcher,
        "pid": os.getpid(),
        "engines": engines,
    }
    return m


# ---- playing --------------------------------------------------------------------------------------


class Life:
    """Points played group after group on one engine pool, each into its own run directory.

    `sweep`: the sweep the points belong to (None: one run alone, whose failures are raised to the
    entry as they always were, except a dead engine and a systematic failure, which are its exit).
    `pool`: engines the caller keeps between lives (mode=bench's ways on one engine; closed by the
    caller); `wrap`: what the episodes see in place of each engine (execution/playing.py: mode=bench's
    recorder, or its scripted and prefill-only answers)."""

    def __init__(
        self,
        points: list[Point],
        sweep: SweepOf | None = None,
        say: Callable[[str], None] | None = None,
        on_change: Callable[[], None] = lambda: None,
        pool: EnginePool | None = None,
        wrap: Callable[[Engine], Engine] | None = None,
    ) -> None:
        self.points = points
        self.sweep = sweep
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.on_change = on_change  # a point's status changed (the sweep rewrites its index)
        self.owns_pool = pool is None
        self.pool = pool if pool is not None else EnginePool(log=self.say if sweep is not None else None)
        self.wrap = wrap
        self.pacer = Pacer()  # one event loop's passes kept short, whichever point's episodes fill them
        self.groups: list[list[Point]] = []
        self.stopped: list[str] = []
        first = next((p.cfg for p in points if p.cfg is not None), None)
        self.progress = Progress(
            enabled=first is not None and first.progress,
            every_s=first.progress_every_s if first is not None else 30.0,
            heartbeat_s=first.status.heartbeat_s if first is not None else 0.0,  # each run's status.json
        )

    def runnable(self) -> list[Point]:
        return [p for p in self.points if p.mode == "run" and p.status == "waiting"]

    def register(self) -> list[Point]:
        """Each runnable point's roles in the pool, and the groups of points whose engines fit together."""
        runnable = self.runnable()
        for p in runnable:
            assert p.ready is not None, f"point {p.name} registered before pre-flight"
            # A sweep keys engines by the config as given (the group's plan places them); one run
            # alone by its config as planned.
            bindings = p.ready.given if self.sweep is not None else p.ready.bindings
            p.keys = self.pool.register(bindings, ROLES, p.ready.endpoints, served=p.num)
            p.engine_ids = {role: self.pool.engines[p.keys[role]].id for role in ROLES}
        self.groups = groups(runnable, self.pool) if self.sweep is not None else [runnable]
        return runnable

    async def run(self) -> None:
        runnable = self.register()
        if len(self.groups) > 1:
            self.say(
                f"sweep: {len(self.groups)} groups of points whose engines fit together: "
                + "; ".join(" ".join(f"#{p.num}" for p in g) for g in self.groups)
            )
        for p in runnable:
            self.progress.add_run(self._shown(p), p.episodes(), point_cfg(p).max_turns, p.out)
            if self.sweep is not None:
                self.progress.point(p.name, "waiting")
        self.on_change()
        # SIGTERM (Slurm preemption) and SIGINT cancel the run; each committed turn is already on disk,
        # so cancelling loses at most the turns in flight.
        with signals_cancel(self.stopped):
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
                    if self.owns_pool:
                        await to_the_end(self.pool.close_all())
                finally:
                    self.on_change()

    def _shown(self, p: Point) -> str:
        return p.name if self.sweep is not None else "run"

    async def _group(self, group: list[Point]) -> None:
        keys = {k for p in group for k in p.keys.values()}
        await self.pool.keep_only(keys)
        if self.sweep is not None:
            place(group, self.pool)
        working: list[Point] = []
        for p in group:
            # Nothing left to do: no engine is started for it, its stored results are reported.
            if not self._finished(p):
                working.append(p)
        # Each engine this group's work needs, once, before any store opens (their manifests name them).
        for key in sorted({k for p in working for k in p.keys.values()}) if self.sweep is not None else ():
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
        if self.sweep is not None and self.progress.started is None:
            self.progress.start()
        await asyncio.gather(*(self._point(p) for p in working))

    def _judge(self, p: Point, ending: Ending) -> None:
        """A point whose episodes all finished fails (exit 5) if most of them measured nothing for one cause."""
        cfg = point_cfg(p)
        assert isinstance(p.results, StoredResults)  # play's, or the stored ones a finished point reports
        broken = systematic_invalid(p.results.outcomes(), cfg.max_invalid_share)
        if broken:
            p.fail(EXIT_SYSTEMATIC, f"{broken} (max_invalid_share={cfg.max_invalid_share})")
            ending.failed(EXIT_SYSTEMATIC, p.message)

    def _finished(self, p: Point) -> bool:
        """A point whose results are all on disk: verified and reported without an engine. False if it
        has work (or if opening its run directory moved a damaged result aside: then it has work after all)."""
        assert p.out is not None
        names = p.episodes()
        if not all(layout.result_file(p.out, e).exists() for e in names):
            return False
        store = self._open(p)
        if store is None:
            return True
        try:
            if not all(store.has_result(e) for e in names):
                return False
            # The heartbeat's final state is this command's, not the one an earlier command left.
            with self.progress.beating(self._shown(p), self.stopped) as ending:
                p.results = StoredResults(store, names)
                store.mark_done(len(names))
                self._judge(p, ending)  # the same verdict as when they were played
            if self.sweep is not None:
                self.say(f"sweep: {p.name}: all {len(names)} episodes already finished in {p.out}; nothing left to do")
            else:
                print(f"all {len(names)} episodes already finished in {p.out}; nothing left to do")
            if p.status != "failed":
                p.status, p.code = "done", 0
        except (InputError, DiskFull) as exc:
            if self.sweep is None:
                raise
            known = exit_for(exc)
            assert known is not None
            p.fail(known.code, known.message, known)
        finally:
            store.close()
        self._ended(p)
        return True

    def _open(self, p: Point) -> RunDir | None:
        """The point's run directory, opened (lock, identity check); None after failing the point (a
        single run's refusal is raised to its entry)."""
        assert p.out is not None and p.ident is not None
        store = RunDir(p.out)
        try:
            store.open(manifest(p, self.pool, self.sweep), p.ident)
        except (InputError, RunLocked, RunMismatch, DiskFull) as exc:
            if self.sweep is None:
                raise
            known = exit_for(exc)
            assert known is not None
            p.fail(known.code, known.message, known)
            self._ended(p)
            return None
        if self.sweep is None:
            engine_log.place(p.out / layout.ENGINE_LOG)  # a sweep's engines serve every point: its own log
        return store

    def _ended(self, p: Point) -> None:
        if self.sweep is None:
            return
        self.progress.point(p.name, "done" if p.status == "done" else "failed", p.code, p.message or None)
        if p.status == "failed":
            self.say(f"error: sweep point {p.name}: {p.message}")
        self.on_change()

    async def _point(self, p: Point) -> None:
        store = self._open(p)
        if store is None:
            return
        p.status = "running"
        if self.sweep is not None:
            self.progress.point(p.name, "running")
        self.on_change()
        assert p.cfg is not None and p.ready is not None and p.out is not None
        cfg = p.cfg
        try:
            # status.json (mode=status) from the engines' loading to the point's end, its final state by
            # how the block ends (a sweep's point began beating when it started running).
            with self.progress.beating(self._shown(p), self.stopped) as ending:
                engines = await self.pool.of_roles(p.keys)
                if self.sweep is None:
                    self.progress.start()
                # A sweep's point as it would run alone, on the pool's engines (its own config as given, not
                # the group's placement: placement never changes what a run computes).
                ready = p.ready if self.sweep is None else replace(p.ready, cfg=cfg, bindings=p.ready.given)
                for cp in p.start:
                    store.write_checkpoint(cp)
                where = (ready, p.specs, engines, store, self.progress, self._shown(p), p.episodes())
                p.results, p.admission = await play(*where, self.wrap, p.play_through, self.pacer)
                # Inside the heartbeat's block: its final state carries this verdict's exit code. Off the loop:
                # DONE's fsync, and the verdict, which reads the results of episodes an earlier run finished.
                await asyncio.to_thread(store.mark_done, len(p.episodes()))
                await asyncio.to_thread(self._judge, p, ending)
            if p.status != "failed":
                p.status, p.code = "done", 0
                if self.sweep is not None:
                    self.say(f"sweep: {p.name}: done, {len(p.results)} episodes in {p.out}")
        except asyncio.CancelledError:
            p.status = "stopped"
            raise
        except Exception as exc:
            if isinstance(exc, EngineDead):
                for key in p.keys.values():
                    self.pool.engines[key].dead = True
            alone = self.sweep is None
            known = exit_for(
                exc,
                resume_hint("every committed turn is checkpointed", p.out)
                if alone
                else f"every committed turn is checkpointed in {p.out}",
            )
            if alone and (known is None or known.code not in (EXIT_ENGINE_DEAD, EXIT_SYSTEMATIC)):
                raise  # one run alone: its entry says it, as for any run
            if known is None:  # a bug: this point fails, loudly, and the others go on
                traceback.print_exc(file=sys.stderr)
                p.fail(EXIT_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
            else:
                message = known.message
                if known.code == EXIT_SYSTEMATIC and not alone:
                    message = message.replace("the run stopped early", "the point stopped early")
                p.fail(known.code, message, known)
        finally:
            store.close()
        self._ended(p)


# ---- one run alone --------------------------------------------------------------------------------


def run_one(cfg: config_mod.RunConfig, on_finished: Callable[[Path], None] | None = None) -> int:
    """`mode=run`: check, play and report one run (a sweep of one point); the exit code.
    `on_finished(run dir)` runs once the run has finished and reported (exit 0): the tracker's turn."""
    p = prepared_run(cfg)  # all checked before anything starts
    assert p.ready is not None and p.ready.dataset is not None and p.out is not None and p.cfg is not None
    cfg, out = p.cfg, p.out
    note = embedded_note(p.ready.bindings)
    if note:
        print(note)
    sharding = layout.sharding_note(cfg, len(p.ready.dataset.specs))
    if sharding:
        print(f"shard {cfg.shard.index} of {cfg.shard.count}: {len(p.episodes())} episodes; {sharding}")
    life = Life([p])
    asyncio.run(life.run())
    if p.status == "stopped":
        left = sum(not layout.result_file(out, n).exists() for n in p.episodes())
        print(
            f"stopped by {life.stopped[0] if life.stopped else 'SIGINT'}: "
            + resume_hint(f"{left} unfinished episode(s) checkpointed", out),
            file=sys.stderr,
        )
        return p.code or EXIT_SIGNAL["SIGINT"]
    if p.status == "failed" and p.known is not None:  # a dead engine, or a systematic failure while playing
        assert p.code is not None
        p.known.print()
        return p.code
    rows = [(out.name, aggregate([episode_metrics(r) for r in p.results.values()], cfg.max_turns))]
    print(results_table(rows))
    for line in call_summary(out / layout.CALLS):
        print(line)
    print(f"run directory: {out}")
    if p.status == "failed":
        print(f"error: {p.message}", file=sys.stderr)
        return EXIT_SYSTEMATIC
    if on_finished is not None:
        on_finished(out)
    return 0
