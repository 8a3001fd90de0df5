"""A sweep folder's index: `index.json` (one per shard when array tasks run shards of one sweep)
and its `index.md` table: job number, overrides, run directory, status and exit code of every
point, and the engines a batched sweep shared. Written by both launchers, read by reports.

The index is `SweepIndex`; each point's row `PointRow`, each shared engine `EngineRow`. The launchers
build the rows, the reports and the array tasks' checks read them, all through these models."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, ValidationError, model_serializer

from ..config import RunConfig
from ..errors import InputError
from .atomic import atomic_write
from .formats import check_version, stamped
from .layout import shard_name
from .provenance import command, now

INDEX = "index.json"
KIND = "ncp-sweep"
# In each point's folder (`<sweep>/<job>/`): a link to the point's run directory, which lives under runs/.
POINT_LINK = "run"
# An index is a few kilobytes a point; a larger file than this is not one (mode=status reads it as given).
MAX_BYTES = 64_000_000


class _Row(BaseModel):
    # A newer rig may add keys within a format version: read what this one knows.
    model_config = ConfigDict(frozen=True, extra="ignore")
    # Keys a row leaves out at these values: it says only what its point or engine has.
    _UNSAID: ClassVar[Mapping[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _leave_out_unsaid(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key, empty in self._UNSAID.items():
                if key in data and data[key] == empty:
                    del data[key]
        return data


class PointRow(_Row):
    """One point of the sweep: its job number and overrides, where it ran, and how it ended."""

    job: int
    overrides: tuple[str, ...] = ()
    mode: str = "run"
    run_dir: str | None = None  # the point's run directory (None: refused before it had one)
    shard_dir: str | None = None  # the shard's directory inside it, when array tasks ran shards
    status: str = ""  # pending, running, done, failed, skipped ...
    exit_code: int | None = None
    error: str = ""  # why it failed or was refused (left out when empty)
    engines: dict[str, str] = {}  # role -> the shared engine that served it (batched launcher)
    # A done run's mean turns and turns kept (the restricted mean to `horizon`): report/headline.py.
    avg_turns: float | None = None
    turns_kept: float | None = None
    horizon: int | None = None

    _UNSAID: ClassVar[Mapping[str, Any]] = {
        "shard_dir": None,
        "error": "",
        "engines": {},
        "avg_turns": None,
        "turns_kept": None,
        "horizon": None,
    }


class EngineRow(_Row):
    """One engine a batched sweep started and shared among its points."""

    id: str
    model: str
    engine: str  # its kind (engines/registry.py)
    roles: tuple[str, ...]
    points: tuple[int, ...]
    starts: int
    start_s: float = 0.0
    placement: dict[str, Any] | None = None  # GPUs and memory share it was placed with, if any

    _UNSAID: ClassVar[Mapping[str, Any]] = {"placement": None}


class SweepIndex(_Row):
    kind: Literal["ncp-sweep"] = "ncp-sweep"
    # Who wrote it and when: the points are what readers need; these say where they came from.
    launcher: str = ""
    updated: str = ""
    command: str | None = None
    pid: int | None = None
    host: str = ""  # where that process runs (its pid says something only there)
    points: tuple[PointRow, ...]
    engines: tuple[EngineRow, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()  # job numbers that ran together on the same engines


def name_for(cfg: RunConfig | None) -> str:
    """`index.json`, or one per shard when array tasks run shards of the same sweep (never one file for two);
    a point refused before its config validated (None) writes the plain index."""
    if cfg is None or cfg.shard.count == 1:
        return INDEX
    return shard_index(cfg.shard.index, cfg.shard.count)


def shard_index(index: int, count: int) -> str:
    """The index array task `index` of `count` writes for its shard of every point."""
    return f"index-{shard_name(index, count)}.json"


def write(
    sweep_dir: Path,
    rows: Sequence[PointRow],
    engines: Sequence[EngineRow],
    groups: Sequence[Sequence[int]],
    launcher: str,
    name: str = INDEX,
) -> Path:
    """index.json (and its index.md table): every point's row, the shared engines, the groups."""
    index = SweepIndex(
        launcher=launcher,
        updated=now(),
        command=command().get("line"),
        # The batched launcher runs every point in this one process; the basic one, one after the other.
        pid=os.getpid(),
        host=socket.gethostname(),
        points=tuple(rows),
        engines=tuple(engines),
        groups=tuple(tuple(g) for g in groups),
    )
    doc = index.model_dump(mode="json")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(sweep_dir / name, json.dumps(stamped(doc, "sweep_index"), indent=2, default=str))
    lines = [
        "| job | status | exit | avg turns | turns kept | run directory | overrides |",
        "|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.job} | {r.status} | {'' if r.exit_code is None else r.exit_code} | {_num(r.avg_turns)} | "
            f"{_num(r.turns_kept)} | {r.run_dir or '-'} | {' '.join(r.overrides)} |"
        )
    if engines:
        lines += ["", "| engine | model | roles | points | starts |", "|---|---|---|---|---:|"]
        lines += [
            f"| {e.id} | {e.model} | {', '.join(e.roles)} | {' '.join(f'#{n}' for n in e.points)} | {e.starts} |"
            for e in engines
        ]
    atomic_write(sweep_dir / name.replace(".json", ".md"), "\n".join(lines) + "\n")
    for r in rows:
        if r.run_dir:
            link_point(sweep_dir / str(r.job), Path(r.run_dir))
    return sweep_dir / name


def link_point(folder: Path, run_dir: Path) -> None:
    """`<sweep>/<job>/run` -> the point's run directory: the point's folder says where its run is. A
    courtesy: a file system without links, or a link already there, leaves it as it is."""
    link = folder / POINT_LINK
    if link.is_symlink() and os.readlink(link) == str(run_dir):
        return
    if folder.resolve() in (run_dir.resolve(), *run_dir.resolve().parents):
        return  # the run lives in the point's folder itself (out_dir=${hydra:sweep.dir}/${hydra:job.num})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(run_dir, target_is_directory=True)
    except OSError:
        pass


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _parse(path: Path, doc: Any) -> SweepIndex:
    if not isinstance(doc, dict) or doc.get("kind") != KIND or not isinstance(doc.get("points"), list):
        raise InputError(path, "runs", f"not a sweep index (kind {KIND} with a list of points)")
    check_version(path, doc, "sweep_index")
    try:
        return SweepIndex.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InputError(path, where, f"{err['msg'].lower()} (a damaged sweep index?)") from None


def read_sweep(sweep_dir: Path) -> list[SweepIndex]:
    """A sweep folder's index files (one per shard when sharded); [] if there is none. A damaged one
    (unreadable, too large, not an index): an InputError naming it."""
    out: list[SweepIndex] = []
    for path in sorted(Path(sweep_dir).glob("index*.json")):
        try:
            if path.stat().st_size > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES // 1_000_000} MB")
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            raise InputError(path, "runs", f"cannot read the sweep index: {exc}".splitlines()[0][:200]) from None
        out.append(_parse(path, doc))
    return out


def read_index(sweep_dir: Path) -> list[PointRow]:
    """Every point row of a sweep folder's index files (one per shard when sharded); [] if there is none."""
    return [r for index in read_sweep(sweep_dir) for r in index.points]


def read_rows(path: Path) -> list[PointRow] | None:
    """A sweep index's rows, None when unreadable or damaged (the launcher then writes a new one); one of
    a newer rig's format is refused (`NewerFormat`), never overwritten."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    check_version(path, doc, "sweep_index")
    try:
        return list(_parse(path, doc).points)
    except InputError:
        return None
