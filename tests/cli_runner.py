"""The command line in the test's own process: `run_cli(*args)` calls `ncp_local.launch.cli.main`,
the function `python run.py` calls, and returns what a process would have given (exit code,
stdout, stderr). `run_submit(*args)` does the same for `slurm/submit.py`'s `main`.

A subprocess costs 3-6 s of imports on 2 cores; this costs none after the first. Only
scripted-engine command lines belong here: a test whose subject is the process itself (its exit
status as the shell sees it, signals, Ctrl-C, fork, the watchdog, Slurm) or that starts a real
engine runs `python run.py` as a subprocess.

The output is captured at the descriptors (1 and 2), not only at sys.stdout / sys.stderr, so the
quiet terminal (execution/engine_log.py), which moves descriptors, behaves as in a process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # as for `python run.py`: the script's folder (hydra_plugins/) is importable
    sys.path.insert(0, str(ROOT))

from ncp_local.launch.cli import main  # noqa: E402


@dataclass(frozen=True)
class CliResult:
    """The fields of `subprocess.CompletedProcess` the tests read."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """Descriptors 1 and 2 (and sys.stdout / sys.stderr over them) into two files; their text at the end."""
    found: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = (os.dup(1), os.dup(2))
    streams = (sys.stdout, sys.stderr)
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    try:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=True,
                write_through=True,
            )
            for fd in (1, 2)
        )
        yield found
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        for f in files:
            f.seek(0)
            found.append(f.read().decode("utf-8", errors="replace"))
            f.close()


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """`env` is the whole environment while the block runs (as `subprocess.run(env=...)` gives)."""
    if env is None:
        yield
        return
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def run_cli(*args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None) -> CliResult:
    """`python run.py *args` in this process (in `cwd`, with `env` as the whole environment)."""
    return _call(main, args, cwd, env)


@functools.cache
def submit_module() -> ModuleType:
    """slurm/submit.py, loaded once as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("ncp_slurm_submit", ROOT / "slurm" / "submit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_submit(*args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None) -> CliResult:
    """`python slurm/submit.py *args` in this process."""
    return _call(submit_module().main, args, cwd, env)


def _call(
    entry: Callable[[list[str]], int], args: tuple[str, ...], cwd: Path | str | None, env: Mapping[str, str] | None
) -> CliResult:
    here = os.getcwd()
    code = 1
    with _environment(env), _captured() as text:
        try:
            if cwd is not None:
                os.chdir(cwd)
            code = entry(list(args))
        except SystemExit as exc:  # what an uncaught exit would give a process
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:
            traceback.print_exc()  # as a process would print it: the test sees it in stderr
            code = 1
        finally:
            os.chdir(here)
    return CliResult(tuple(args), code, text[0], text[1])
