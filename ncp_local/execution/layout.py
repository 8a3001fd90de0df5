"""The run directory's layout, in one place: where a run lives, its shards, its manifest.

    runs/<dataset>-<identity key>/       (or `out_dir`)
      manifest.json  results/  checkpoints/  calls.jsonl  .lock
      shard-iii-of-nnn/                  (a Slurm array task's part, the same inside)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence, TypeVar

from ..config import ConfigError, RunConfig
from ..errors import InputError

MANIFEST = "manifest.json"
RESULTS = "results"
SHARD = re.compile(r"^shard-(\d+)-of-(\d+)$")
T = TypeVar("T")


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:03d}-of-{count:03d}"


def run_dir(cfg: RunConfig, key: str) -> Path:
    """`out_dir`, else `runs/<dataset>-<identity key>`."""
    if cfg.out_dir:
        return Path(cfg.out_dir).expanduser()
    return Path("runs") / f"{cfg.dataset.name}-{key}"


def shard_dir(cfg: RunConfig, root: Path) -> Path:
    """Each array task writes only under its own directory; merge joins them."""
    if cfg.shard.count == 1:
        return root
    return root / shard_name(cfg.shard.index, cfg.shard.count)


def shard_specs(cfg: RunConfig, specs: Sequence[T]) -> tuple[T, ...]:
    """Task i of n takes specs i, i+n, i+2n, ... (balanced; stable for a given index)."""
    if cfg.shard.count == 1:
        # Unsharded: the whole run, whatever $SLURM_ARRAY_TASK_ID says (Hydra's
        # submitit launcher runs each sweep point as a task of an array job).
        return tuple(specs)
    if cfg.shard.index >= cfg.shard.count:
        raise ConfigError("shard.index", f"{cfg.shard.index} is not below shard.count={cfg.shard.count}")
    return tuple(specs[cfg.shard.index::cfg.shard.count])


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
    return [root, *(p for p in sorted(root.iterdir()) if p.is_dir() and SHARD.match(p.name))] if root.is_dir() \
        else []


def read_manifest(path: Path, field: str = "") -> dict[str, Any]:
    """A run's manifest for readers: {} when absent, a one-line InputError (naming `field`) when damaged."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, field, f"cannot read the manifest: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(path, field, "the manifest is not a JSON object")
    return data


def require_finished(runs: Sequence[str]) -> None:
    """A run directory with no finished episode would give an empty report, re-audit or review and exit 0."""
    for d in runs:
        root = Path(d).expanduser()
        found = parts(root)
        # Only run directories: anything else gets the report's own "not a run directory".
        if any((p / RESULTS).is_dir() for p in found) and not any(any(p.glob(f"{RESULTS}/*.json")) for p in found):
            raise InputError(root, "runs", "no finished episode (results/ is empty): nothing to report; "
                             "finish the run first (its own command resumes it)")
