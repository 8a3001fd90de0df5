"""A run directory's writes, done by one thread in the order they were asked, fsynced in groups.

The event loop that plays hundreds of episodes must never wait for the disk: a checkpoint's fsync costs
about 12 ms on a local disk and more on a cluster's network filesystem, and every episode would wait for
it. So the loop hands each write to this thread and goes on. The thread takes whatever is queued, does
it in order (a turn before the next, an episode's last turn before its result, every result before
`DONE`), appending the lines of one file in one write, then fsyncs each file it appended to once: group
commit. Files replaced whole one after another (the results of episodes that end together: 800 at once
in a paper run) are written, fsynced side by side, then renamed in order, their directory fsynced once,
before what each supersedes goes (its checkpoint). An append's future resolves once its bytes are
written; the run waits on it only when the thread falls behind (`pending`), so a killed process loses
the turns in flight and the few still queued (milliseconds of work), and a crashed machine at most the
last group's lines too; a resume plays them again.

The first error (a full disk, a failing write) is kept: every later request raises it, so the run stops
as it did when writes were made on the loop.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from .atomic import DiskFull, Staged, fsync, fsync_dir, is_disk_full, stage, write_all

_BATCH = 512  # requests taken at once: bounds the files open at once
# fsyncs made at once: on a network filesystem each is a round trip, and a batch fsyncs every episode's log
# it appended to (up to 800 in a paper run): 200 logs at 20 ms are 13 rounds (260 ms) with 16 at once, 4 with
# 64. 200 episodes x 100 turns with every fsync 20 ms slower: 80.7 s with 16, 65.9-79.4 s with 64 (load ~1;
# docs/measurements/2026-12-07-rig-at-gpu-speed.md, seventh pass).
_SYNCERS = 64


@dataclass
class _Request:
    path: Path | None  # an append's (or a replace's) file; None: `action` does the work
    data: bytes = b""
    action: Callable[[], None] | None = None  # a replace's: what it does once its file is in place
    done: Future[None] | None = None  # None: nobody waits for it (a call-log line)
    make: Callable[[], str | bytes] | None = None  # a replace's: the file's new bytes, made in the writer's turn


class Writer:
    def __init__(self, root: Path) -> None:
        self.root = root  # the run directory a full disk is named by
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self._syncers: ThreadPoolExecutor | None = None
        self._outstanding = 0  # requests asked for and not yet done: flush() returns at once at 0

    # -- the loop's side ---------------------------------------------------------------------------
    def append(self, path: Path, data: bytes) -> Future[None]:
        """Append `data` to `path` (created if absent); resolves once written."""
        done: Future[None] = Future()
        self._put(_Request(path, data, done=done))
        return done

    def append_only(self, path: Path, data: bytes) -> None:
        """`append`, with nothing to wait on (an error still stops the next request)."""
        self._put(_Request(path, data))

    def run(self, action: Callable[[], None]) -> Future[None]:
        """Do `action` in the writer's order (an atomic replace, an unlink)."""
        done: Future[None] = Future()
        self._put(_Request(None, action=action, done=done))
        return done

    def replace(
        self, path: Path, make: Callable[[], str | bytes], then: Callable[[], None] | None = None
    ) -> Future[None]:
        """Replace `path` whole with what `make()` returns (made in the writer's turn), then do `then`
        once the new file is durable and in place (remove what it supersedes)."""
        done: Future[None] = Future()
        self._put(_Request(path, action=then, done=done, make=make))
        return done

    def flush(self) -> None:
        """Wait until everything asked so far is written and fsynced; raise the writer's error if any."""
        if self._thread is not None and self._outstanding:
            self.run(lambda: None).result()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Flush, then stop the thread (a later request starts it again)."""
        try:
            self.flush()
        finally:
            with self._lock:
                thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
                thread.join()
            if self._syncers is not None:
                self._syncers.shutdown()
                self._syncers = None

    def pending(self) -> int:
        """Requests asked for and not yet taken by the thread (approximate, for back-pressure)."""
        return self._queue.qsize()

    def _put(self, req: _Request) -> None:
        if self.error is not None:
            raise self.error
        with self._lock:
            self._outstanding += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="ncp-local-writer", daemon=True)
                self._thread.start()
        self._queue.put(req)

    # -- the thread's side -------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(nxt)
            self._do(batch)

    def _do(self, batch: list[_Request]) -> None:
        appended: dict[Path, int] = {}  # file -> its open descriptor, fsynced once at the end
        staged: dict[Path, tuple[_Request, Staged]] = {}  # files replaced whole, written, not yet in place
        try:
            i = 0
            while i < len(batch):
                req = batch[i]
                if req.make is not None:
                    # Made now (a result reads the turn log as the lines before it left it), landed with
                    # the group (a file replaced again lands the group first).
                    if req.path in staged:
                        self._land(staged, [])
                    if self.error is None:
                        self._guard(partial(self._stage, staged, req))
                    i += 1
                    continue
                if req.action is not None:
                    self._land(staged, [])  # what was replaced before it is in place first (results before DONE)
                    if self.error is None:
                        self._guard(req.action)
                    i += 1
                    continue
                if req.path in staged:
                    self._land(staged, [])  # a log started whole (replaced) before its first appended line
                # Consecutive appends to the same file: one write, then they are written.
                j = i + 1
                while (
                    j < len(batch) and batch[j].path == req.path and batch[j].action is None and batch[j].make is None
                ):
                    j += 1
                if self.error is None:
                    assert req.path is not None
                    self._guard(partial(self._append, appended, req.path, b"".join(r.data for r in batch[i:j])))
                for r in batch[i:j]:
                    self._settle(r)
                i = j
            # Group commit: each file appended to or replaced, once, side by side (on a network filesystem
            # each fsync is a round trip: 200 episodes' logs one after another would take 200 of them).
            self._land(staged, list(appended.values()))
        finally:
            for fd in appended.values():
                os.close(fd)
            for _, s in staged.values():
                s.drop()  # not landed: an error came first
            for req in batch:
                self._settle(req)
            with self._lock:
                self._outstanding -= len(batch)

    def _stage(self, staged: dict[Path, tuple[_Request, Staged]], req: _Request) -> None:
        assert req.path is not None and req.make is not None
        staged[req.path] = (req, stage(req.path, req.make()))

    def _land(self, staged: dict[Path, tuple[_Request, Staged]], fds: list[int]) -> None:
        """Make `fds` (appended files) and the staged replacements durable side by side, then put each
        replacement in place in order and fsync their directories once; only then each one's `then`,
        which removes what it supersedes (a crash must never keep that removal and lose the rename)."""
        if self.error is not None or not (staged or fds):
            return
        self._sync(fds + [s.fd for _, s in staged.values() if s.fd is not None])
        for _, s in staged.values():
            if self.error is None:
                self._guard(s.land)
        if self.error is not None:
            return
        for folder in dict.fromkeys(path.parent for path in staged):
            self._guard(partial(fsync_dir, folder))
        for req, _ in staged.values():
            if req.action is not None and self.error is None:
                self._guard(req.action)
            self._settle(req)
        staged.clear()

    def _sync(self, fds: list[int]) -> None:
        """fsync each of `fds`, side by side."""
        if len(fds) == 1:
            self._guard(partial(fsync, fds[0]))
            return
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(_SYNCERS, thread_name_prefix="ncp-local-fsync")
        for _ in self._syncers.map(lambda fd: self._guard(partial(fsync, fd)), fds):
            pass

    def _settle(self, req: _Request) -> None:
        if req.done is None or req.done.done():
            return
        if self.error is None:
            req.done.set_result(None)
        else:
            req.done.set_exception(self.error)

    def _append(self, open_fds: dict[Path, int], path: Path, data: bytes) -> None:
        fd = open_fds.get(path)
        if fd is None:
            fd = open_fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data)
        except OSError:
            # A line half written for want of space is cut off again, so the file stays whole.
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException as exc:  # kept, and raised on the loop's next request
            if isinstance(exc, DiskFull):
                exc = DiskFull(self.root, exc.detail)
            elif isinstance(exc, OSError) and is_disk_full(exc):
                exc = DiskFull(self.root, f"writing: {exc.strerror}")
            self.error = exc
