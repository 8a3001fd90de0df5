"""The run directory: results, checkpoints, call log, manifest, lock.

Layout:
    manifest.json            resolved config, versions, git revision, hashes
    results/<spec>.json      one finished episode each
    checkpoints/<spec>.json  the last committed turn of an unfinished episode
    calls.jsonl              every model call attempt (append-only)
    .lock                    held while a process works in the directory

Every JSON file is written to a temp file, fsynced and renamed, so a kill
at any moment leaves either the old or the new file, never half of one.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .episode import Checkpoint, EpisodeResult


class RunLocked(RuntimeError):
    pass


class RunMismatch(RuntimeError):
    pass


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDir:
    def __init__(self, root: str | Path, calls_name: str = "calls.jsonl") -> None:
        self.root = Path(root)
        self.results = self.root / "results"
        self.checkpoints = self.root / "checkpoints"
        self.calls_path = self.root / calls_name
        self.manifest_path = self.root / "manifest.json"
        self._lock_fd: int | None = None
        self._calls = None

    # -- lifecycle ---------------------------------------------------------
    def open(self, manifest: dict[str, Any], identity: str) -> None:
        """Create or reopen the run; refuse another live process or another config."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(f"{self.root}: another process is running in this run directory "
                            "(wait for it, or use another out_dir)") from None
        self._lock_fd = fd
        if self.manifest_path.exists():
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if old.get("identity") != identity:
                self.close()
                raise RunMismatch(f"{self.manifest_path}: identity: this directory holds a run of another "
                                  f"config ({old.get('identity')} != {identity}); use another out_dir")
            manifest = {**manifest, "created": old.get("created", manifest.get("created")),
                        "resumed": old.get("resumed", 0) + 1}
        atomic_write(self.manifest_path, json.dumps({**manifest, "identity": identity}, indent=2, default=str))
        self.results.mkdir(exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        self._recover()
        self._calls = open(self.calls_path, "a", encoding="utf-8")

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

    def close(self) -> None:
        if self._calls:
            self._calls.close()
            self._calls = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records -----------------------------------------------------------
    def mark_done(self, n_episodes: int) -> None:
        """A marker that every episode of this (shard's) run has its result."""
        atomic_write(self.root / "DONE", f"{n_episodes}\n")

    def log_call(self, record: dict[str, Any]) -> None:
        assert self._calls is not None, "run directory not open"
        # One line per write and flushed: a kill loses at most the line in flight.
        self._calls.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._calls.flush()

    def result_path(self, spec_id: str) -> Path:
        return self.results / f"{spec_id}.json"

    def has_result(self, spec_id: str) -> bool:
        return self.result_path(spec_id).exists()

    def write_result(self, result: EpisodeResult) -> None:
        atomic_write(self.result_path(result.spec_id), result.model_dump_json(indent=1))
        # The result supersedes the checkpoint; dropped only after the result is safe.
        (self.checkpoints / f"{result.spec_id}.json").unlink(missing_ok=True)

    def write_checkpoint(self, cp: Checkpoint) -> None:
        atomic_write(self.checkpoints / f"{cp.spec_id}.json", cp.model_dump_json())

    def load_checkpoint(self, spec_id: str) -> Checkpoint | None:
        path = self.checkpoints / f"{spec_id}.json"
        if not path.exists():
            return None
        return Checkpoint.model_validate_json(path.read_text(encoding="utf-8"))

    def load_result(self, spec_id: str) -> EpisodeResult:
        return EpisodeResult.model_validate_json(self.result_path(spec_id).read_text(encoding="utf-8"))

    def iter_results(self) -> Iterator[EpisodeResult]:
        for path in sorted(self.results.glob("*.json")):
            yield EpisodeResult.model_validate_json(path.read_text(encoding="utf-8"))


def read_calls(path: str | Path) -> list[dict[str, Any]]:
    """The call log, skipping a last line cut short by a kill."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def resume_hint(what: str, out: Path) -> str:
    """The one-line advice after an interrupted run: what is safe, where, and how to go on."""
    return f"{what} in {out}; re-run the same command to resume"
