"""A sweep's index (`index.json`, `index.md` in the sweep folder): one row per point, and its engines.

The batched launcher writes the whole index as its points progress (`write_index`); the basic
launcher, which runs one point after the other, adds each point's row as the point ends
(`record_point`). The file format is rundir/sweep_index.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .. import config as config_mod
from ..execution.engine_pool import EnginePool
from ..execution.life import Point
from ..report.headline import Headline, headline
from ..rundir import identity as identity_mod
from ..rundir import layout, sweep_index
from ..rundir.sweep_index import INDEX, PointRow


def run_root(p: Point) -> Path:
    """The point's run directory (a sharded point writes its shard's subdirectory of it)."""
    assert p.out is not None
    return p.out.parent if p.cfg is not None and p.cfg.shard.count > 1 else p.out


def _figures(p: Point) -> dict[str, Any]:
    """A done run point's avg turns and turns kept for its row (none for other points, nor for a shard's
    point: its run is whole only once every shard is, and its report reads it then)."""
    if p.status != "done" or p.mode != "run" or p.out is None or run_root(p) != p.out:
        return {}
    h: Headline | None = headline(run_root(p), p.cfg.report.horizon if p.cfg is not None else None)
    return {} if h is None else {"avg_turns": h.avg_turns, "turns_kept": h.turns_kept, "horizon": h.horizon}


def write_index(
    sweep_dir: Path,
    points: Sequence[Point],
    pool: EnginePool | None,
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
            **_figures(p),
        )
        for p in points
    ]
    engines = [e.describe() for e in pool.engines.values()] if pool else []
    return sweep_index.write(sweep_dir, rows, engines, [[p.num for p in g] for g in groups_], launcher, name)


def record_point(
    sweep_dir: Path,
    num: int,
    overrides: Sequence[str],
    code: int | None,
    task: Any,
    error: str = "",
    planned: Sequence[Sequence[str]] = (),
) -> None:
    """The basic launcher's index, one point after the other: each point's row as it starts (`code` None:
    running, with its run directory, so the sweep is watched from its first point) and as it ends
    (`error`: the line that refused it up front); `planned`, every point's overrides in job order, adds
    a waiting row for each point not in the index yet."""
    status = "running" if code is None else "done" if code == 0 else "failed"
    p = Point(num, tuple(overrides), task=task, code=code, status=status, message=error)
    try:
        raw = OmegaConf.to_container(task, resolve=True)
        cfg = config_mod.validate(raw)  # type: ignore[arg-type]
        p.cfg, p.mode = cfg, cfg.mode
        if cfg.mode == "run":
            key = identity_mod.of_run(cfg).key
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
    seen = {q.num for q in known} | {num}
    waiting = [Point(n, tuple(o)) for n, o in enumerate(planned) if n not in seen]
    write_index(sweep_dir, sorted([*known, *waiting, p], key=lambda q: q.num), None, "basic", name=name)
