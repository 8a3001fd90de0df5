"""The run directory: results, checkpoints, call log, manifest, lock.

Layout:
    manifest.json            written once: identity and its parts, resolved config,
                             command, versions, git, hardware; plus `resumes`
    results/<episode>.json      one finished episode each (<spec> for trial 0, <spec>~t<k> for trial k)
    checkpoints/<episode>.json  the last committed turn of an unfinished episode
    quarantine/              files that failed verification, moved aside
    calls.jsonl              every model call attempt (append-only)
    DONE                     every episode of this (shard's) run has its result
    .lock                    held while a process works in the directory

Every JSON file is written to a temp file, fsynced and renamed, so a kill or
a full disk at any moment leaves either the old or the new file, never half
of one. Files are created with mode 0666 and the umask decides (no
`mkstemp`, whose 0600 would hide results from a team on a shared disk).

Every result and checkpoint carries a seal: its spec id (and trial, past
trial 0), the sha256 of the spec file it was played on, the run identity and a hash of its own record.
Loading checks the seal; a file that fails (truncated, not JSON, another
spec's, another run's, a spec the dataset lacks) is never used: the run
moves it to `quarantine/`, says so in one line, and plays the episode again.
Reports and merges apply the same check (`check_file`) without moving anything.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import InputError
from ..protocol.reaudit import ReauditResult
from ..protocol.records import Checkpoint, EpisodeResult
from ..protocol.trials import episode_name, parse_episode
from .call_log import CallLine, CrossCheckNote
from .formats import FORMAT_KEY, Kind, check_version, stamped
from .identity import Identity, differences, summary
from .layout import (
    CALLS,
    CHECKPOINTS,
    DONE,
    ENGINE_LOG,
    LOCK,
    MANIFEST,
    QUARANTINE,
    RESULTS,
    RUN_FILES,
    RUN_FOLDERS,
    RUN_MARKERS,
    manifest_problem,
    result_file,
)
from .provenance import now, resume_entry

SEAL = "seal"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class RunLocked(RuntimeError):
    pass


class RunMismatch(RuntimeError):
    pass


class DiskFull(RuntimeError):
    """No space left (or quota) while writing: nothing half-written is left behind."""

    def __init__(self, where: Path, detail: str = "") -> None:
        self.where, self.detail = where, detail
        super().__init__(
            f"{where}: disk full{f' ({detail})' if detail else ''}; every file written so far "
            "is whole: free space, then re-run the same command to resume"
        )


def _is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write whole or not at all; readable as the umask says. A full disk raises DiskFull."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                # 0o666: the process umask applies, as for any file the user creates.
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                continue
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        if _is_disk_full(exc):
            raise DiskFull(path.parent, f"writing {path.name}: {exc.strerror}") from None
        raise
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


# ---- seals -------------------------------------------------------------------------


def _body_hash(record: BaseModel) -> str:
    return hashlib.sha256(record.model_dump_json().encode("utf-8")).hexdigest()


# The records a run directory seals, each of one spec, and their kinds of file (execution/formats.py).
Sealed = EpisodeResult | ReauditResult | Checkpoint
_KIND: dict[type[BaseModel], Kind] = {EpisodeResult: "result", Checkpoint: "checkpoint", ReauditResult: "reaudit"}


def _kind(record: BaseModel) -> Kind:
    return _KIND.get(type(record), "result")


def sealed_json(record: Sealed, spec_sha256: str, run: str) -> str:
    """The record's JSON with its seal first (spec id, spec hash, run identity, record hash)."""
    trial = getattr(record, "trial", 0)
    seal = {
        "spec_id": record.spec_id,
        **({"trial": trial} if trial else {}),  # trial 0's seal is the seal a run without trials writes
        "spec_sha256": spec_sha256,
        "run": run,
        "sha256": _body_hash(record),
    }
    body = stamped(record.model_dump(mode="json"), _kind(record))
    return json.dumps({SEAL: seal, **body}, indent=1, ensure_ascii=False)


def check_file(
    path: Path,
    model: type[BaseModel],
    run: str | None,
    spec_hashes: Mapping[str, str] | None = None,
    require_seal: bool = True,
) -> tuple[Any, str]:
    """(record, "") for a file that passes, (None, reason) for one that must not be used.

    `run`: the identity it must carry (None: not checked); `spec_hashes`:
    spec id -> file hash for every spec of the run's dataset (None: not
    checked); `require_seal=False` accepts an unsealed file of an older rig.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"cannot read ({exc.strerror})"
    return check_bytes(raw, path.stem, model, run, spec_hashes, require_seal, where=path)


def check_bytes(
    raw: bytes,
    name: str,
    model: type[BaseModel],
    run: str | None,
    spec_hashes: Mapping[str, str] | None = None,
    require_seal: bool = True,
    where: str | Path | None = None,
) -> tuple[Any, str]:
    """`check_file` on a file's bytes (`name`: its file name's stem, the episode it must hold), e.g. one
    read from an archive (`where` names it). A file in a newer format raises `NewerFormat`: it is
    refused, never taken for damage."""
    try:
        expected, trial = parse_episode(name)
    except ValueError:
        return None, "not an episode's file (a stray file)"
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not JSON (truncated or damaged)"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    seal = data.pop(SEAL, None)
    check_version(where or name, data, _KIND.get(model, "result"))
    data.pop(FORMAT_KEY, None)
    if spec_hashes is not None and expected not in spec_hashes:
        return None, f"no spec {expected!r} in the run's dataset (a stray file)"
    if seal is None and require_seal:
        return None, "no seal (not written by this run)"
    if seal is not None and not isinstance(seal, dict):
        return None, "damaged seal"
    if seal:
        if seal.get("spec_id") != expected or seal.get("trial", 0) != trial:
            return None, _moved(str(seal.get("spec_id")), int(seal.get("trial") or 0), name)
        if run is not None and seal.get("run") != run:
            return None, f"from another run (identity {seal.get('run')}, this run is {run})"
        if spec_hashes is not None and seal.get("spec_sha256") and seal["spec_sha256"] != spec_hashes[expected]:
            return None, f"played on another version of spec {expected!r}"
    try:
        record = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        return None, f"not a valid {model.__name__}: {where}: {err['msg']}"
    held = (getattr(record, "spec_id", expected), getattr(record, "trial", 0))
    if held != (expected, trial):
        return None, _moved(*held, name)
    if seal and seal.get("sha256") != _body_hash(record):
        return None, "its content does not match its seal (edited or damaged)"
    return record, ""


def _moved(spec_id: str, trial: int, stem: str) -> str:
    held = f"spec {spec_id!r}" if not trial else f"episode {episode_name(spec_id, trial)!r}"
    return f"holds {held}, not {stem!r} (a file moved or copied)"


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
        self._calls_fd: int | None = None

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
            if _is_disk_full(exc):
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
        self._calls_fd = os.open(self.calls_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

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
            for path in sorted(d.glob("*.json")) if d.is_dir() else ():
                try:
                    seal = json.loads(path.read_bytes()).get(SEAL) or {}
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
        """Check every result and checkpoint; move the failing ones to quarantine/. One line each."""
        lines = []
        for d, model in ((self.results, self.record), (self.checkpoints, Checkpoint)):
            for path in sorted(d.glob("*.json")):
                _, problem = check_file(path, model, self.identity, self.spec_hashes)
                if problem:
                    moved = self._move_aside(path, d.name)
                    again = "played again" if d is self.results else "played again from the start"
                    lines.append(f"{path}: {problem}: moved to {moved}; the episode is {again}")
        self.quarantined += lines
        return lines

    def _move_aside(self, path: Path, sub: str) -> Path:
        target_dir = self.quarantine / sub if sub else self.quarantine
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / path.name
        n = 1
        while target.exists():
            target = target_dir / f"{path.name}.{n}"
            n += 1
        os.replace(path, target)
        return target

    def close(self) -> None:
        if self._calls_fd is not None:
            os.close(self._calls_fd)
            self._calls_fd = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records -----------------------------------------------------------
    def _write(self, path: Path, text: str) -> None:
        try:
            atomic_write(path, text)
        except DiskFull as exc:
            raise DiskFull(self.root, exc.detail) from None  # named by the run, not the subfolder

    def mark_done(self, n_episodes: int) -> None:
        """A marker that every episode of this (shard's) run has its result."""
        self._write(self.root / DONE, f"{n_episodes}\n")

    def log_call(self, record: CallLine | CrossCheckNote) -> None:
        assert self._calls_fd is not None, "run directory not open"
        line = (record.to_line() + "\n").encode("utf-8")
        size = os.fstat(self._calls_fd).st_size
        try:
            # One write per line, unbuffered: a kill loses at most the line in flight.
            _write_all(self._calls_fd, line)
        except OSError as exc:
            # A line half written for want of space is cut off again, so the log stays whole.
            try:
                os.ftruncate(self._calls_fd, size)
            except OSError:
                pass
            if _is_disk_full(exc):
                raise DiskFull(self.root, f"writing {self.calls_path.name}: {exc.strerror}") from None
            raise

    def _spec_hash(self, spec_id: str) -> str:
        return (self.spec_hashes or {}).get(spec_id, "")

    # `episode`: an episode name (protocol/trials.py), the spec id itself for trial 0.
    def result_path(self, episode: str) -> Path:
        return result_file(self.root, episode)

    def has_result(self, episode: str) -> bool:
        return self.result_path(episode).exists()

    def write_result(self, result: EpisodeResult | ReauditResult) -> None:
        name = episode_name(result.spec_id, getattr(result, "trial", 0))
        self._write(self.result_path(name), sealed_json(result, self._spec_hash(result.spec_id), self.identity))
        # The result supersedes the checkpoint; dropped only after the result is safe.
        (self.checkpoints / f"{name}.json").unlink(missing_ok=True)

    def write_checkpoint(self, cp: Checkpoint) -> None:
        self._write(
            self.checkpoints / f"{cp.episode}.json", sealed_json(cp, self._spec_hash(cp.spec_id), self.identity)
        )

    def load_checkpoint(self, episode: str) -> Checkpoint | None:
        """The episode's last good checkpoint; a bad one is quarantined and the episode starts over."""
        path = self.checkpoints / f"{episode}.json"
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
        record, problem = check_file(self.result_path(episode), self.record, self.identity or None, self.spec_hashes)
        if problem:
            # verify() ran at open: only a file changed under a running process gets here.
            raise InputError(self.result_path(episode), "", f"{problem}; re-run the same command to play it again")
        return record

    def iter_results(self) -> Iterator[Any]:
        """Every result that passes its check (run `verify` first to move the others aside)."""
        for path in sorted(self.results.glob("*.json")):
            record, problem = check_file(path, self.record, self.identity or None, self.spec_hashes)
            if not problem:
                yield record


def check_destination(path: str | Path, field: str) -> Path:
    """A folder the rig is about to write into: a folder or nothing yet, and writable (its nearest
    existing ancestor when it does not exist yet). The resolved path; an InputError naming `field`."""
    resolved = Path(path).expanduser().resolve()
    if resolved.exists() and not resolved.is_dir():
        raise InputError(path, field, "exists and is not a directory; give a folder (new or existing)")
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(path, field, f"{existing} is a file, so no folder can be made under it; give another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == resolved else f" ({existing} is the nearest existing folder)"
        raise InputError(
            path, field, f"cannot be written{where}: read-only or no permission; give a folder you can write"
        )
    return resolved


def check_place(root: Path) -> None:
    """Where a run may write: never `/`, a folder of something else, inside another run, a place that
    cannot be written, or a run directory whose parts are of the wrong kind."""
    resolved = Path(root).expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise InputError(root, "out_dir", "the filesystem root is never a run directory")
    for parent in resolved.parents:
        if (parent / MANIFEST).is_file() and (parent / RESULTS).is_dir():
            raise InputError(
                root,
                "out_dir",
                f"inside the run directory {parent} (a run never writes into another; use a folder of its own)",
            )
    if resolved.is_dir():
        names = {p.name for p in resolved.iterdir()}
        bookkeeping = {LOCK, CALLS, ENGINE_LOG, CHECKPOINTS, QUARANTINE}
        if names and not names.intersection(RUN_MARKERS) and not names <= bookkeeping:
            shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise InputError(
                root, "out_dir", f"not empty and not a run directory (holds {shown}); use an empty or new folder"
            )
        for name in RUN_FOLDERS:
            if (resolved / name).exists() and not (resolved / name).is_dir():
                raise InputError(
                    Path(root) / name,
                    "out_dir",
                    "a file where the run keeps a folder; move it away (a run never deletes it), then re-run",
                )
        for name in RUN_FILES:
            if (resolved / name).is_dir():
                raise InputError(
                    Path(root) / name,
                    "out_dir",
                    "a folder where the run keeps a file; move it away (a run never deletes it), then re-run",
                )
    elif resolved.exists():
        raise InputError(root, "out_dir", "exists and is not a directory")
    check_destination(root, "out_dir")


def check_result(path: Path, manifest: Mapping[str, Any], model: type[BaseModel] = EpisodeResult) -> tuple[Any, str]:
    """A reader's check of one result file against its run's manifest: (record, "") or (None, reason).

    Runs recorded by this rig (manifest with identity parts) must seal every
    result with their identity and their dataset's spec hashes; older runs
    and hand-made folders are checked for what they carry (JSON, spec id).
    """
    parts = manifest.get("identity_parts")
    if parts:
        return check_file(path, model, manifest.get("identity"), Identity(parts).spec_hashes() or None)
    return check_file(path, model, manifest.get("identity"), None, require_seal=False)


def resume_hint(what: str, out: Path) -> str:
    """The one-line advice after an interrupted run: what is safe, where, and how to go on."""
    return f"{what} in {out}; re-run the same command to resume"
