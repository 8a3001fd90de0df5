"""The run directory's layout, in one place: where a run lives, its shards, its manifest.

runs/<dataset>-<identity key>/       (or `out_dir`)
  manifest.json  results/  checkpoints/  calls.jsonl  engine.log  .lock  status.json (the heartbeat)
  shard-iii-of-nnn/                  (a Slurm array task's part, the same inside, DONE when finished)
  submit.json  slurm/  endpoint-<role>  (a Slurm submission's record, task logs, served role's URL)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..config import ConfigError, RunConfig
from ..errors import InputError, shown
from ..protocol.trials import episode_names, story_of
from .formats import check_version
from .turn_log import SUFFIX, turns_logged

MANIFEST = "manifest.json"
RESULTS = "results"
CHECKPOINTS = "checkpoints"
QUARANTINE = "quarantine"
CALLS = "calls.jsonl"
DONE = "DONE"
LOCK = ".lock"
ENGINE_LOG = "engine.log"  # the engine's and libraries' output (execution/engine_log.py)
STATUS = "status.json"  # the running process's heartbeat (execution/heartbeat.py): bookkeeping, never a result
SUBMIT_STATE = "submit.json"  # a Slurm submission: shard count, identity, jobs queued (launch/submit.py)
SLURM_LOGS = "slurm"  # the array tasks' and the server's logs
# The kind each part must have (a wrong kind is refused, never worked around).
RUN_FOLDERS = (RESULTS, CHECKPOINTS, QUARANTINE)
RUN_FILES = (LOCK, CALLS, DONE, ENGINE_LOG, STATUS)
# What makes a folder a run directory: a non-empty folder with neither is someone else's.
RUN_MARKERS = (MANIFEST, RESULTS)
SHARD = re.compile(r"^shard-(\d+)-of-(\d+)$")
T = TypeVar("T")


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:03d}-of-{count:03d}"


def run_dir(cfg: RunConfig, key: str) -> Path:
    """`out_dir`, else `runs/<dataset>-<identity key>`."""
    if cfg.out_dir:
        return Path(cfg.out_dir).expanduser()
    return Path("runs") / f"{cfg.dataset.name}-{key}"


def shard_path(root: Path, index: int, count: int) -> Path:
    """Shard `index` of `count`'s directory in the run directory `root`."""
    return root / shard_name(index, count)


def shard_dir(cfg: RunConfig, root: Path) -> Path:
    """Each array task writes only under its own directory; merge joins them."""
    if cfg.shard.count == 1:
        return root
    return shard_path(root, cfg.shard.index, cfg.shard.count)


def shard_of(specs: Sequence[T], index: int, count: int) -> tuple[T, ...]:
    """Task i of n takes specs i, i+n, i+2n, ... (balanced; stable for a given index)."""
    return tuple(specs[index::count])


def trials_together(stories: int, trials: int, count: int) -> bool:
    """Whether `count` shards keep each story's trials in the story's shard (True) or deal the episodes
    out one by one (False): together unless that leaves the largest shard with more episodes. Together,
    a story's trials share their prompts' prefixes in one engine's cache."""
    return -(-stories // count) * trials <= -(-(stories * trials) // count)


def shard_episodes(spec_ids: Sequence[str], trials: int, index: int, count: int) -> tuple[str, ...]:
    """The episodes shard `index` of `count` plays: every trial of its stories (`shard_of`), or, when
    that balances worse (`trials_together`), episodes i, i+n, ... of the run's episodes in order."""
    if trials_together(len(spec_ids), trials, count):
        return tuple(episode_names(shard_of(spec_ids, index, count), trials))
    return shard_of(episode_names(spec_ids, trials), index, count)


def _check_shard(cfg: RunConfig) -> None:
    if cfg.shard.index >= cfg.shard.count:
        raise ConfigError("shard.index", f"{cfg.shard.index} is not below shard.count={cfg.shard.count}")


def run_episodes(cfg: RunConfig, spec_ids: Sequence[str]) -> tuple[str, ...]:
    """The episodes this run plays, of the dataset's (limited) specs: every trial of each, or its shard's."""
    if cfg.shard.count == 1:
        return tuple(episode_names(spec_ids, cfg.trials.count))
    _check_shard(cfg)
    return shard_episodes(spec_ids, cfg.trials.count, cfg.shard.index, cfg.shard.count)


def shard_specs(cfg: RunConfig, specs: Sequence[Any]) -> tuple[Any, ...]:
    """This run's specs (objects with an `id`): all of them, or those its shard plays an episode of."""
    if cfg.shard.count == 1:
        # Unsharded: the whole run, whatever $SLURM_ARRAY_TASK_ID says (Hydra's
        # submitit launcher runs each sweep point as a task of an array job).
        return tuple(specs)
    _check_shard(cfg)
    mine = {story_of(e) for e in run_episodes(cfg, [s.id for s in specs])}
    return tuple(s for s in specs if s.id in mine)


def sharding_note(cfg: RunConfig, stories: int) -> str | None:
    """One line saying how the shards split a story's trials (None: no shards or one trial)."""
    n, k = cfg.shard.count, cfg.trials.count
    if n == 1 or k == 1:
        return None
    if trials_together(stories, k, n):
        return f"{n} shards keep each story's {k} trials together (stories dealt out; the larger share of cache)"
    return f"{n} shards deal out the {stories * k} episodes one by one (a story's trials apart balances better)"


def result_file(run_dir: Path, episode: str) -> Path:
    """Where a finished episode's result is (a shard directory holds its own); `episode`: its name
    (protocol/trials.py), the spec id for trial 0."""
    return run_dir / RESULTS / f"{episode}.json"


def turns_recorded(path: Path) -> int:
    """Turns a result or checkpoint file records, read without its check (progress and status count with
    it while the run writes); 0 when unreadable: the store deals with damage when it opens the run."""
    if path.name.endswith(SUFFIX):
        return turns_logged(path)
    try:
        data = json.loads(path.read_bytes())
        return len(data.get("turns") or ()) if isinstance(data, dict) else 0
    except (OSError, ValueError):
        return 0


def is_done(run_dir: Path) -> bool:
    """The run (or shard) directory's DONE marker: every episode it was given has finished."""
    return (run_dir / DONE).exists()


def shard_finished(root: Path, index: int, count: int, spec_ids: Sequence[str], trials: int = 1) -> bool:
    """Shard `index` of `count` of the run in `root` has its DONE marker and the result of every
    episode it plays: each trial of each spec it takes (the marker alone could be a different split's)."""
    d = shard_path(root, index, count)
    return is_done(d) and all(result_file(d, e).exists() for e in shard_episodes(spec_ids, trials, index, count))


def endpoint_file(root: Path, role: str) -> Path:
    """The file a served role's URL is written to once its server answers (slurm/serve.sbatch)."""
    return root / f"endpoint-{role}"


def shard_dirs(root: Path) -> dict[int, dict[int, Path]]:
    """{count: {index: directory}} for every `shard-iii-of-nnn` directory under root."""
    out: dict[int, dict[int, Path]] = {}
    if root.is_dir():
        for p in sorted(root.iterdir()):
            m = SHARD.match(p.name)
            if m and p.is_dir():
                out.setdefault(int(m.group(2)), {})[int(m.group(1))] = p
    return out


def parts(root: Path) -> list[Path]:
    """The run directory and its shard directories, in name order."""
    return [root, *(p for p in sorted(root.iterdir()) if p.is_dir() and SHARD.match(p.name))] if root.is_dir() else []


class _DatasetRecord(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: str | None = None
    sha256: str | None = None
    specs: list[str] | None = None
    files: dict[str, str] | None = None


class ManifestShape(BaseModel):
    """The parts of a manifest that readers use, and the shape each must have (written by
    `execution/life.manifest`, the re-audit, the build and the merge; other keys are free)."""

    model_config = ConfigDict(extra="allow")
    identity: str | None = None
    identity_parts: dict[str, Any] | None = None
    kind: str | None = None
    config: dict[str, Any] | None = None
    dataset: _DatasetRecord | None = None
    prompts: dict[str, Any] | None = None
    models: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    resumes: list[Any] | None = None


def manifest_problem(data: Any) -> str | None:
    """Why a parsed manifest is not one (its first wrong field), or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    try:
        ManifestShape.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"{where}: {err['msg'].lower()} (got {shown(err.get('input'))}): edited or damaged"
    return None


def read_manifest(path: Path, field: str = "") -> dict[str, Any]:
    """A run's manifest for readers: {} when absent, a one-line InputError (naming `field`) when damaged."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, field, f"cannot read the manifest: {exc}") from None
    if isinstance(data, dict):
        check_version(path, data, "manifest")
    problem = manifest_problem(data)
    if problem:
        raise InputError(
            path,
            field,
            f"not a run manifest: {problem}; re-running the run's own command "
            "moves it to quarantine/ and writes a new one",
        )
    return data


def require_finished(runs: Sequence[str]) -> None:
    """A run directory with no finished episode would give an empty report, re-audit or review and exit 0."""
    for d in runs:
        root = Path(d).expanduser()
        found = parts(root)
        # Only run directories: anything else gets the report's own "not a run directory".
        if any((p / RESULTS).is_dir() for p in found) and not any(any(p.glob(f"{RESULTS}/*.json")) for p in found):
            raise InputError(
                root,
                "runs",
                "no finished episode (results/ is empty): nothing to report; "
                "finish the run first (its own command resumes it)",
            )


def shared_run_dir(points: Iterable[tuple[str, Path, str]]) -> InputError | None:
    """Sweep points (name, run directory, identity key) that would share one run directory although
    they are different experiments: the second would be refused as "another config" only after the
    first ran. None when every directory holds one experiment (points of one experiment, e.g. other
    `limit`s, may share theirs: they run one after the other)."""
    seen: dict[Path, dict[str, str]] = {}
    for name, out, key in points:
        keys = seen.setdefault(Path(out).expanduser().resolve(), {})
        keys.setdefault(key, name)
        if len(keys) > 1:
            first, second = keys.values()
            return InputError(
                out,
                "out_dir",
                f"one run directory for several sweep points of different "
                f"experiments ({first}; {second}): none is started; drop out_dir (each point "
                "gets runs/<dataset>-<hash>) or make it differ by point, e.g. "
                "out_dir=runs/x-${seed}",
            )
    return None
