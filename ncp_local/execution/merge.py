"""Join a sharded run (Slurm array tasks) into one set of results.

Task i of n wrote `<run>/shard-iii-of-nnn/results/`; the merge checks that
the shards form one run (same config identity, same spec list), that every
episode of the run (each trial of each spec) has exactly one result across the shards, and copies the
results byte for byte into `<run>/merged/results/`, beside a manifest naming
each result's shard. The shards are only read, so a merge can be repeated.

    python run.py mode=merge out_dir=<run>
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..protocol.trials import episode_names, parse_episode, story_of
from ..rundir import provenance
from ..rundir.atomic import atomic_write
from ..rundir.layout import LOCK, MANIFEST, RESULTS, is_done, read_manifest, shard_dirs
from ..rundir.places import check_destination
from ..rundir.seals import check_result
from ..rundir.store import RunDir

MERGED = "merged"


class MergeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Merged:
    root: Path  # the run directory; results are in root/merged/results
    count: int  # shards
    specs: tuple[str, ...]  # the run's episodes (protocol/trials.py), in dataset order, a story's trials together
    ignored: int  # results in the shards that are not specs of this run (e.g. an earlier, larger `limit`)
    manifest: dict[str, Any]  # the first shard's manifest (config, versions, dataset)
    problems: tuple[str, ...] = ()  # result files that failed their check: named, never merged

    @property
    def out(self) -> Path:
        return self.root / MERGED


def shard_state(path: Path) -> str:
    """done, running (a process holds its lock) or unfinished."""
    if is_done(path):
        return "done"
    lock = path / LOCK
    if lock.exists():
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "running"
        finally:
            os.close(fd)
    return "unfinished"


def _manifest(path: Path) -> dict[str, Any]:
    if not (path / MANIFEST).is_file():
        raise MergeError(f"{path}: no manifest.json (the task never started; re-submit it)")
    try:
        return read_manifest(path / MANIFEST)
    except InputError as exc:
        raise MergeError(str(exc)) from None


def _few(items: list[str], k: int = 5) -> str:
    return ", ".join(items[:k]) + (f", ... ({len(items)} in all)" if len(items) > k else "")


def merge(root: str | Path) -> Merged:
    root = Path(root)
    layouts = shard_dirs(root)
    if not layouts:
        raise MergeError(f"{root}: no shard-iii-of-nnn directories (not a sharded run, or not started)")
    if len(layouts) > 1:
        names = ", ".join(f"of-{n:03d}" for n in sorted(layouts))
        raise MergeError(f"{root}: shards of several layouts ({names}); keep one (the others are stale)")
    ((count, shards),) = layouts.items()
    absent = [i for i in range(count) if i not in shards]
    if absent:
        raise MergeError(
            f"{root}: shard(s) {_few([str(i) for i in absent])} of {count} have no directory (never started; re-submit)"
        )
    manifests = {i: _manifest(shards[i]) for i in range(count)}
    first = manifests[0]
    for i, m in manifests.items():
        if not (m.get("dataset") or {}).get("specs"):
            # Without it the merge cannot know which results make the run: it would "succeed" with none.
            raise MergeError(
                f"{shards[i] / 'manifest.json'}: dataset.specs: missing or empty (not a manifest "
                "a run wrote, or edited); restore it, or move it aside and re-run that shard's task "
                "(it writes a new one and keeps the sealed results)"
            )
        if m.get("identity") != first.get("identity"):
            raise MergeError(
                f"{shards[i] / 'manifest.json'}: identity: {m.get('identity')} differs from shard 0's "
                f"{first.get('identity')} (shards of different configs)"
            )
        if m["dataset"]["specs"] != first["dataset"]["specs"]:
            raise MergeError(
                f"{shards[i] / 'manifest.json'}: dataset.specs differs from shard 0's (different dataset or limit)"
            )
    stories: list[str] = list(first["dataset"]["specs"])
    wanted = set(stories)
    source: dict[str, int] = {}  # episode name -> its shard
    duplicated: list[str] = []
    problems: list[str] = []
    ignored = 0
    for i in range(count):
        for path in sorted((shards[i] / RESULTS).glob("*.json")):
            name = path.stem
            # The run's own check (seal, spec, identity, dataset): a failing file is
            # named and left out; re-submitting its shard plays the episode again.
            _, why = check_result(path, manifests[i])
            if why:
                problems.append(f"{path}: {why}")
                continue
            if story_of(name) not in wanted:
                ignored += 1
            elif name in source:
                duplicated.append(f"{name} (shards {source[name]} and {i})")
            else:
                source[name] = i
    if duplicated:
        raise MergeError(f"{root}: duplicated result(s): {_few(duplicated)}")
    # Trials: the run played each story as often as its most-played story (a count is not part of
    # the identity, so the shards' results say it); a story short of a trial is missing that episode.
    trials = 1 + max((parse_episode(name)[1] for name in source), default=0)
    expected = episode_names(stories, trials)
    missing = [s for s in expected if s not in source]
    if missing:
        states = ", ".join(f"{i}: {shard_state(shards[i])}" for i in range(count) if shard_state(shards[i]) != "done")
        bad = f"; {len(problems)} result file(s) failed their check ({_few(problems, 2)})" if problems else ""
        raise MergeError(
            f"{root}: {len(missing)} of {len(expected)} episode(s) have no result ({_few(missing)}); "
            f"shards not done: {states or 'none'}{bad}; re-submit to finish them"
        )

    check_destination(root / MERGED, "out_dir")
    out = RunDir(root / MERGED)
    for spec in expected:
        src = RunDir(shards[source[spec]]).result_path(spec)
        atomic_write(out.result_path(spec), src.read_text(encoding="utf-8"))
    for stale in out.results.glob("*.json"):
        if stale.stem not in expected:
            stale.unlink()
    atomic_write(
        out.manifest_path,
        json.dumps(
            {
                "merged": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "merged_by": {k: v for k, v in provenance.environment().items() if k != "packages"},
                "identity": first.get("identity"),
                "identity_parts": first.get("identity_parts"),
                "shards": count,
                "config": first.get("config"),
                "dataset": first.get("dataset"),
                "prompts": first.get("prompts"),
                "models": first.get("models"),
                "versions": first.get("versions"),
                "lock": first.get("lock"),
                "git_revision": {shards[i].name: manifests[i].get("git_revision") for i in range(count)},
                "source": {name: shards[source[name]].name for name in expected},
                **({"trials": trials} if trials > 1 else {}),
            },
            indent=2,
            default=str,
        ),
    )
    return Merged(
        root=root, count=count, specs=tuple(expected), ignored=ignored, manifest=first, problems=tuple(problems)
    )
