"""The run directory: results, checkpoints, call log, manifest, lock.

Layout:
    manifest.json            written once: identity and its parts, resolved config,
                             command, versions, git, hardware; plus `resumes`
    results/<episode>.json      one finished episode each (<spec> for trial 0, <spec>~t<k> for trial k)
    checkpoints/<episode>.jsonl a line per committed turn of an unfinished episode (rundir/turn_log.py;
                                `<episode>.json`, the whole last turn, in runs of format 1)
    quarantine/              files that failed verification, moved aside
    calls.jsonl              every model call attempt (append-only)
    DONE                     every episode of this (shard's) run has its result
    .lock                    held while a process works in the directory

Every JSON file is written whole or not at all (rundir/atomic.py), and every
write is made by the directory's writer thread (rundir/writer.py), in order,
off the event loop. Every result carries a seal (rundir/seals.py) and every
line of a turn log is chained to the line before; opening the directory
checks them all, and a file (or a log's line and those after it) that fails
is moved to `quarantine/`, said in one line, and played again. Where a run
directory may be is checked first (rundir/places.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..errors import InputError
from ..protocol.episode import Ending
from ..protocol.plant import PlantResult
from ..protocol.reaudit import ReauditResult
from ..protocol.records import Checkpoint, EpisodeResult
from ..protocol.trials import episode_name
from .atomic import DiskFull, atomic_write, is_disk_full
from .call_log import CallLine, CrossCheckNote
from .formats import check_version, stamped
from .identity import differences, summary
from .invalid import Outcome
from .layout import CALLS, CHECKPOINTS, DONE, LOCK, MANIFEST, QUARANTINE, RESULTS, manifest_problem, result_file
from .places import check_place
from .provenance import now, resume_entry
from .seals import SEAL, check_file, sealed_json
from .turn_log import SUFFIX, LogRead, base_line, logged_turns, read_log, seal_of, turn_line
from .writer import Writer


class RunLocked(RuntimeError):
    pass


class RunMismatch(RuntimeError):
    pass


@dataclass
class _Chain:
    """Where an episode's turn log stands: the hash its next line chains to, its turns, the narrator
    state its lines last recorded."""

    last: str
    turns: int
    narrator_state: dict[str, Any]


class RunDir:
    def __init__(self, root: str | Path, calls_name: str = CALLS, record: type[BaseModel] = EpisodeResult) -> None:
        self.root = Path(root)
        self.results = self.root / RESULTS
        self.checkpoints = self.root / CHECKPOINTS
        self.quarantine = self.root / QUARANTINE
        self.calls_path = self.root / calls_name
        self.manifest_path = self.root / MANIFEST
        self.record = record  # what results/ holds (a re-audit keeps its own records there)
        self.identity = ""
        self.spec_hashes: dict[str, str] | None = None
        self.manifest: dict[str, Any] = {}
        self.quarantined: list[str] = []
        self._lock_fd: int | None = None
        self._is_open = False
        self._writer = Writer(self.root)
        self._chains: dict[str, _Chain] = {}
        self._logs: dict[str, Checkpoint] = {}  # each log verify() read (turns left out), until its episode resumes

    # -- lifecycle ---------------------------------------------------------
    def open(self, manifest: dict[str, Any], identity: Any, warn: Callable[[str], None] | None = None) -> None:
        """Create or reopen the run; refuse another live process, another config, a bad place.

        `identity` is an `identity.Identity` (its parts are recorded and a
        mismatch names what differs; its dataset's spec hashes seal and
        check every file) or a plain string key (benches, tests).
        """
        warn = warn or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
        key = identity if isinstance(identity, str) else identity.key
        parts = None if isinstance(identity, str) else identity.parts
        self.identity = key
        self.spec_hashes = None if isinstance(identity, str) else identity.spec_hashes() or None
        check_place(self.root)
        try:
            self._open(manifest, key, parts, warn)
        except BaseException as exc:
            self.close()
            if is_disk_full(exc):
                raise DiskFull(self.root, str(getattr(exc, "strerror", ""))) from None
            if isinstance(exc, DiskFull):
                raise DiskFull(self.root, exc.detail) from None
            if isinstance(exc, OSError):
                # What check_place cannot see ahead (a mount that refuses writes, a pseudo-filesystem).
                where = exc.filename or self.root
                raise InputError(
                    where,
                    "out_dir",
                    f"cannot write the run directory here ({exc.strerror}); give a folder you can write",
                ) from None
            raise

    def _open(
        self, manifest: dict[str, Any], key: str, parts: dict[str, Any] | None, warn: Callable[[str], None]
    ) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(
                f"{self.root}: another process is running in this run directory (wait for it, or use another out_dir)"
            ) from None
        self._lock_fd = fd
        old = self._read_manifest(warn)
        if old is None:
            self._refuse_foreign(key)

            self.manifest = {**manifest, "identity": key, "identity_parts": parts, "resumes": []}
            self.manifest.setdefault("created", now())
        else:
            if old.get("identity") != key:
                diffs = (
                    summary(differences(old.get("identity_parts"), parts or {}))
                    if parts
                    else f"identity {old.get('identity')} != {key}"
                )
                raise RunMismatch(
                    f"{self.root}: this directory holds a run of another config ({diffs}); "
                    "to continue it, undo the change; to keep both, use another out_dir"
                )

            entry = resume_entry()
            limit = (manifest.get("config") or {}).get("limit", "absent")
            if limit != "absent" and limit != (old.get("config") or {}).get("limit", "absent"):
                entry["limit"] = limit  # outside the identity, it changes which specs run
            trials = ((manifest.get("config") or {}).get("trials") or {}).get("count", 1)
            if trials != ((old.get("config") or {}).get("trials") or {}).get("count", 1):
                entry["trials"] = trials  # likewise: how many plays of each story run
            # Written once: only the list of resumes grows (an older manifest's counter is carried over).
            prior = old.get("resumes")
            resumes: list[Any] = (
                prior if isinstance(prior, list) else [{"count": old["resumed"]}] if old.get("resumed") else []
            )
            self.manifest = {**{k: v for k, v in old.items() if k != "resumed"}, "resumes": [*resumes, entry]}
        self.manifest = stamped(self.manifest, "manifest")
        atomic_write(self.manifest_path, json.dumps(self.manifest, indent=2, default=str, ensure_ascii=False))
        self.results.mkdir(exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        self._recover()
        for line in self.verify():
            warn(line)
        self._is_open = True

    def _read_manifest(self, warn: Callable[[str], None]) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            return None
        try:
            data = json.loads(self.manifest_path.read_bytes())
            if isinstance(data, dict):
                check_version(self.manifest_path, data, "manifest")  # a newer rig's: refused, not replaced
            shape = manifest_problem(data)
            if shape is None and "identity" in data:
                return data
            problem = f"not a run manifest ({shape})" if shape else "not a run manifest"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            problem = "not JSON (truncated or damaged)"
        # The seals say which run each result belongs to, so a damaged manifest
        # costs its record, never the results: it is moved aside and written anew.
        moved = self._move_aside(self.manifest_path, "")
        warn(f"{self.manifest_path}: {problem}: moved to {moved}; a new manifest is written")
        return None

    def _refuse_foreign(self, key: str) -> None:
        """No manifest, yet results or checkpoints: take them only if they are sealed by this run."""
        for d in (self.results, self.checkpoints):
            for path in sorted(d.glob("*.json*")) if d.is_dir() else ():
                try:
                    seal = (seal_of(path) if path.suffix == SUFFIX else json.loads(path.read_bytes()).get(SEAL)) or {}
                except (OSError, ValueError, AttributeError):
                    continue  # damage: verify() quarantines it
                if seal.get("run") != key:
                    raise RunMismatch(
                        f"{self.root}: this directory holds a run of another config ({path} is "
                        f"sealed by run {seal.get('run')!r}, not {key}); use another out_dir"
                    )

    def _recover(self) -> None:
        """Clean up after a killed process (we hold the lock, so nobody else writes)."""
        for d in (self.root, self.results, self.checkpoints):
            for tmp in d.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)  # a write that never reached its rename
        if self.calls_path.exists():
            with open(self.calls_path, "rb+") as f:
                data = f.read()
                if data and not data.endswith(b"\n"):
                    # A line cut short by the kill; drop it so the next append starts clean.
                    f.truncate(data.rfind(b"\n") + 1)

    def verify(self) -> list[str]:
        """Check every result and checkpoint; move the failing ones (a log's failing line and those
        after it) to quarantine/. One line each."""
        lines = []
        for d, model in ((self.results, self.record), (self.checkpoints, Checkpoint)):
            for path in sorted(d.glob("*.json")):
                _, problem = check_file(path, model, self.identity, self.spec_hashes)
                if problem:
                    moved = self._move_aside(path, d.name)
                    again = "played again" if d is self.results else "played again from the start"
                    lines.append(f"{path}: {problem}: moved to {moved}; the episode is {again}")
        for path in sorted(self.checkpoints.glob(f"*{SUFFIX}")):
            line = self._check_log(path)
            if line:
                lines.append(line)
        self.quarantined += lines
        return lines

    def _check_log(self, path: Path) -> str:
        """Read one turn log; keep what is good (for the episode's resume), move the rest aside."""
        episode = path.name[: -len(SUFFIX)]
        got: LogRead = read_log(path, self.identity, self.spec_hashes)
        if got.checkpoint is not None:
            # Its turns stay in the log (`turns_before`), as a running episode hands them on: hundreds of
            # resumed episodes would otherwise hold every turn they played until their end.
            cp = got.checkpoint
            self._logs[episode] = cp.model_copy(update={"turns": (), "turns_before": len(cp.turns)})
            self._chains[episode] = _Chain(got.last, len(got.checkpoint.turns), got.checkpoint.narrator_state)
        if not got.problem:
            return ""
        if got.checkpoint is None:
            moved = self._move_aside(path, CHECKPOINTS)
            return f"{path}: {got.problem}: moved to {moved}; the episode is played again from the start"
        # The good lines stay; the bad one and every line after it (chained to it) go aside, whole.
        target = self._move_aside(path, CHECKPOINTS, copy=got.tail)
        os.truncate(path, got.good_bytes)
        after = len(got.tail.splitlines()) - 1
        return (
            f"{path}: {got.problem}: it and the {after} line(s) after it moved to {target}; the episode "
            f"resumes after its {len(got.checkpoint.turns)} committed turn(s)"
        )

    def _move_aside(self, path: Path, sub: str, copy: bytes | None = None) -> Path:
        """Move `path` into quarantine/ (or, with `copy`, write those bytes there under its name)."""
        target_dir = self.quarantine / sub if sub else self.quarantine
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / path.name
        n = 1
        while target.exists():
            target = target_dir / f"{path.name}.{n}"
            n += 1
        if copy is None:
            os.replace(path, target)
        else:
            atomic_write(target, copy)
        return target

    def flush(self) -> None:
        """Wait until every write asked for so far is on disk (raises a write's error)."""
        try:
            self._writer.flush()
        except DiskFull as exc:
            raise DiskFull(self.root, exc.detail) from None

    def writes_pending(self) -> int:
        """Writes asked for that the writer thread has not taken yet."""
        return self._writer.pending()

    def close(self) -> None:
        """Flush every write, then release the directory."""
        try:
            if self._is_open:
                self._writer.close()
        finally:
            self._is_open = False
            self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records -----------------------------------------------------------
    def _write(self, path: Path, text: str | bytes) -> None:
        try:
            atomic_write(path, text)
        except DiskFull as exc:
            raise DiskFull(self.root, exc.detail) from None  # named by the run, not the subfolder

    def mark_done(self, n_episodes: int) -> None:
        """A marker that every episode of this (shard's) run has its result: written after every result
        asked for before it, and on disk when this returns."""
        self._writer.run(lambda: self._write(self.root / DONE, f"{n_episodes}\n"))
        self.flush()

    def log_call(self, record: CallLine | CrossCheckNote) -> None:
        """Append one attempt to the call log, by the writer (a line is written whole or cut off)."""
        assert self._is_open, "run directory not open"
        self._writer.append_only(self.calls_path, (record.to_line() + "\n").encode("utf-8"))

    def _spec_hash(self, spec_id: str) -> str:
        return (self.spec_hashes or {}).get(spec_id, "")

    # `episode`: an episode name (protocol/trials.py), the spec id itself for trial 0.
    def result_path(self, episode: str) -> Path:
        return result_file(self.root, episode)

    def has_result(self, episode: str) -> bool:
        self.flush()  # this process reads what it wrote
        return self.result_path(episode).exists()

    def write_result(self, result: EpisodeResult | ReauditResult | PlantResult) -> Future[None]:
        """Seal and write a finished episode's result, by the writer (its serialization too: once per
        episode, off the loop); resolves once it is on disk and its checkpoint is gone."""
        name = episode_name(result.spec_id, getattr(result, "trial", 0))
        return self._finish(name, result.spec_id, lambda spec_sha256: sealed_json(result, spec_sha256, self.identity))

    def write_ending(self, ending: Ending) -> Future[None]:
        """`write_result` for an episode that handed its committed turns on to its turn log: the writer,
        which wrote them, reads them back after its last line and makes the whole result. The loop asks
        and goes on, as for any write, so the order of play never depends on when the writer gets to it
        (a run stopped at a given call leaves the same files every time)."""
        name = ending.head.episode
        log, _ = self._checkpoint_files(name)
        chain = self._chains.get(name)
        last = chain.last if chain is not None else ""  # the hash of the last line asked for, its last turn's

        def text(spec_sha256: str) -> bytes:
            if not ending.handed:
                return sealed_json(ending.head, spec_sha256, self.identity)
            handed = logged_turns(log, last, ending.handed)
            if handed is not None:
                return sealed_json(ending.head, spec_sha256, self.identity, ending.result_json(handed))
            got = read_log(log, self.identity, self.spec_hashes)  # says what changed, or takes a format-1 base's turns
            try:
                if got.checkpoint is None or got.problem:
                    raise ValueError(got.problem)
                return sealed_json(ending.result(got.checkpoint.turns), spec_sha256, self.identity)
            except ValueError as exc:
                raise InputError(log, "", f"{exc}: the run's own turn log changed while it ran") from None

        return self._finish(name, ending.head.spec_id, text)

    def _finish(self, name: str, spec_id: str, text: Callable[[str], bytes]) -> Future[None]:
        """Write episode `name`'s result, made by `text` (given its spec's hash) in the writer's turn, and
        drop its checkpoint."""
        self._chains.pop(name, None)

        def superseded() -> None:  # the checkpoint: dropped only once the result is safe
            for old in self._checkpoint_files(name):
                old.unlink(missing_ok=True)

        return self._writer.replace(self.result_path(name), lambda: text(self._spec_hash(spec_id)), superseded)

    def _checkpoint_files(self, episode: str) -> tuple[Path, Path]:
        """(the turn log, a format-1 checkpoint) of an episode."""
        return self.checkpoints / f"{episode}{SUFFIX}", self.checkpoints / f"{episode}.json"

    def write_checkpoint(self, cp: Checkpoint) -> Future[None]:
        """Record a committed turn: one line appended to the episode's turn log, by the writer. The
        first commit of an episode (its opening, or the first turn after a format-1 checkpoint) starts
        the log with the whole checkpoint. Resolves once written."""
        log, old = self._checkpoint_files(cp.episode)
        chain = self._chains.get(cp.episode)
        if chain is not None and cp.committed == chain.turns + 1:
            changed = cp.narrator_state != chain.narrator_state
            line, chain.last = turn_line(chain.last, cp, changed)
            chain.turns += 1
            if changed:
                chain.narrator_state = cp.narrator_state
            return self._writer.append(log, line)
        assert not cp.turns_before, "a log starts with a whole checkpoint"
        line, last = base_line(cp, self._spec_hash(cp.spec_id), self.identity)
        self._chains[cp.episode] = _Chain(last, len(cp.turns), cp.narrator_state)

        # Replaced whole, as a group with the other episodes' starts (800 fsyncs one after another on a
        # network filesystem held the run's first turns back); a format-1 checkpoint goes once the log
        # carries it.
        return self._writer.replace(log, lambda: line, lambda: old.unlink(missing_ok=True))

    def load_checkpoint(self, episode: str) -> Checkpoint | None:
        """The episode's last good checkpoint; a bad one is quarantined and the episode starts over. A turn
        log's leaves its turns in the log (`turns_before`): `write_ending` reads them back."""
        self.flush()
        if episode in self._logs:
            return self._logs.pop(episode)
        log, path = self._checkpoint_files(episode)
        if log.exists():
            line = self._check_log(log)
            if line:
                self.quarantined.append(line)
                print(f"warning: {line}", file=sys.stderr, flush=True)
            return self._logs.pop(episode, None)
        if not path.exists():
            return None
        cp, problem = check_file(path, Checkpoint, self.identity, self.spec_hashes)
        if problem:
            moved = self._move_aside(path, CHECKPOINTS)
            line = f"{path}: {problem}: moved to {moved}; the episode is played again from the start"
            self.quarantined.append(line)
            print(f"warning: {line}", file=sys.stderr, flush=True)
            return None
        return cp

    def load_result(self, episode: str) -> Any:
        self.flush()
        record, problem = check_file(self.result_path(episode), self.record, self.identity or None, self.spec_hashes)
        if problem:
            # verify() ran at open: only a file changed under a running process gets here.
            raise InputError(self.result_path(episode), "", f"{problem}; re-run the same command to play it again")
        return record

    def iter_results(self) -> Iterator[Any]:
        """Every result that passes its check (run `verify` first to move the others aside)."""
        self.flush()
        for path in sorted(self.results.glob("*.json")):
            record, problem = check_file(path, self.record, self.identity or None, self.spec_hashes)
            if not problem:
                yield record


class StoredResults(Mapping[str, Any]):
    """Episodes' results in a run directory, read when asked: a run holds none of them in memory (at
    turn 100 a result is about a MB of objects, and a run plays hundreds). Each read is checked."""

    def __init__(self, store: RunDir, episodes: Iterable[str], outcomes: Mapping[str, Outcome] | None = None) -> None:
        self.store, self.episodes = store, tuple(episodes)
        self._known = frozenset(self.episodes)
        self._outcomes = outcomes or {}  # those the run ended itself: known without reading their results

    def outcomes(self) -> Iterator[Outcome]:
        """How each episode ended: as the run kept it, else read from its result (one at a time)."""
        for episode in self.episodes:
            kept = self._outcomes.get(episode)
            yield kept if kept is not None else Outcome.of(self[episode])

    def __getitem__(self, episode: str) -> Any:
        if episode not in self._known:
            raise KeyError(episode)
        return self.store.load_result(episode)

    def __iter__(self) -> Iterator[str]:
        return iter(self.episodes)

    def __len__(self) -> int:
        return len(self.episodes)


def resume_hint(what: str, out: Path) -> str:
    """The one-line advice after an interrupted run: what is safe, where, and how to go on."""
    return f"{what} in {out}; re-run the same command to resume"
