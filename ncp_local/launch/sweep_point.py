"""One point of a batched sweep: its overrides and config, what its run needs, and how it went.

`prepare` checks a point as its own job would before anything starts (config, plan, dataset, prompt
pack, method options, model paths, run directory); a point that fails is marked failed with its exit
code and one line, and the sweep goes on without it. `mark_swept` names each point by the overrides
that set it apart from the others.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..bindings import bind
from ..errors import InputError
from ..execution import points
from ..execution.engine_pool import EnginePool
from ..execution.preflight import Ready
from ..exits import EXIT_BAD_INPUT, EXIT_FAILED
from ..modes import find
from ..protocol import ROLES
from ..rundir import identity as identity_mod
from ..rundir.places import check_outputs, check_place


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
        check_outputs(find(cfg.mode).writes, raw)  # as run.py's entry checks them (modes/_dispatch.py)
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


def point_cfg(p: Point) -> config_mod.RunConfig:
    """The config of a point `prepare` validated: one that runs or ran (a runnable point, one with
    results), or one of another mode (its mode is read from that config)."""
    assert p.cfg is not None, f"sweep point {p.name}: no validated config"
    return p.cfg


def mark_swept(points: Sequence[Point]) -> None:
    """Name each point by the overrides that differ between points (all of them are in the index)."""
    given = [dict(o.partition("=")[::2] for o in p.overrides) for p in points]
    keys = {k for g in given for k in g}
    varying = {k for k in keys if len({g.get(k) for g in given}) > 1}
    for p in points:
        p.swept = tuple(o for o in p.overrides if o.partition("=")[0] in varying)
