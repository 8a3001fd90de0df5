"""Engines that vLLM forks (as it does on CUDA), and one engine's environment.

On CUDA vLLM forks its engine processes; only the CPU build forces spawn (its
platform writes VLLM_WORKER_MULTIPROC_METHOD=spawn while it builds the config).
Here that write is overridden with fork, so two engines start in one process as
they would on a GPU node, and:

- each engine's processes really are forked (they hold an fd the parent opened
  close-on-exec, which no exec'd process could);
- the second engine's processes hold no copy of the first one's watchdog pipe;
- closing the first engine is quick, its watchdog exits by itself (not killed
  after a timeout), and the second engine keeps all its processes and serves;
- the second engine's core killed (as by the OOM killer), its next request
  raises EngineDead instead of hanging, and closing it still ends the rest;
- os.environ is the same after each engine start as before it (what the rig
  and vLLM wrote for that engine is restored), and a deterministic engine
  reports its capped max_num_seqs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine_helpers import alive_after
from ncp_local.engines import watchdog

# Small: two engines start in this test (about 12 s each here).
CFG = dict(
    max_model_len=512,
    kv_cache_memory_bytes=64 << 20,
    max_num_seqs=2,
    enforce_eager=True,
    dtype="float32",
    cpu_reserved_cores=0,
)


def _fd_targets(pid: int) -> set[str]:
    """What each fd of a process points at (`pipe:[inode]`, paths), as /proc shows it."""
    out = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:
            pass
    return out


def _own_fd_target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# -- the watchdog pipe alone (no engine) -------------------------------------------


def test_forked_children_hold_no_watchdog_pipe() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    wd = watchdog.start([psutil.Process(victim.pid)], grace_s=2)
    assert wd is not None and wd.pipe_fd is not None
    pipe = _own_fd_target(wd.pipe_fd)
    # A child that lives on, as a later engine's forked process would.
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if not watchdog.open_pipe_fds() else 1)
        finally:
            os._exit(2)
    ready_r, ready_w = os.pipe()
    lingering = os.fork()
    if lingering == 0:
        os.write(ready_w, b"1")  # after fork returned here, so after the fork hooks ran
        time.sleep(60)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert pipe not in _fd_targets(lingering)
        assert wd.stop(timeout=20) is True  # exited by itself, not killed
        assert wd.proc.returncode == 0 and victim.wait(10) is not None  # it ended what it guarded
        assert wd.pipe_fd is None and not watchdog.open_pipe_fds()
    finally:
        os.kill(lingering, 9)
        os.waitpid(lingering, 0)
        os.close(ready_r)
        os.close(ready_w)
        if victim.poll() is None:
            victim.kill()


# -- two engines, forked ----------------------------------------------------------


@pytest.fixture
def fork_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's CPU platform forces spawn on every config it builds; put fork back after it."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def forked(cls, vllm_config) -> None:  # type: ignore[no-untyped-def]
        original(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(forked))
    yield


def _start(loop: asyncio.AbstractEventLoop, cfg):  # type: ignore[no-untyped-def]
    # Importing vLLM and transformers writes into os.environ once per process (vLLM's
    # env_override, cv2's LD_LIBRARY_PATH): not an engine's doing, so done before the diff.
    import transformers  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    from ncp_local.engines.vllm import VLLMEngine
    from ncp_local.engines.vllm_args import build_engine_args

    build_engine_args(cfg, cfg.path, on_cpu=True)  # the rest of the imports a start makes first
    before = dict(os.environ)
    backend = loop.run_until_complete(asyncio.wait_for(VLLMEngine.start(cfg), 600))
    after = dict(os.environ)
    diff = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not diff, f"engine {cfg.name}'s start left os.environ changed: {diff}"
    # What was written for this engine (ours and vLLM's own) was there, and went.
    assert {"VLLM_REGEX_COMPILATION_TIMEOUT_S", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_WORKER_MULTIPROC_METHOD"} <= set(
        backend.env_restored
    ), backend.env_restored
    return backend


def _ask(loop: asyncio.AbstractEventLoop, backend) -> str:  # type: ignore[no-untyped-def]
    from ncp_local.engines.base import Message, Request

    req = Request(messages=(Message("user", "Hi"),), temperature=0.0, top_p=1.0, max_tokens=2, seed=0)
    return loop.run_until_complete(asyncio.wait_for(backend.generate(req), 120)).finish_reason


@pytest.mark.engine
def test_closing_one_forked_engine_leaves_the_other_untouched(embedded_model_path: Path, fork_engines: None) -> None:
    from ncp_local.engines.base import EngineDead
    from ncp_local.engines.settings import DETERMINISTIC_MAX_NUM_SEQS, ModelSettings
    from ncp_local.engines.vllm_process import engine_core_processes

    loop = asyncio.new_event_loop()
    a = b = None
    pids: list[int] = []
    # Opened close-on-exec before engine B starts: only a forked (never exec'd) process can hold it.
    marker_r, marker_w = os.pipe()
    try:
        a = _start(loop, ModelSettings(name="fork-a", path=str(embedded_model_path), **CFG))
        b = _start(
            loop,
            ModelSettings(
                name="fork-b", path=str(embedded_model_path), **{**CFG, "max_num_seqs": 40}, deterministic=True
            ),
        )
        pids = a.engine_pids + b.engine_pids
        assert len(a.engine_pids) >= 2 and len(b.engine_pids) >= 2  # engine core + worker each

        # Forked, not spawned: the core by multiprocessing's fork, every process holding the marker.
        for backend in (a, b):
            assert {type(p._popen).__module__ for p in engine_core_processes(backend._engine)} == {
                "multiprocessing.popen_fork"
            }
        marker = _own_fd_target(marker_r)
        forked = {pid: marker in _fd_targets(pid) for pid in b.engine_pids}
        core = [p.pid for p in engine_core_processes(b._engine)]
        assert all(forked[pid] for pid in core) and sum(forked.values()) > len(core), forked  # core + worker
        # The one exec'd process is multiprocessing's resource tracker (it gets only the fds it is passed).
        assert all(
            "multiprocessing.resource_tracker" in " ".join(psutil.Process(pid).cmdline())
            for pid, yes in forked.items()
            if not yes
        ), forked

        # B's processes hold no copy of A's watchdog pipe.
        wd_a = a._watchdog
        assert wd_a is not None and wd_a.pipe_fd is not None
        pipe_a = _own_fd_target(wd_a.pipe_fd)
        holders = [pid for pid in b.engine_pids if pipe_a in _fd_targets(pid)]
        assert not holders, f"engine B's processes {holders} hold engine A's watchdog pipe"

        # The cap under deterministic, as the running engine resolved it.
        assert b.max_num_seqs == DETERMINISTIC_MAX_NUM_SEQS and a.max_num_seqs == 2
        assert len(b.notes) == 1 and f"40 -> {DETERMINISTIC_MAX_NUM_SEQS}" in b.notes[0] and a.notes == ()

        assert _ask(loop, b) == "length"
        a_pids = a.engine_pids
        loop.run_until_complete(a.close())
        assert wd_a.proc.returncode == 0, "engine A's watchdog did not exit by itself (it was killed)"
        assert not alive_after(a_pids, timeout=15) and a.watchdog_pid is None

        # B is untouched: every process alive, still serving, still alive a moment later.
        b_pids = b.engine_pids
        assert sorted(alive_after(b_pids, timeout=0)) == sorted(b_pids)
        assert _ask(loop, b) == "length"
        time.sleep(2)
        assert sorted(alive_after(b_pids, timeout=0)) == sorted(b_pids)

        # B's engine core dies (as under the OOM killer): its next request fails fast, it does not hang.
        os.kill(core[0], signal.SIGKILL)
        with pytest.raises(EngineDead):
            _ask(loop, b)
    finally:
        for backend in (a, b):
            if backend is not None:
                loop.run_until_complete(backend.close())
        loop.close()
        os.close(marker_r)
        os.close(marker_w)
        for pid in alive_after(pids, timeout=15):  # whatever failed, leave nothing behind
            os.kill(pid, 9)
    assert not alive_after(pids, timeout=0)
