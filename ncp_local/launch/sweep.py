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
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from .. import config as config_mod
from .. import modes, tracking
from ..bindings import Binding, Bindings, Sampling, bind
from ..engines.base import Engine, EngineDead
from ..engines.settings import ModelSettings
from ..errors import InputError
from ..execution import engine_log, layout, points, sweep_index
from ..execution import identity as identity_mod
from ..execution.calls import systematic_invalid
from ..execution.engine_pool import EnginePool
from ..execution.episodes import manifest, play
from ..execution.failures import exit_for
from ..execution.preflight import Ready
from ..execution.progress import Progress
from ..execution.provenance import command
from ..execution.store import DiskFull, RunDir, RunLocked, RunMismatch, check_place
from ..execution.sweep_index import INDEX, EngineRow, PointRow
from ..exits import (
    EXIT_BAD_INPUT,
    EXIT_ENGINE_DEAD,
    EXIT_FAILED,
    EXIT_SIGNAL,
    EXIT_SWEEP_FAILED,
    EXIT_SYSTEMATIC,
)
from ..modes.reaudit import auditor_table, point_dir
from ..plan import check
from ..protocol import ROLES
from ..protocol.metrics import aggregate, episode_metrics, results_table
from ..protocol.stages import Bounds
from ..report.labels import by_difference, from_template

# ---- points -------------------------------------------------------------------------


@dataclass
class Point:
    """One sweep point: its overrides and config, what its run needs, and how it went."""

    num: int
    overrides: tuple[str, ...]
    task: Any = None  # the composed task config (DictConfig, no `hydra` node)
    raw: dict[str, Any] | None = None
    cfg: config_mod.RunConfig | None = None  # as given (a group's plan places its engines)
    mode: str = "run"
    ready: Ready | None = None  # what pre-flight read: dataset, pack, narrator, player
    engines: EnginePool | None = None  # the point's own engine grouping (keys and models)
    specs: tuple[Any, ...] = ()
    ident: identity_mod.Identity | None = None
    out: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)  # role -> engine key
    status: str = "waiting"  # waiting | running | done | failed | stopped
    code: int | None = None
    message: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    engine_ids: dict[str, str] = field(default_factory=dict)  # role -> engine id (e1, e2, ...)
    swept: tuple[str, ...] | None = None  # the overrides that differ between the sweep's points

    @property
    def name(self) -> str:
        shown = self.overrides if self.swept is None else self.swept
        return f"#{self.num} " + (" ".join(shown) or "(no overrides)")

    def fail(self, code: int, message: str) -> None:
        self.status, self.code, self.message = "failed", code, message


def prepare(point: Point) -> Point:
    """Everything the point's job checks before an engine starts; a failure marks it failed."""
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
        point.ready = checked.ready
        if cfg.mode != "run":
            return point  # run through the mode's own entry, one point after the other
        # mode=run is one of points.CHECKED_ROLES: its check ran pre-flight.
        assert point.ready is not None
        point.specs, point.ident, point.out = checked.where()
        check_place(point.out)
        point.engines = EnginePool(bind(cfg), endpoints=point.ready.endpoints)
        point.keys = {r: point.engines.key_of(r) for r in ROLES}
    except InputError as exc:
        point.fail(EXIT_BAD_INPUT, str(exc))
    except Exception as exc:  # a bug, not bad input: named, and the other points go on
        point.fail(EXIT_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
        traceback.print_exc(file=sys.stderr)
    return point


# ---- engines ------------------------------------------------------------------------


@dataclass
class SharedEngine:
    key: str
    id: str
    model: ModelSettings  # as the first point that uses it configures it
    factory: EnginePool  # the pool of a point using it (engine kind and settings)
    role_key: str  # the pool's key of the model
    max_tokens: int = 0  # the largest output any role reserves on it (the plan's window check)
    placement: dict[str, Any] = field(default_factory=dict)  # share / devices from the group's plan
    engine: Engine | None = None
    starts: int = 0
    start_s: float = 0.0
    points: set[int] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    dead: bool = False

    def started_model(self) -> Any:
        model = self.factory.model_for(self.role_key)
        return model.model_copy(update=self.placement) if self.placement else model

    def describe(self) -> EngineRow:
        return EngineRow(
            id=self.id,
            model=self.model.name,
            engine=self.factory.kinds[self.role_key],
            roles=tuple(sorted(self.roles)),
            points=tuple(sorted(self.points)),
            starts=self.starts,
            start_s=round(self.start_s, 1),
            placement=self.placement or None,
        )


class SharedEngines:
    """The sweep's engines by key: each started once, on first use, and closed when no group needs it."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.engines: dict[str, SharedEngine] = {}
        self.log = log
        self._locks: dict[str, asyncio.Lock] = {}

    def register(self, p: Point) -> None:
        # Only a runnable point is registered, and `prepare` gave each its EnginePool.
        assert p.engines is not None, f"sweep point {p.name} registered without its engines"
        for role in ROLES:
            key = p.keys[role]
            e = self.engines.get(key)
            if e is None:
                e = self.engines[key] = SharedEngine(
                    key, f"e{len(self.engines) + 1}", getattr(p.cfg, role).model, p.engines, p.engines.role_key[role]
                )
            e.points.add(p.num)
            e.roles.add(role)
            e.max_tokens = max(e.max_tokens, int(getattr(p.cfg, role).max_tokens))
            p.engine_ids[role] = e.id

    async def get(self, key: str) -> Engine:
        e = self.engines[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if e.engine is None:
                started = time.perf_counter()
                e.engine = await e.factory.start_model(e.started_model(), e.role_key)
                e.start_s += time.perf_counter() - started
                e.starts += 1
                self.log(
                    f"sweep: engine {e.id} ({e.model.name}, {e.factory.kinds[e.role_key]}) started in "
                    f"{time.perf_counter() - started:.1f} s for point(s) {', '.join(f'#{n}' for n in sorted(e.points))}"
                )
        assert e.engine is not None
        return e.engine

    async def close(self, key: str) -> None:
        e = self.engines[key]
        if e.engine is not None:
            engine, e.engine = e.engine, None
            await engine.close()

    async def keep_only(self, keys: set[str]) -> None:
        """Close the engines this group does not use (and any that died), freeing their memory first."""
        for key, e in self.engines.items():
            if e.engine is not None and (key not in keys or e.dead):
                await self.close(key)
            if key in keys:
                e.dead = False

    async def close_all(self) -> None:
        for key in self.engines:
            await self.close(key)


# ---- groups: the memory plan --------------------------------------------------------


def _plan_of(engines: list[SharedEngine], cfg: Any) -> Any:
    """`ncp_local.plan.check` on the group's distinct engines, one pseudo-role each."""
    names = tuple(_plan_role(e) for e in engines)
    fake = SimpleNamespace(
        engine=cfg.engine,
        plan=cfg.plan,
        **{
            n: SimpleNamespace(
                model=(e.started_model() if e.engine is not None else e.model),
                max_tokens=e.max_tokens,
                engine=e.factory.kinds[e.role_key],
            )
            for n, e in zip(names, engines, strict=True)
        },
    )
    bound = Bindings(
        cfg.engine,
        {
            n: Binding(
                role=n,
                engine=e.factory.kinds[e.role_key],
                model=(e.started_model() if e.engine is not None else e.model),
                sampling=Sampling(max_tokens=e.max_tokens),
                bounds=Bounds(),
                endpoint={},
                own_endpoint=frozenset(),
            )
            for n, e in zip(names, engines, strict=True)
        },
    )
    return check(fake, names, bindings=bound)


def _plan_role(e: SharedEngine) -> str:
    """The engine's pseudo-role in `_plan_of`'s plan."""
    return f"engine_{e.id}"


def fits(engines: list[SharedEngine], cfg: Any) -> bool:
    return not _plan_of(engines, cfg).fatal


def groups(points: list[Point], pool: SharedEngines) -> list[list[Point]]:
    """Points in order, cut into groups whose engines fit together; a run directory at most once per group."""
    out: list[list[Point]] = []
    current: list[Point] = []
    for p in points:
        keys = {k for q in current for k in q.keys.values()} | set(p.keys.values())
        clash = p.out in {q.out for q in current}
        if current and (clash or not fits([pool.engines[k] for k in sorted(keys)], p.cfg)):
            out.append(current)
            current = []
        current.append(p)
    if current:
        out.append(current)
    return out


def place(group: list[Point], pool: SharedEngines) -> None:
    """Shares and devices for the group's engines as the plan gives them together (engines already
    running keep theirs: the plan takes them as set)."""
    keys = sorted({k for p in group for k in p.keys.values()})
    engines = [pool.engines[k] for k in keys]
    plan = _plan_of(engines, group[0].cfg)
    # The plan has engines for the in-process (vLLM) ones only (none for scripted or openai), one per
    # distinct model: each is found by its pseudo-roles, not by position.
    planned = {role: ep for ep in plan.engines for role in ep.roles}
    for e in engines:
        ep = planned.get(_plan_role(e))
        if e.engine is not None or ep is None:
            continue
        change: dict[str, Any] = {}
        if ep.share_planned and ep.share is not None:
            change["gpu_memory_utilization"] = ep.share
        if ep.devices_planned and ep.devices:
            change["devices"] = list(ep.devices)
        e.placement = change


# ---- the index ----------------------------------------------------------------------


def run_root(p: Point) -> Path:
    """The point's run directory (a sharded point writes its shard's subdirectory of it)."""
    assert p.out is not None
    return p.out.parent if p.cfg is not None and p.cfg.shard.count > 1 else p.out


def write_index(
    sweep_dir: Path,
    points: Sequence[Point],
    pool: SharedEngines | None,
    launcher: str,
    groups_: Sequence[Sequence[Point]] = (),
    name: str = INDEX,
) -> Path:
    rows = [
        PointRow(
            job=p.num,
            overrides=p.overrides,
            mode=p.mode,
            run_dir=str(run_root(p).resolve()) if p.out is not None else None,
            shard_dir=str(p.out.resolve()) if p.out is not None and run_root(p) != p.out else None,
            status=p.status,
            exit_code=p.code,
            error=p.message,
            engines=p.engine_ids,
        )
        for p in points
    ]
    engines = [e.describe() for e in pool.engines.values()] if pool else []
    return sweep_index.write(sweep_dir, rows, engines, [[p.num for p in g] for g in groups_], launcher, name)


def record_point(sweep_dir: Path, num: int, overrides: Sequence[str], code: int, task: Any) -> None:
    """The basic launcher's index: one point after the other, each row as its point ends."""
    p = Point(num, tuple(overrides), task=task, code=code, status="done" if code == 0 else "failed")
    try:
        raw = OmegaConf.to_container(task, resolve=True)
        cfg = config_mod.validate(raw)  # type: ignore[arg-type]
        p.cfg, p.mode = cfg, cfg.mode
        if cfg.mode == "run":
            key = identity_mod.of_run(cfg, raw).key  # type: ignore[arg-type]
            p.out = layout.shard_dir(cfg, layout.run_dir(cfg, key))
    except Exception:  # a point refused as bad input has no run directory; its row still says so
        pass
    name = sweep_index.name_for(p.cfg)
    rows = [r for r in (sweep_index.read_rows(sweep_dir / name) or []) if r.job != num]
    known = [
        Point(
            r.job,
            r.overrides,
            mode=r.mode,
            out=Path(r.run_dir) if r.run_dir else None,
            status=r.status,
            code=r.exit_code,
            message=r.error,
        )
        for r in rows
    ]
    write_index(sweep_dir, sorted([*known, p], key=lambda q: q.num), None, "basic", name=name)


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
    engines = {
        role: pool.engines[p.keys[role]].describe().model_dump(mode="json", exclude={"roles"}, exclude_none=True)
        for role in ROLES
    }
    m["sweep"] = {
        "dir": str(sweep_dir.resolve()),
        "job": p.num,
        "launcher": "batched",
        "pid": os.getpid(),
        "engines": engines,
    }
    return m


def _cfg(p: Point) -> config_mod.RunConfig:
    """The config of a point `prepare` validated: one that runs or ran (a runnable point, one with
    results), or one of another mode (its mode is read from that config)."""
    assert p.cfg is not None, f"sweep point {p.name}: no validated config"
    return p.cfg


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
            enabled=bool(first and first.progress), every_s=float(getattr(first, "progress_every_s", 30.0) or 30.0)
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
            self.progress.add_run(p.name, _episodes(p), _cfg(p).max_turns, p.out)
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
                        f"engine {e.id} ({e.model.name}) did not start: {type(exc).__name__}: {exc}".splitlines()[0],
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
        self.progress.point(p.name, "done" if p.status == "done" else "failed")
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
    cfgs = [_cfg(p) for p in with_results]  # a point with results ran
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
    reaudits = [p for p in points if p.mode == "reaudit" and p.status == "done" and len(_cfg(p).runs) == 1]
    if reaudits:
        for p in reaudits:
            p.out = point_dir(_cfg(p), p.raw or {})
        sweep.index()
        first = _cfg(reaudits[0])
        if len(reaudits) > 1 and len({tuple(_cfg(p).runs) for p in reaudits}) == 1:
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


def mark_swept(points: Sequence[Point]) -> None:
    """Name each point by the overrides that differ between points (all of them are in the index)."""
    given = [dict(o.partition("=")[::2] for o in p.overrides) for p in points]
    keys = {k for g in given for k in g}
    varying = {k for k in keys if len({g.get(k) for g in given}) > 1}
    for p in points:
        p.swept = tuple(o for o in p.overrides if o.partition("=")[0] in varying)
